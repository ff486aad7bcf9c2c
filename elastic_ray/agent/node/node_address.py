"""The address this node's Ray binds to and other nodes reach it on.

A cluster node often has several networks (Ethernet for logins, InfiniBand
for compute); the host name may resolve to the wrong one, so the run's
launcher can name the interface (``network_interface``) or a shell command
that prints the address (``node_ip_address_command``). Each agent resolves
its own node's address, once, before anything else starts.

Order: an explicit ``--node-ip``; else the launcher's setting; else
``ELASTIC_RAY_NODE_IP`` (the local scheduler sets it per emulated node);
else the first non-loopback IPv4 address of the host name. Ray rewrites
127.0.0.1 to another interface behind our back, so that address is refused
whichever way it came (see ``ray_args.check_ip``).

Every failure is a :class:`NodeAddressError` whose message is one line
naming the node and the interface or command, so the Slurm job's output
says at once what to fix.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence

import psutil

from ... import knobs
from ...errors import NodeAddressError
from .ray_args import check_ip

COMMAND_TIMEOUT = 30.0
_STDERR_CHARS = 300   # of a failed command's stderr, in the one-line error

__all__ = ["NodeAddressError", "interface_address", "command_address", "hostname_address",
           "resolve_node_address", "COMMAND_TIMEOUT"]


def _one_line(text: str, limit: int = _STDERR_CHARS) -> str:
    flat = " | ".join(line.strip() for line in text.strip().splitlines() if line.strip())
    return flat if len(flat) <= limit else "..." + flat[-limit:]


def _usable(address: str, node: str, source: str) -> str:
    try:
        return check_ip(address)
    except ValueError as exc:
        raise NodeAddressError(f"node {node}: {source} gives {address}, which Ray cannot bind to ({exc})") from None


def interface_address(name: str, node: str,
                      interfaces: Callable[[], Mapping[str, Sequence[object]]] = psutil.net_if_addrs) -> str:
    """The first IPv4 address of interface ``name`` on this node.

    ``interfaces`` is psutil's table (name -> addresses with ``family`` and
    ``address``); a test may hand in its own."""
    table = interfaces()
    if name not in table:
        available = ", ".join(sorted(table)) or "none"
        raise NodeAddressError(f"node {node}: network_interface {name!r} does not exist here "
                               f"(available: {available})")
    ipv4 = [getattr(a, "address") for a in table[name] if getattr(a, "family", None) == socket.AF_INET]
    if not ipv4:
        with_ipv4 = sorted(n for n, addrs in table.items()
                           if any(getattr(a, "family", None) == socket.AF_INET for a in addrs))
        raise NodeAddressError(f"node {node}: network_interface {name!r} has no IPv4 address "
                               f"(interfaces with one: {', '.join(with_ipv4) or 'none'})")
    return _usable(ipv4[0], node, f"network_interface {name!r}")


def command_address(command: str, node: str, *, env: Mapping[str, str] | None = None,
                    timeout: float = COMMAND_TIMEOUT) -> str:
    """The first line ``command`` prints, run with ``bash -c`` in the agent's
    environment (Slurm's variables and the launcher's included); it must be
    an IP address."""
    where = f"node {node}: node_ip_address_command {command!r}"
    try:
        proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL, env=None if env is None else dict(env))
    except subprocess.TimeoutExpired:
        raise NodeAddressError(f"{where} did not finish within {timeout:g}s") from None
    except OSError as exc:
        raise NodeAddressError(f"{where} could not run: {exc}") from None
    if proc.returncode != 0:
        stderr = _one_line(proc.stderr) or "(no stderr)"
        raise NodeAddressError(f"{where} exited with status {proc.returncode}: {stderr}")
    lines = proc.stdout.strip().splitlines()
    first = lines[0].strip() if lines else ""
    if not first:
        raise NodeAddressError(f"{where} printed nothing (stderr: {_one_line(proc.stderr) or 'none'})")
    try:
        ipaddress.ip_address(first)
    except ValueError:
        raise NodeAddressError(f"{where} printed {first[:100]!r} as its first line, not an IP address") from None
    return _usable(first, node, f"node_ip_address_command {command!r}")


def hostname_address(hostname: str) -> str:
    """The first non-loopback IPv4 address ``hostname`` resolves to."""
    try:
        infos = socket.getaddrinfo(hostname, None, socket.AF_INET)
    except socket.gaierror as exc:
        raise NodeAddressError(f"node {hostname}: cannot resolve the host name ({exc}); "
                               "set network_interface or node_ip_address_command, or pass --node-ip") from None
    addresses = [info[4][0] for info in infos]
    for address in addresses:
        if not address.startswith("127."):
            return address
    raise NodeAddressError(f"node {hostname}: the host name resolves only to loopback {addresses}; "
                           "set network_interface or node_ip_address_command, or pass --node-ip")


def resolve_node_address(node: str, *, network_interface: str | None = None,
                         node_ip_address_command: str | None = None,
                         environ: Mapping[str, str] | None = None) -> str:
    """This node's address by the order in the module docstring (after ``--node-ip``)."""
    environ = os.environ if environ is None else environ
    if network_interface is not None:
        return interface_address(network_interface, node)
    if node_ip_address_command is not None:
        return command_address(node_ip_address_command, node, env=environ)
    configured = knobs.NODE_IP.read(environ)
    if configured:
        return configured
    return hostname_address(node)
