"""The lab's own files on disk: its directories, the rendered configs, fake GPU devices and
the /etc/slurm links that let a plain ``sbatch`` find the lab."""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from .config import CLIENTS, NVIDIA_MAJOR, Node, Settings, gpu_device_paths, private_mounts, render_client_wrapper
from .report import log


def write_files(s: Settings, files: dict[str, str], layout: list[Node]) -> None:
    s.etc.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        # slurmdbd refuses a slurmdbd.conf that anyone but its SlurmUser (root here) can read.
        mode = 0o600 if name == "slurmdbd.conf" else 0o644
        fd = os.open(s.etc / name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(s.etc / name, mode)
    for node in layout:
        for i, dev in enumerate(gpu_device_paths(s, node)):
            dev.parent.mkdir(parents=True, exist_ok=True)
            if not dev.exists():
                try:
                    os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, i))
                except PermissionError:
                    dev.touch()  # still schedules; slurmd merely warns that it is no device


def link_etc_slurm(s: Settings) -> None:
    """Let plain `sbatch` (without SLURM_CONF) find the lab, but never replace a real config."""
    os.makedirs("/etc/slurm", exist_ok=True)
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        link, target = Path("/etc/slurm") / name, s.etc / name
        if os.path.islink(link) and os.readlink(link) == str(target):
            continue
        if os.path.lexists(link):
            log(f"note: {link} exists and is not ours; clients need SLURM_CONF={s.conf}")
            continue
        os.symlink(target, link)


def unlink_etc_slurm(s: Settings) -> None:
    for name in ("slurm.conf", "gres.conf", "cgroup.conf"):
        link = Path("/etc/slurm") / name
        if os.path.islink(link) and os.readlink(link) == str(s.etc / name):
            link.unlink()


def make_dirs(s: Settings, layout: list[Node]) -> None:
    for d in (s.lab_dir, s.etc, s.log_dir, s.pid_dir, s.lab_dir / "state" / "ctld", s.shared_dir):
        d.mkdir(parents=True, exist_ok=True)
    os.chmod(s.lab_dir, 0o755)
    s.munge_dir.mkdir(exist_ok=True)
    os.chmod(s.munge_dir, 0o755)  # munged refuses a socket dir that others cannot traverse
    for node in layout:
        (s.lab_dir / "state" / "spool" / node.name).mkdir(parents=True, exist_ok=True)
        for src, _ in private_mounts(s, node.name):
            src.mkdir(parents=True, exist_ok=True)
            os.chmod(src, 0o1777)  # like the real /tmp: world-writable, sticky


def write_client_wrappers(s: Settings) -> None:
    """bin/<client> for a 24.11 lab (the root's clients; see config.render_client_wrapper); for
    22.05 there is no bin/ (the host's own clients are the lab's)."""
    if not s.swaps_usr:
        if s.bin_dir.is_dir():   # a 24.11 lab's wrappers, left by it: no 22.05 shell may pick them up
            shutil.rmtree(s.bin_dir)
        return
    s.bin_dir.mkdir(parents=True, exist_ok=True)
    text = render_client_wrapper(s)
    for name in CLIENTS:
        path = s.bin_dir / name
        if not path.exists() or path.read_text() != text:
            tmp = path.with_name(f".{name}.tmp")
            tmp.write_text(text)
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)
