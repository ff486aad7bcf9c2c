"""The lab's network: a bridge, one network namespace and veth pair per node, and the
/etc/hosts block (rendered by config.py) written in place."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

from .config import Node, Settings
from .procs import _run


def rewrite_hosts(transform: Callable[[str], str], path: str = "/etc/hosts") -> None:
    """Rewrite /etc/hosts *in place* (same inode): it may be a bind mount that cannot be
    replaced by rename, and nodes in other mount namespaces must see the same file."""
    with open(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+") as f:
        old = f.read()
        new = transform(old)
        if new != old:
            f.seek(0)
            f.write(new)
            f.truncate()


def net_up(s: Settings, layout: list[Node]) -> None:
    def ip(*args: str) -> None:
        _run(["ip", *args])

    if not Path(f"/sys/class/net/{s.bridge}").exists():
        ip("link", "add", s.bridge, "type", "bridge")
    ip("addr", "replace", f"{s.ctl_ip}/24", "dev", s.bridge)
    ip("link", "set", s.bridge, "up")
    for k, node in enumerate(layout, start=1):
        ns, veth = s.netns(node.name), s.veth(k)
        if not Path(f"/run/netns/{ns}").exists():
            ip("netns", "add", ns)
        if not Path(f"/sys/class/net/{veth}").exists():
            ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        ip("link", "set", veth, "master", s.bridge, "up")
        ip("-n", ns, "addr", "replace", f"{node.ip}/24", "dev", "eth0")
        ip("-n", ns, "link", "set", "lo", "up")
        ip("-n", ns, "link", "set", "eth0", "up")
        # Deliberately no default route: a node can reach its peers and the host, nothing else.


def net_intact(s: Settings, layout: list[Node]) -> bool:
    return Path(f"/sys/class/net/{s.bridge}").exists() and all(
        Path(f"/run/netns/{s.netns(n.name)}").exists() for n in layout
    )


def netns_pids(ns: str) -> list[int]:
    if not Path(f"/run/netns/{ns}").exists():
        return []
    cp = _run(["ip", "netns", "pids", ns], check=False)
    return [int(p) for p in cp.stdout.split() if p.isdigit()]


def net_down(s: Settings, layout: list[Node]) -> None:
    # Only the namespaces named in our own state file: other netns on the machine are not ours.
    for node in layout:
        ns = s.netns(node.name)
        if Path(f"/run/netns/{ns}").exists():
            _run(["ip", "netns", "del", ns], check=False)  # also destroys the veth pair
    if Path(f"/sys/class/net/{s.bridge}").exists():
        _run(["ip", "link", "del", s.bridge], check=False)
