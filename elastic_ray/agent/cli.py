"""`elastic-agent`: the per-node agent's command line.

``run`` is what the batch scripts start once per node; ``status`` is for a
person logged into a node. Both take their defaults from the Slurm
environment so a batch script stays one line.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys
from pathlib import Path

import click

from .. import __version__, knobs
from ..errors import ElasticRayError
from ..log_format import FORMATS, formatter


def node_address(session_dir: Path, node: str) -> str:
    """This node's address from the run's launcher (see :mod:`agent.node.node_address`);
    a one-line error naming the node and what failed when it cannot."""
    from ..config.launcher import RayLauncher
    from ..protocol.disk.session_dir import SessionDir
    from .node.node_address import resolve_node_address

    try:
        launcher = RayLauncher.from_dict(SessionDir.open(session_dir).info().launcher)
        return resolve_node_address(node, network_interface=launcher.network_interface,
                                    node_ip_address_command=launcher.node_ip_address_command)
    except (ElasticRayError, ValueError, OSError) as exc:
        raise click.ClickException(f"cannot start the agent: {exc}") from None


def _seconds_option(flag: str, knob: knobs.Knob[float], help: str | None = None):
    """An option of ``run`` that its knob (``ELASTIC_AGENT_*``) sets too: name, floor and default
    come from the registry (:mod:`elastic_ray.knobs`); click reads and checks the variable."""
    return click.option(flag, envvar=knob.name, type=click.FloatRange(min=knob.minimum), default=knob.default,
                        help=None if help is None else f"{help} [${knob.name}].")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="elastic-agent")
def main() -> None:
    """The per-node agent of elastic-ray: starts, supervises, drains and moves Ray."""


@main.command()
@click.option("--session", "session_dir", required=True, type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="The run's session directory (shared by every node).")
@click.option("--job", "job_id", envvar="SLURM_JOB_ID", required=True, help="Slurm job id [$SLURM_JOB_ID].")
@click.option("--role", type=click.Choice(["head", "worker"]), required=True)
@click.option("--spec", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="The worker allocation's config (written by the coordinator before submission).")
@click.option("--node", envvar="SLURMD_NODENAME", default=None, help="Node name [$SLURMD_NODENAME, else host name].")
@click.option("--node-ip", default=None, help="Address of this node [the launcher's network_interface or node_ip_address_command, "
                   f"else ${knobs.NODE_IP.name}, else the host name's].")
@click.option("--node-index", envvar="SLURM_NODEID", type=click.IntRange(min=0), default=0,
              help="Index of this node in the allocation [$SLURM_NODEID].")
@_seconds_option("--poll-interval", knobs.POLL_INTERVAL)
@_seconds_option("--head-lost-after", knobs.HEAD_LOST_AFTER)
@_seconds_option("--backoff-base", knobs.BACKOFF_BASE)
@_seconds_option("--start-timeout", knobs.START_TIMEOUT)
@_seconds_option("--head-drain-lead", knobs.HEAD_DRAIN_LEAD,
                 "A head without a pre-walltime signal drains this many seconds before its walltime")
@click.option("--rejoin-order", envvar=knobs.REJOIN_ORDER.name, type=click.Choice(list(knobs.REJOIN_ORDER.choices)),
              default=knobs.REJOIN_ORDER.default, help="After the head moved, workers on the hosting node's machine "
                                                       "wait for its worker (host-first) or all start at once "
                                                       f"[${knobs.REJOIN_ORDER.name}].")
@click.option("--log-format", envvar=knobs.AGENT_LOG_FORMAT.name, type=click.Choice(FORMATS),
              default=knobs.AGENT_LOG_FORMAT.default, show_default=True,
              help=f"Log lines as text or one JSON object each [${knobs.AGENT_LOG_FORMAT.name}].")
def run(session_dir: Path, job_id: str, role: str, spec: Path | None, node: str | None, node_ip: str | None,
        node_index: int, poll_interval: float, head_lost_after: float, backoff_base: float,
        start_timeout: float, head_drain_lead: float, rejoin_order: str, log_format: str) -> None:
    """Run the agent of one node (started by the batch script through srun)."""
    from ..protocol.disk import paths
    from ..protocol.disk.records import check_job_id
    from .runner import Agent, AgentOptions
    from .slurm.signal_drain import DRAIN_SIGNALS

    try:
        check_job_id(job_id, "--job")
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    node = node or socket.gethostname()
    node_ip = node_ip or node_address(session_dir, node)
    log_file = paths.agent_log(session_dir, job_id, node)
    _setup_logging(log_file, log_format)
    banner = f"elastic-agent {__version__}: job {job_id} node {node} ({node_ip}) role {role}; log: {log_file}"
    if log_format == "json":      # every stderr line a JSON object, the banner too
        logging.getLogger("elastic_ray.agent").info(banner)
    else:
        click.echo(banner, err=True)
    try:
        agent = Agent(AgentOptions(session=session_dir, job_id=job_id, role=role, node=node, node_ip=node_ip,
                                   node_index=node_index, spec=spec, poll_interval=poll_interval,
                                   head_lost_after=head_lost_after, backoff_base=backoff_base,
                                   start_timeout=start_timeout, head_drain_lead=head_drain_lead,
                                   rejoin_order=rejoin_order))
    except (ElasticRayError, ValueError, OSError) as exc:
        raise click.ClickException(f"cannot start the agent: {exc}") from None
    # A parent that started us with the drain signals blocked or ignored (both pass through fork and
    # exec) would keep this agent from draining and every `ray start` from stopping: take them back.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DRAIN_SIGNALS)
    sys.exit(agent.run())


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.option("--job", "job_id", default=None, help="Only the agents of this Slurm job.")
@click.option("--all", "show_all", is_flag=True,
              help="Also agents that exited more than an hour ago (hidden by default).")
def status(as_json: bool, job_id: str | None, show_all: bool) -> None:
    """Every agent on this node: role, state, head, Ray node, ports, restarts, drain."""
    from .status import collect, render_json, render_text, select

    try:
        views, hidden = select(collect(), job=job_id, show_all=show_all)
    except ElasticRayError as exc:   # the runtime dir is not ours alone
        raise click.ClickException(str(exc)) from None
    click.echo(render_json(views) if as_json else render_text(views, hidden=hidden))


def _setup_logging(log_file: Path, log_format: str = "text") -> None:
    """One structured line per event, to the session's log folder and stderr
    (stderr lands in the Slurm job's output); as text or JSON (:mod:`elastic_ray.log_format`)."""
    fmt = formatter(log_format)
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in (logging.FileHandler(log_file), logging.StreamHandler(sys.stderr)):
        handler.setFormatter(fmt)
        root.addHandler(handler)


if __name__ == "__main__":  # pragma: no cover
    main()
