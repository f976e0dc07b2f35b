"""`python -m checks.supervise.guard MODULE ARGS...`: run `python -m MODULE ARGS...` so that it
dies with its parent.

torchrun starts each rank in a session of its own; if torchrun is killed (SIGKILL, or the kernel
killing it because the `python -m checks` above it died), nothing would stop its ranks. The
launcher therefore runs torchrun, and torchrun every rank, through this module: it sets
PR_SET_PDEATHSIG (SIGKILL) before importing anything heavy, exits at once when its parent is
already gone, and tells its own children which pid to expect as their parent.

With NODECERT_LOOPBACK_STORE=1 (single-node launches) torchrun's rendezvous store listens on the
loopback address only: TCPStore binds every interface whatever MASTER_ADDR says, so the guard
hands it a socket already bound to 127.0.0.1 (TCPStore's `master_listen_fd`).
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
from typing import Any

from checks.supervise.procs import ENV_PARENT, set_pdeathsig

ENV_LOOPBACK_STORE = "NODECERT_LOOPBACK_STORE"


def loopback_store() -> None:
    """Make the static rendezvous's TCPStore server listen on its (loopback) host only."""
    import ipaddress
    import socket

    from torch.distributed.elastic.rendezvous import static_tcp_rendezvous as static

    original = static.TCPStore
    keep: list[socket.socket] = []  # the listening sockets live as long as torchrun

    def store(host_name: str, port: int, world_size: int | None = None,
              is_master: bool = False, *args: Any, **kwargs: Any) -> Any:
        if is_master and kwargs.get("master_listen_fd") is None and \
                ipaddress.ip_address(host_name).is_loopback:
            sock = socket.socket(socket.AF_INET6 if ":" in host_name else socket.AF_INET)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host_name, port))
            sock.listen(512)
            keep.append(sock)
            # Only the libuv server takes a listening socket (the legacy one aborts on it).
            kwargs.update(master_listen_fd=sock.fileno(), use_libuv=True)
        return original(host_name, port, world_size, is_master, *args, **kwargs)

    static.TCPStore = store  # type: ignore[assignment,misc]


def main() -> None:
    if len(sys.argv) < 2:
        print("usage: python -m checks.supervise.guard MODULE [ARGS...]", file=sys.stderr)
        sys.exit(2)
    set_pdeathsig(signal.SIGKILL)
    expected = os.environ.get(ENV_PARENT, "")
    if expected.isdigit() and os.getppid() != int(expected):
        sys.exit(1)  # the parent died before the signal was armed: nobody wants this process
    os.environ[ENV_PARENT] = str(os.getpid())
    module = sys.argv[1]
    if module == "torch.distributed.run" and os.environ.pop(ENV_LOOPBACK_STORE, "") == "1":
        loopback_store()
    sys.argv = [module, *sys.argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
