"""What the installed torch reports about CUDA. The only place checks learn torch's view."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from checks.hw.base import TorchInfo


def read_torch_build() -> tuple[str | None, str | None]:
    """(torch.__version__, torch.version.cuda) from the installed torch/version.py, parsed, not
    imported: importing torch costs seconds of CPU, which a health check cannot spend on a line
    of its report. (None, None) when torch is not installed or the file says something else."""
    try:
        spec = importlib.util.find_spec("torch")  # a top-level package: found, not imported
        where = list(spec.submodule_search_locations or []) if spec else []
        tree = ast.parse(Path(where[0], "version.py").read_text()) if where else None
    except (ImportError, ValueError, OSError, SyntaxError):
        return None, None
    found: dict[str, str | None] = {}
    for node in tree.body if tree else []:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 \
            else node.target if isinstance(node, ast.AnnAssign) else None
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and \
                (value.value is None or isinstance(value.value, str)):
            found[target.id] = value.value
    return found.get("__version__"), found.get("cuda")


def read_torch() -> TorchInfo:
    try:
        import torch
    except Exception as exc:  # a broken install raises more than ImportError
        return TorchInfo(error=f"cannot import torch: {exc}")
    info = TorchInfo(version=torch.__version__, cuda=torch.version.cuda)
    try:
        info.cuda_available = bool(torch.cuda.is_available())
        info.device_count = torch.cuda.device_count() if info.cuda_available else 0
        if info.cuda is not None:
            info.arch_list = list(torch.cuda.get_arch_list())
        for i in range(info.device_count):
            info.capabilities.append(tuple(torch.cuda.get_device_capability(i)))  # type: ignore[arg-type]
            info.device_names.append(torch.cuda.get_device_name(i))
        if info.cuda is not None and torch.distributed.is_available():
            nccl = getattr(torch.cuda, "nccl", None)
            if nccl is not None:
                version = nccl.version()
                info.nccl = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        if torch.backends.cudnn.is_available():
            info.cudnn = torch.backends.cudnn.version()
    except Exception as exc:  # CUDA init failures surface here (e.g. error 802, driver too old)
        info.error = f"torch.cuda failed: {exc}"
    return info
