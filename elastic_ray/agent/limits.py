"""The agent's process limits."""

from __future__ import annotations

import logging
import resource

log = logging.getLogger("elastic_ray.agent")


def raise_nofile_limit() -> int:
    """Raise this process's soft descriptor limit to its hard limit; return it.

    Every TCP connection to the control port holds a descriptor until the
    CURVE handshake times out; a soft limit of 1024 (a common default) would
    let a few hundred idle connections starve the agent's own sockets and
    files. The hard limit is what the site allows, so this asks for nothing
    more; Ray, started from here, inherits it (and raises its own anyway).
    """
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        target = hard if hard != resource.RLIM_INFINITY else 1 << 20
        if soft != resource.RLIM_INFINITY and soft < target:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    except (ValueError, OSError) as exc:
        log.warning("event=nofile_limit_unchanged error=%s", exc)
        return -1
