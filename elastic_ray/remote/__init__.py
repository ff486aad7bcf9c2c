"""Sessions driven from outside the cluster, over SSH only (see docs/ssh.md).

The client (:class:`RemoteSession`) runs anywhere with an OpenSSH client;
each call is one remote command on a host of the cluster
(:mod:`.server`), and a detached cluster-side process
(:mod:`elastic_ray.coordinator.detached`) keeps watching the head when the
client goes away.
"""

from .client import RemoteRun, RemoteSession
from .ssh import SshConnection, SshError, SshTarget
from .wire import ProtocolError, RemoteError, RemoteSetupError, RemoteVersionMismatch

__all__ = ["ProtocolError", "RemoteError", "RemoteRun", "RemoteSession", "RemoteSetupError",
           "RemoteVersionMismatch", "SshConnection", "SshError", "SshTarget"]
