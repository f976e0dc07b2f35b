"""Host checks: OS, nouveau, Secure Boot, /dev/shm, memlock, CPUs and NUMA."""

from __future__ import annotations

from checks.model import Result, fail, passed, warn
from checks.node.context import Context
from checks.node.registry import Budget, Cost, check

GIB = 1 << 30
MIB = 1 << 20


def _size(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / MIB:.0f} MiB"


@check("os-supported", code="HOST001", title="OS release and kernel are supported", stage="host",
       budget=Budget(value=7, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def os_supported(ctx: Context) -> Result:
    """The OS is one the playbooks provision and CI tests (profile host.supported_os)."""
    release = ctx.hw.os_release()
    os_id, version = release.get("ID", "unknown"), release.get("VERSION_ID", "")
    pretty = release.get("PRETTY_NAME", f"{os_id} {version}")
    supported = ctx.profile.get("host.supported_os") or {}
    wanted = ", ".join(f"{k} {'/'.join(v)}" for k, v in supported.items())
    value = f"{pretty}, kernel {ctx.hw.kernel_release()}"
    if version in supported.get(os_id, []):
        return passed(value, value=pretty, expected=wanted)
    return warn(f"{value} is not a supported release", value=pretty, expected=wanted,
                remedy="reinstall with a supported release; other releases may work but are "
                       "not provisioned or tested by this tool")


@check("nouveau-not-loaded", code="HOST002", title="nouveau is not loaded", stage="host",
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def nouveau_not_loaded(ctx: Context) -> Result:
    """With NVIDIA GPUs present the open-source nouveau driver must not hold them."""
    modules = ctx.hw.loaded_modules()
    if not ctx.pci_gpus:
        if "nouveau" in modules:
            return passed("nouveau loaded, but no NVIDIA GPU on the PCI bus", value=True)
        return passed("nouveau not loaded", value=False)
    if "nouveau" in modules:
        return fail("nouveau kernel module is loaded: the NVIDIA driver cannot bind the GPUs",
                    value=True, expected="not loaded",
                    remedy="blacklist nouveau (/etc/modprobe.d/blacklist-nouveau.conf: "
                           "'blacklist nouveau' and 'options nouveau modeset=0'), run "
                           "update-initramfs -u and reboot; `make provision` does this")
    return passed("nouveau not loaded", value=False, expected="not loaded")


@check("secure-boot", code="HOST003", title="Secure Boot state vs module signatures",
       stage="host",
       budget=Budget(value=5, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def secure_boot(ctx: Context) -> Result:
    """Secure Boot on with an unsigned nvidia module means the module will not load."""
    state = ctx.hw.secure_boot()
    if state is None:
        return passed("Secure Boot state not exposed (legacy BIOS boot or no efivars)",
                      value="unknown")
    if not state:
        return passed("Secure Boot disabled", value="disabled")
    if not ctx.pci_gpus:
        return passed("Secure Boot enabled (no NVIDIA GPU)", value="enabled")
    signer = ctx.hw.module_signer("nvidia")
    if signer:
        return passed(f"Secure Boot enabled; nvidia module signed by {signer}", value="enabled")
    return warn("Secure Boot enabled and the nvidia module is not signed (or not installed): "
                "it will be refused at load time", value="enabled", expected="signed module",
                remedy="install Canonical's signed linux-modules-nvidia-<branch>-server package "
                       "for this kernel, or enrol a MOK key that signs the DKMS module "
                       "(mokutil --import) and reboot to confirm it")


@check("shm-size", code="HOST004", title="/dev/shm is large enough for DataLoader workers",
       stage="host",
       budget=Budget(value=8, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def shm_size(ctx: Context) -> Result:
    """DataLoader workers pass batches through /dev/shm; 64 MB (container default) dies with
    'bus error'. Threshold: profile host.shm_min_bytes."""
    shm = ctx.hw.shm()
    minimum = int(ctx.profile.require("host.shm_min_bytes"))
    value = round(shm.total_bytes / GIB, 2)
    if shm.total_bytes < minimum:
        return fail(f"/dev/shm is {_size(shm.total_bytes)}: DataLoader workers will die with "
                    f"'bus error'", value=value, unit="GiB", expected=f">= {_size(minimum)}",
                    remedy="in a container: docker run --shm-size=16g (or --ipc=host); on a "
                           "host: mount -o remount,size=50% /dev/shm and set it in /etc/fstab")
    return passed(f"/dev/shm {_size(shm.total_bytes)} ({_size(shm.free_bytes)} free)",
                  value=value, unit="GiB", expected=f">= {_size(minimum)}")


@check("memlock-limit", code="HOST005", title="locked-memory limit (pinned memory, RDMA)",
       stage="host",
       budget=Budget(value=5, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def memlock_limit(ctx: Context) -> Result:
    """Pinned host memory and GPUDirect RDMA need a large RLIMIT_MEMLOCK (unlimited is usual)."""
    limit = ctx.hw.memlock_limit()
    minimum = int(ctx.profile.require("host.memlock_min_bytes"))
    if limit == -1:
        return passed("memlock unlimited", value="unlimited", expected="unlimited")
    if limit < minimum:
        return warn(f"memlock limit is {_size(limit)}: pinned memory and NCCL over RDMA may fail",
                    value=limit, unit="bytes", expected=f"unlimited (>= {_size(minimum)})",
                    remedy="set '* - memlock unlimited' in /etc/security/limits.d/ and "
                           "LimitMEMLOCK=infinity for services; containers: --ulimit memlock=-1")
    return passed(f"memlock limit {_size(limit)}", value=limit, unit="bytes",
                  expected=f">= {_size(minimum)}")


@check("cpu-numa", code="HOST006", title="CPUs and NUMA layout per GPU", stage="host",
       budget=Budget(value=4, cost=Cost(cpu=1, gpu=1), source="measured cpu"))
def cpu_numa(ctx: Context) -> Result:
    """Reports CPUs and NUMA nodes; WARN when there are fewer CPUs per GPU than the profile's
    host.cpus_per_gpu_min (DataLoader workers starve the GPUs)."""
    cpus, nodes = ctx.hw.cpu_count(), ctx.hw.numa_nodes()
    layout = ", ".join(f"node{n}: {c} CPUs" for n, c in sorted(nodes.items()))
    details = {"numa_nodes": {str(k): v for k, v in nodes.items()}}
    if not ctx.pci_gpus:
        return passed(f"{cpus} CPUs ({layout}); no GPU", value=cpus, unit="CPUs", details=details)
    # Against the GPUs this process may use: a container or a Slurm job given 2 of 8 GPUs is
    # given CPUs for those 2 (its CPU count is its affinity mask).
    gpus = ctx.usable_gpu_count()
    if not gpus:
        return passed(f"{cpus} CPUs ({layout}); no GPU usable here (see gpu-count)", value=cpus,
                      unit="CPUs", details=details)
    minimum = int(ctx.profile.require("host.cpus_per_gpu_min"))
    per_gpu = cpus / gpus
    if per_gpu < minimum:
        return warn(f"{cpus} CPUs for {gpus} GPUs ({per_gpu:.1f} per GPU; {layout})",
                    value=cpus, unit="CPUs", expected=f">= {minimum} per GPU", details=details,
                    remedy="fewer DataLoader workers per GPU, or a CPU allocation that matches "
                           "the GPUs (check the container/cgroup CPU limit)")
    return passed(f"{cpus} CPUs for {gpus} GPUs ({per_gpu:.0f} per GPU; {layout})", value=cpus,
                  unit="CPUs", expected=f">= {minimum} per GPU", details=details)
