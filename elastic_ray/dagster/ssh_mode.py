"""The Dagster resources over SSH: a run's session on a cluster reached only by SSH.

``SlurmResource(ssh=SSHConnectionResource(...), remote_base=...)`` switches
a ``ComputeResource`` or ``SlurmSessionResource`` to the SSH mode: the run's
session lives on the cluster under ``remote_base/sessions/<run key>``, every
session call is a :class:`~elastic_ray.remote.RemoteSession` call, and a
payload goes up as a file next to the session and runs with the cluster
side's interpreter (``remote_python``, by default
``remote_base/venv/bin/python``). Dagster Pipes works as on the cluster: the
context goes in through the environment, and the payload's messages file
on the cluster is followed by the call and copied line by line into a local
file that Dagster's file reader reads. What the run held (node- and
GPU-hours, head moves, the timeline) is computed on the cluster side too,
from the session's own event log (:mod:`.usage_meta`).
"""

from __future__ import annotations

import hashlib
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePosixPath
from typing import Any, Optional

import dagster
import pydantic
from dagster import PipesEnvContextInjector, PipesFileMessageReader, open_pipes_session
from dagster_pipes import DAGSTER_PIPES_MESSAGES_ENV_VAR, encode_param
from pydantic import Field

from .. import defaults
from ..config.launcher import RayLauncher
from ..config.queue import RunLayout, SlurmQueue
from ..protocol.disk import paths
from ..remote import RemoteSession, SshConnection, SshTarget
from .run_session import RunSession, job_name_for
from .usage_meta import remote_usage_metadata


class SSHConnectionResource(dagster.ConfigurableResource):
    """How to reach the cluster's login host; unset fields are left to ssh and ``~/.ssh/config``."""

    host: str = Field(description="Login host (a name from ~/.ssh/config works, ProxyJump included).")
    port: Optional[int] = Field(default=None, description="SSH port (default: ssh's, usually 22).")
    user: Optional[str] = Field(default=None, description="Remote user (default: ssh's).")
    key_path: Optional[str] = Field(default=None, description="Private key file (default: ssh's agent/identities).")
    options: list[str] = Field(default_factory=list, description="Extra ssh -o NAME=VALUE settings.")
    config_file: Optional[str] = Field(default=None, description="ssh -F file (default: ~/.ssh/config).")
    connect_timeout: float = Field(default=15.0, gt=0, description="Seconds to connect.")

    @pydantic.model_validator(mode="after")
    def _check(self) -> "SSHConnectionResource":
        self.target()  # ValueError naming ssh.host, ssh.port, ssh.key_path...
        return self

    def target(self) -> SshTarget:
        return SshTarget(host=self.host, user=self.user, port=self.port, key_path=self.key_path,
                         options=tuple(self.options), config_file=self.config_file,
                         connect_timeout=self.connect_timeout)


def remote_python_of(remote_base: str, remote_python: str | None) -> str:
    """Pure: the cluster side's interpreter (the documented install puts a venv in remote_base)."""
    return remote_python or str(PurePosixPath(remote_base) / "venv" / "bin" / "python")


def open_or_create_remote(ssh: SSHConnectionResource, remote_base: str, remote_python: str | None, key: str, *,
                          layout: RunLayout, scheduler: str, launcher: RayLauncher, queue: SlurmQueue,
                          heal_timeout: float = defaults.WAIT_TIMEOUT) -> RunSession:
    """The run's session on the cluster, created by the first step of any process
    (the lock is on the cluster side); a lost head is replaced on open, as locally."""
    path = str(PurePosixPath(remote_base) / "sessions" / key)
    session, created = RemoteSession.open_or_create(
        path, ssh=SshConnection(ssh.target()), head=layout.head,
        remote_python=remote_python_of(remote_base, remote_python), scheduler=scheduler, launcher=launcher,
        ray_head_only=layout.ray_head_only, worker_allocation=layout.worker_allocation, job_name=job_name_for(key))
    run_session = RunSession(session, queue, created)  # type: ignore[arg-type] - same methods as Session
    if not created and run_session.head_is_lost():
        run_session.replace_head(timeout=heal_timeout)
        run_session.healed = True
    return run_session


def run_remote_pipes_payload(context: Any, run_session: RunSession, script: Path, *, label: str,
                             args: Sequence[str], env: dict[str, str], python: str | None,
                             extras: Mapping[str, Any] | None, head_timeout: float,
                             timeout: float | None) -> dagster.PipesClientCompletedInvocation:
    """Upload ``script`` next to the session, run it on the head, relay its Pipes messages."""
    remote: RemoteSession = run_session.session  # type: ignore[assignment]
    data = script.read_bytes()
    session = PurePosixPath(remote.path)     # the session directory, on the cluster side
    uploaded = str(paths.payload_file(session, hashlib.sha256(data).hexdigest()[:16], script.name))
    remote.put_file(uploaded, data)
    head = run_session.ready_head(timeout=head_timeout)
    messages = str(paths.pipes_file(session, label, uuid.uuid4().hex[:8]))
    with tempfile.TemporaryDirectory(prefix="er-pipes-") as tmp:
        local = Path(tmp) / "messages.jsonl"
        local.touch()
        with open_pipes_session(context=context, context_injector=PipesEnvContextInjector(),
                                message_reader=PipesFileMessageReader(str(local)),
                                extras=dict(extras or {})) as pipes, open(local, "a") as sink:
            env.update(pipes.get_bootstrap_env_vars())
            # The payload writes on the cluster; the call copies each line here.
            env[DAGSTER_PIPES_MESSAGES_ENV_VAR] = encode_param({"path": messages})

            def relay(line: str) -> None:
                sink.write(line + "\n")
                sink.flush()

            driver = remote.run([python or remote.remote_python, uploaded, *args], env=env, head=head,
                                pipes_path=messages, on_pipes=relay)
            result = driver.wait(timeout=timeout)
    return dagster.PipesClientCompletedInvocation(pipes, metadata={
        "elastic_ray/head_job": head.job_id, "elastic_ray/session": remote.path, "elastic_ray/ssh_host":
            remote.conn.target.host, "elastic_ray/driver_seconds": round(result.seconds, 3),
        **remote_usage_metadata(remote)})
