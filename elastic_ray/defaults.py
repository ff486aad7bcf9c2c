"""The default times of elastic-ray: each one defined here, once, and imported.

A default written out as a number in every signature that takes it drifts:
``30.0`` stood in ten places for the supervisor's interval, and the agent's
timings existed twice (its options and its command line). Here each has one
name; the Session, the SSH client and server, the Dagster resources, the
CLI and the agent import it, so a default changes in one line and the
reference table (docs/settings.md, held to this module by
tests/test_knobs.py) says what it is.

Seconds unless the name ends in ``_MS``. Only defaults a caller can change
(an argument, an option, a setting, a knob) and the thresholds a reader
judges by live here; a module's own pacing (its grace periods, lock and
probe timeouts) stays in the module that owns it.

It belongs to no room and imports nothing: every room may use it.
"""

from __future__ import annotations

# ---------------------------------------------------------------- the session (coordinator, SSH mode, Dagster, CLI)

#: How often a session's supervisor asks the scheduler about the head (the
#: heartbeat is watched in between), and how often the warm-standby keeper looks.
SUPERVISE_INTERVAL = 30.0
#: How often the process holding a session's autoscaler lease takes a turn
#: (reads Ray's demand in a probe process, decides, acts).
AUTOSCALE_INTERVAL = 5.0
#: Between two of its turns, how often that process looks at Ray's demand alone
#: (one call through the probe it keeps); new demand starts a turn at once.
AUTOSCALE_DEMAND_POLL = 1.0
#: How long a wait that may sit behind a Slurm queue waits: a worker
#: allocation joining, ``replace_head``, ``ready_head``, the Dagster
#: resources' ``head_timeout``, the CLI's ``--timeout``.
WAIT_TIMEOUT = 3600.0
#: How long ``wait_for_head`` waits: the first call of a new run, usually
#: right after ``Session.create``. Ten minutes, not an hour, on purpose: a
#: head (one small node) that is not up by then is usually a wrong
#: partition or account, or a queue the caller wants to hear about; the
#: TimeoutError names the head's state and log, and the job stays queued
#: (call again, or pass ``timeout=``). The waits of long-lived callers
#: (supervisors, Dagster steps) are ``WAIT_TIMEOUT``.
HEAD_WAIT_TIMEOUT = 600.0
#: How long the nodes of a worker allocation get to drain when it is removed
#: (``remove_worker_allocation``, ``WorkerAllocation.request_drain``,
#: ``elastic-ray session remove-worker``).
DRAIN_TIMEOUT = 900.0
#: How long a head phased out with ``Head.request_drain`` gets.
HEAD_DRAIN_TIMEOUT = 300.0
#: How long ``elastic-ray session teardown`` waits for the jobs to end after the cancel.
TEARDOWN_TIMEOUT = 120.0
#: An election claim's lease: a dead elector blocks the next election this
#: long at most (the seed's two minutes).
CLAIM_PERIOD = 120.0
#: SSH mode: the detached supervisor stops supervising after this long without any client call.
ABANDON_AFTER = 24 * 3600.0
#: SSH mode: how often the detached supervisor looks whether all of the session's jobs ended.
DETACHED_IDLE_INTERVAL = 60.0

# ---------------------------------------------------------------- a worker allocation (config)

#: How long a worker allocation's nodes stay without a live head before they
#: give the allocation up (``SlurmWorkerAllocationConfig.rejoin_timeout``).
REJOIN_TIMEOUT = 600.0

# ---------------------------------------------------------------- the agent (elastic-agent run; ELASTIC_AGENT_* knobs)

#: How often an agent reads the ``ray_head`` pointer.
POLL_INTERVAL = 1.0
#: How often a head's agent publishes its heartbeat: two beats per
#: ``HEAD_LOST_AFTER`` (docs/architecture.md, "The control channel").
HEARTBEAT_INTERVAL = 1.0
#: Heartbeat silence after which a head counts as lost.
HEAD_LOST_AFTER = 2.0
#: The first delay before a Ray node that ended is started again; it doubles
#: with each restart up to ``BACKOFF_MAX``.
BACKOFF_BASE = 2.0
BACKOFF_MAX = 60.0
#: How long ``ray start`` may take to join before the start counts as failed.
START_TIMEOUT = 120.0
#: How long before its walltime a head without a pre-walltime signal is
#: drained (the seed's five minutes).
HEAD_DRAIN_LEAD = 300.0
#: Seconds between two looks at the node's slurmd while it answers (0: off).
SLURMD_CHECK_INTERVAL = 20.0
#: How often an agent reads its node's GPU load from Ray's metrics (agent/node/ray_load).
GPU_SAMPLE_INTERVAL = 60.0
#: The head GCS's health check of its Ray nodes (docs/operations.md, "When a
#: node is lost"): a check every period, each given the timeout, DEAD after
#: the threshold of failures in a row, the first check after the initial delay.
HEALTH_CHECK_PERIOD_MS = 1000
HEALTH_CHECK_TIMEOUT_MS = 1000
HEALTH_CHECK_FAILURE_THRESHOLD = 4
HEALTH_CHECK_INITIAL_DELAY_MS = 3000

# ---------------------------------------------------------------- how fresh an agent's files are (status readers)

#: An agent rewrites its status file and its node file at least this often while it runs.
STATUS_REFRESH = 20.0
#: Older than this (three refreshes missed) a live agent's file means it is stuck:
#: "hung" in ``elastic-agent status``, "stale" in ``elastic-ray session status``.
AGENT_STALE_AFTER = 3 * STATUS_REFRESH
#: ``elastic-agent status`` hides agents that exited longer ago than this (``--all`` shows them).
STATUS_HIDE_EXITED_AFTER = 3600.0
