"""Connection authentication for the control channel: ZeroMQ CURVE keys
derived from the session secret.

Why CURVE on top of the per-message HMAC (``frames``): libzmq buffers a
whole multipart message before the application sees any of it, and nothing
in libzmq caps the number of parts. A peer without the secret could
therefore make an agent hold a huge message (measured before this module:
2000 parts of 60 kB, +115 MB) for as long as it kept the message open, and
keep as many idle connections as it liked. With CURVE the server refuses a
peer during the handshake, before a single message part is accepted: a
stranger's bytes only ever reach the greeting check and one failed
``crypto_box_open`` of its HELLO, and a peer that does not finish the
handshake is disconnected after ``HANDSHAKE_IVL_MS``.

Keys. Every party of a session holds the same secret, so one server keypair
and one client keypair per session are enough, and both are derived from
the secret (HMAC-SHA256 with a distinct label each, used as the curve25519
secret key). Nothing is stored or published: each process derives the keys
from the ``secret`` file it already reads. A client must know the server's
public key to build a HELLO the server can open, and the server's public key
is never written anywhere, so knowing it means knowing the secret.

No ZAP handler. libzmq without a ZAP handler accepts any client key once the
handshake succeeds. A handler that accepts only the session's client key
would add nothing a peer without the secret could be stopped by (it cannot
pass the HELLO), it would cost a thread per process and one ZAP round trip
per connection, and it is bound per ZeroMQ context, which the agent shares
between sockets of one session only while tests and coordinators share one
context between many sessions. The per-message HMAC stays as the second
check (defence in depth): it also binds a frame to its session id,
destination and nonce, which CURVE does not.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from dataclasses import dataclass

import zmq
from zmq.utils import z85

# Defined in errors (its docstring says why); ``X as X`` keeps it importable from here, for type checkers too.
from ...errors import CurveUnavailable as CurveUnavailable

HANDSHAKE_IVL_MS = 10_000
"""A peer must finish the CURVE handshake within this time or is disconnected:
bounds how long an idle or trickling connection holds a descriptor."""

_SERVER_LABEL = b"elastic-ray control channel v1: curve server key"
_CLIENT_LABEL = b"elastic-ray control channel v1: curve client key"


@dataclass(frozen=True)
class CurveKeys:
    """One session's keypairs, z85-encoded (40 bytes each), as libzmq takes them."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes

    def __repr__(self) -> str:  # never print secret keys in a log or a traceback
        return f"CurveKeys(server_public={self.server_public!r}, client_public={self.client_public!r}, ...)"


def require_curve() -> None:
    if not zmq.has("curve"):
        raise CurveUnavailable(f"libzmq {zmq.zmq_version()} (pyzmq {zmq.__version__}) has no CURVE support; "
                               "install a pyzmq wheel built with libsodium")


def _keypair(secret: bytes, label: bytes) -> tuple[bytes, bytes]:
    seed = hmac.new(secret, label, hashlib.sha256).digest()   # 32 bytes: a curve25519 secret key
    secret_z85 = z85.encode(seed)
    return zmq.curve_public(secret_z85), secret_z85


@functools.lru_cache(maxsize=64)
def derive_keys(secret: bytes) -> CurveKeys:
    """The session's CURVE keys: the same for the same secret, unrelated for another one."""
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError("secret must be at least 16 bytes")
    require_curve()
    server_public, server_secret = _keypair(secret, _SERVER_LABEL)
    client_public, client_secret = _keypair(secret, _CLIENT_LABEL)
    return CurveKeys(server_public, server_secret, client_public, client_secret)


def make_server(sock: zmq.Socket, secret: bytes) -> None:
    """Make ``sock`` a CURVE server of the session. Call before bind()."""
    keys = derive_keys(secret)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.server_secret)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)


def make_client(sock: zmq.Socket, secret: bytes) -> None:
    """Make ``sock`` a CURVE client of the session's servers. Call before connect()."""
    keys = derive_keys(secret)
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.client_public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.client_secret)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_IVL_MS)
