"""Helpers that let the e2e tests run the provisioning playbooks for real on this machine.

rootfs:    debootstrap root filesystems, cached as tarballs, unpacked one copy per test host.
aptrepo:   a signed stand-in of NVIDIA's CUDA apt repository, served on 127.0.0.1.
wheelhouse: torch and this project's wheels for `pip install --no-index --find-links`.
runner:    inventories for the chroot connection and `ansible-playbook` under `env -i`.
"""
