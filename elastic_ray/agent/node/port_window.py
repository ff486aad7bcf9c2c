"""Where the ``random`` port strategy draws its ports from (pure; ``ray_node.free_port`` binds them)."""

from __future__ import annotations

#: The lowest port the ``random`` strategy draws from (see :func:`random_port_window`).
RANDOM_PORT_LOW = 10000


def random_port_window(ephemeral: tuple[int, int]) -> tuple[int, int] | None:
    """Pure: the ports ``free_port()`` draws from, given the host's ephemeral range (inclusive).

    Below the ephemeral range (``ip_local_port_range``, 32768-60999 by default): the kernel hands
    those out to every ``bind(0)`` and outgoing connection, and Ray's own processes bind port 0 by
    the dozen while a node starts, so a port picked there and released could be handed to one of
    them in the seconds before Ray binds it (a hosted head's ``ray_client_server`` died so on Ray
    2.55). None when the host leaves fewer than 1,000 ports below its ephemeral range: then
    ``free_port()`` falls back to asking the kernel (``bind(0)``).
    """
    low, high = ephemeral
    if not 1 <= low <= high <= 65535:
        return None
    top = low - 1
    if top - RANDOM_PORT_LOW + 1 < 1000:
        return None
    return RANDOM_PORT_LOW, top
