"""Ray token authentication for a session: the token and the environment that carries it.

Why token auth is on by default: without it, anyone who can reach a node's
GCS or raylet port (every other job on a shared cluster network) can attach a
driver and run arbitrary code as the session's user. Ray 2.60 refuses such a
client when the cluster runs with ``RAY_AUTH_MODE=token`` and the client
lacks the token.

The token is derived from the session secret (HMAC-SHA256, 64 hex
characters like Ray's own ``ray get-auth-token --generate``), so any process
that may read the secret can recompute it and nothing new needs to be kept
safe. It reaches Ray through ``RAY_AUTH_TOKEN_PATH``: a file ``ray_token``
(0600) in the session directory (0700; its name is
``protocol.disk.paths.ray_token_file``), written by ``SessionDir``. A path in
the environment is no secret; the token itself never appears in an argv nor
in any process's environment, and ``srun`` or ``sbatch`` never carry it.

Every process we start gets ``RAY_AUTH_MODE`` explicitly, in both modes:
with the variable unset, a head whose ``$HOME`` holds ``~/.ray/auth_token``
turns token auth on by itself while workers do not (measured with Ray
2.60), and ``ray start --head`` in token mode without any token writes a new
``~/.ray/auth_token`` into the user's shared home. ``RAY_AUTH_TOKEN``
inherited from the caller is removed, because Ray reads it before the file:
a stale user token would otherwise shadow the session's.

This module belongs to no room: the agent (Ray nodes, GCS probes) and the
coordinator (payload drivers) both build the environment from it.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Mapping, MutableMapping

_TOKEN_CONTEXT = b"elastic-ray/ray-auth-token/v1"

#: Inherited variables removed from every Ray process's environment (Ray reads
#: ``RAY_AUTH_TOKEN`` before ``RAY_AUTH_TOKEN_PATH``).
SCRUBBED_ENV = ("RAY_AUTH_TOKEN",)

DISABLED_WARNING = ("Ray token authentication is disabled (auth_mode='disabled'): anyone who can reach this "
                    "run's Ray ports (GCS, raylet, dashboard agent) can attach a driver and run code as you. "
                    "Use auth_mode='token' (the default) on a shared cluster.")
REDIS_PASSWORD_WARNING = ("redis_password is ignored: Ray passes it to its GCS and workers on their command "
                          "lines, where every user of the node can read it, and it only guards an external "
                          "Redis, which elastic-ray does not set up. Ray token authentication (auth_mode='token', "
                          "the default) protects the cluster instead.")


def launcher_warnings(auth_mode: str, redis_password: str | None) -> list[tuple[str, str]]:
    """``(event, text)`` of each warning a launcher's auth settings deserve,
    logged at session creation and by every agent."""
    warnings = []
    if auth_mode == "disabled":
        warnings.append(("ray_auth_disabled", DISABLED_WARNING))
    if redis_password is not None:
        warnings.append(("redis_password_ignored", REDIS_PASSWORD_WARNING))
    return warnings


def derive_ray_token(secret: bytes) -> str:
    """The session's Ray token: HMAC-SHA256 of a fixed label under the session secret, in hex.

    The label is never a valid control-channel envelope (those are msgpack
    maps), so the token is not the tag of any control message: knowing it
    (every Ray worker process of the run can read the file) neither reveals
    the secret nor lets anyone forge control messages.
    """
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError("secret: must be at least 16 bytes")
    return hmac.new(secret, _TOKEN_CONTEXT, hashlib.sha256).hexdigest()


def ray_auth_env(auth_mode: str, token_path: str | os.PathLike[str] | None) -> dict[str, str]:
    """The variables every Ray process of the session gets.

    ``token``: ``RAY_AUTH_MODE=token`` and ``RAY_AUTH_TOKEN_PATH`` (an
    absolute path; required, because a head in token mode without a token
    writes one to ``~/.ray/auth_token``). ``disabled``: ``RAY_AUTH_MODE=disabled``.
    """
    if auth_mode == "disabled":
        return {"RAY_AUTH_MODE": "disabled"}
    if auth_mode != "token":
        raise ValueError(f"auth_mode={auth_mode!r}: must be 'token' or 'disabled'")
    if token_path is None or not os.path.isabs(os.fspath(token_path)):
        raise ValueError(f"token_path={token_path!r}: token auth needs the absolute path of the token file")
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": os.fspath(token_path)}


def apply_auth_env(env: MutableMapping[str, str], auth: Mapping[str, str]) -> MutableMapping[str, str]:
    """Put ``auth`` (from :func:`ray_auth_env`) into ``env`` in place, after removing
    :data:`SCRUBBED_ENV`; returns ``env``."""
    for key in SCRUBBED_ENV:
        env.pop(key, None)
    env.update(auth)
    return env
