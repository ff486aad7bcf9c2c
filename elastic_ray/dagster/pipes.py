"""Launch a payload driver next to the run's head and talk to it over Dagster Pipes.

The driver is started through the coordinator (``Session.run``): on Slurm as
a step of the head allocation, locally as a process. Dagster Pipes needs two
channels. The context goes in through environment variables (``srun``
passes the environment on, so nothing else must reach the node). Messages
come back through a file in the session directory, because that is the one
place both the Dagster process and every node of the run can see.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from dagster import (
    PipesClientCompletedInvocation,
    PipesEnvContextInjector,
    PipesFileMessageReader,
    open_pipes_session,
)

from .. import defaults
from ..coordinator.session import Session
from ..protocol.disk import paths
from .run_session import RunSession
from .usage_meta import usage_metadata


def _step_label(context: Any) -> str:
    try:
        label = context.op_execution_context.step_key if hasattr(context, "op_execution_context") \
            else context.step_key
    except Exception:  # noqa: BLE001 - a label only
        label = "step"
    return "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in str(label))[:80]


def run_pipes_payload(
    context: Any,
    run_session: RunSession,
    payload_path: str | Path,
    *,
    args: Sequence[str] = (),
    extra_env: Mapping[str, str] | None = None,
    python: str | None = None,
    extras: Mapping[str, Any] | None = None,
    head_timeout: float = defaults.WAIT_TIMEOUT,
    timeout: float | None = None,
) -> PipesClientCompletedInvocation:
    """Run ``python payload_path *args`` on the current head; return its Pipes results.

    Raises ``SlurmAllocationEnded`` if the head is gone before or during the
    run (call ``replace_head()`` and launch again), ``SlurmStepDrained`` if
    the head drains while it runs, and ``PayloadFailed`` for a non-zero exit
    on a healthy head.
    """
    script = Path(payload_path).expanduser()
    if not script.is_absolute():
        script = script.absolute()
    if not script.is_file():
        raise FileNotFoundError(f"payload_path: {script} is not a file")
    env = dict(extra_env or {})
    bad = [k for k, v in env.items() if not isinstance(k, str) or not isinstance(v, str)]
    if bad:
        raise ValueError(f"extra_env[{bad[0]!r}]: names and values must be strings")

    if not isinstance(run_session.session, Session):   # SSH mode: the session is on the cluster
        from .ssh_mode import run_remote_pipes_payload

        return run_remote_pipes_payload(context, run_session, script, label=_step_label(context), args=args,
                                        env=env, python=python, extras=extras, head_timeout=head_timeout,
                                        timeout=timeout)
    head = run_session.ready_head(timeout=head_timeout)
    messages = paths.pipes_file(run_session.path, _step_label(context), uuid.uuid4().hex[:8])
    messages.parent.mkdir(parents=True, exist_ok=True)
    argv = [python or sys.executable, str(script), *args]
    with open_pipes_session(context=context, context_injector=PipesEnvContextInjector(),
                            message_reader=PipesFileMessageReader(str(messages)),
                            extras=dict(extras or {})) as pipes:
        env.update(pipes.get_bootstrap_env_vars())
        driver = run_session.session.run(argv, env=env, head=head)
        result = driver.wait(timeout=timeout)
    return PipesClientCompletedInvocation(pipes, metadata={
        "elastic_ray/head_job": head.job_id, "elastic_ray/session": str(run_session.path),
        "elastic_ray/driver_seconds": round(result.seconds, 3), **usage_metadata(run_session.path)})
