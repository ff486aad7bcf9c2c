"""The agent's event loop: the effect shell around :mod:`agent.machine`.

One thread waits on everything that can happen (control socket, head
heartbeat, signals and results of slow actions, through one wake-up pipe)
with a timeout that is the time to the next timer, so an idle agent sleeps.
A second thread carries out slow actions (start Ray and wait for it to join,
drain through a GCS probe, stop Ray) in order, and posts their outcome back
as events. Decisions stay in the machine; this module only observes and acts.

The agent never imports Ray: that alone would cost 75 MB of resident
memory, more than an idle agent may use. GCS operations run in a
short-lived probe process (``agent.gcs``).
"""

from __future__ import annotations

import collections
import errno
import glob
import logging
import os
import queue
import shutil
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import psutil
import zmq

from ..config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from ..config.launcher import RayLauncher
from ..atomic import read_json
from ..protocol.channel import ControlClient, ControlError, ControlServer, HeartbeatPublisher, HeartbeatSubscriber
from ..protocol.records import AgentState, HeadEndpoint, HostedHead, NodeState, RequestCounts, Transition
from ..protocol.session_dir import SessionDir
from ..scheduler.base import JobState
from . import gcs
from .machine import (
    Context,
    DrainRay,
    DrainRequested,
    Event,
    Exit,
    HeadSeen,
    PublishHead,
    RayEnded,
    RayJoined,
    Settings,
    ShutdownRequested,
    StartRay,
    State,
    StopRay,
    Tick,
    initial,
    step,
)
from .ray_args import build_ray_start, choose_ports, slurm_cpus_on_node, slurm_memory_bytes, worker_gpus
from .ray_node import RayNode
from .status import REFRESH_SECONDS, prune, status_path, write_status

log = logging.getLogger("elastic_ray.agent")

# Slurm may deliver the pre-walltime warning up to 30 s early; the drain is
# timed from the job's end time instead, leaving Ray this long to stop cleanly.
WALLTIME_MARGIN = 15.0
# When the signal comes because the job is being ended (scancel, timeout),
# Slurm kills everything after KillWait; stop well before that.
ENDING_GRACE = 3.0
DRAIN_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)
# How long a signal-triggered drain may wait for the scheduler to say why the
# signal came (state and end time). Slurm kills the job KillWait seconds
# after a cancel (default 30, 10 in the lab), so the answer is only useful if
# it comes quickly; without one the drain gets ENDING_GRACE.
SIGNAL_LOOKUP_TIMEOUT = 5.0
# A node counts as joined once its raylet registered with the GCS: the raylet
# logs that in its registration callback (RayNode.registered_node_id), so the
# agent learns it as soon as the GCS lists the node ALIVE, without a GCS
# round trip. Fallbacks, should a Ray version log differently: `ray start`'s
# start-up line (printed only after the GCS listed the node) plus the id the
# raylet logged, then a GCS probe. The agent does not probe before the
# start-up line: each probe is a Python process importing Ray (about 1 s of
# CPU), which would compete with `ray start` itself on a small node. A Ray
# that never prints the line is probed after this long anyway.
PROBE_WITHOUT_STARTUP_LINE_AFTER = 20.0
PROBE_INTERVAL = 0.5
# A silent head's GCS must answer within this long to keep the head live.
HEAD_PROBE_TIMEOUT = 4.0


def drain_deadline_for_signal(now: float, job_state: JobState | None, end_time: float | None) -> float:
    """Pure: when a signal-triggered drain must be finished.

    A running job with a known end time got the pre-walltime warning: drain
    until 15 s before the end. Anything else (the job is being cancelled or
    timed out, or Slurm did not answer) leaves a few seconds only.
    """
    if job_state is JobState.RUNNING and end_time is not None and end_time - WALLTIME_MARGIN > now:
        return end_time - WALLTIME_MARGIN
    return now + ENDING_GRACE


@dataclass(frozen=True)
class AgentOptions:
    session: Path
    job_id: str
    role: str                      # "head" or "worker"
    node: str                      # Slurm node name
    node_ip: str
    node_index: int = 0            # SLURM_NODEID: node 0 may host an elected head
    spec: Path | None = None       # the worker allocation's config (JSON)
    poll_interval: float = 1.0     # how often the ray_head pointer is read
    heartbeat_interval: float = 0.25  # a joining worker waits for one beat before it starts Ray
    head_lost_after: float = 2.0   # silence after which a head counts as lost
    backoff_base: float = 2.0
    backoff_max: float = 60.0
    start_timeout: float = 120.0


@dataclass
class _HeadWatch:
    """What this agent knows about the head named by ``ray_head``.

    The head's heartbeat is the fast signal. Its silence alone does not make
    the head lost, though: the head's *agent* may be stalled (a slow write to
    the shared filesystem, a starved CPU) while its Ray serves on, and
    treating that as a loss would make every worker drop its Ray node at
    once. So silence is checked against the head's GCS (one probe) first;
    a heartbeat that says Ray is down, or a GCS that does not answer, is a
    loss at once.
    """

    job: str | None = None
    endpoint: HeadEndpoint | None = None
    subscriber: HeartbeatSubscriber | None = None
    last_beat: float | None = None
    beat_ok: bool = False
    beat_draining: bool = False
    gcs_ok_at: float | None = None        # the GCS answered (asked because the heartbeat was silent)
    gcs_failed_at: float | None = None    # it did not
    probing: bool = False
    next_probe: float = 0.0

    def silent(self, now: float, lost_after: float) -> bool:
        return (self.endpoint is not None and self.last_beat is not None and self.beat_ok
                and now - self.last_beat > lost_after)

    def is_live(self, now: float, lost_after: float) -> bool:
        if self.endpoint is None or self.last_beat is None or not self.beat_ok:
            return False
        quiet = now - self.last_beat
        if quiet <= lost_after:
            return True
        if self.gcs_failed_at is not None and self.gcs_failed_at > self.last_beat:
            return False
        if self.gcs_ok_at is not None and self.gcs_ok_at > self.last_beat:
            return now - self.gcs_ok_at <= lost_after + HEAD_PROBE_TIMEOUT
        return quiet <= lost_after + HEAD_PROBE_TIMEOUT + 1.0   # the first probe is on its way

    def seen(self, now: float, lost_after: float) -> HeadSeen:
        return HeadSeen(now, self.job, self.endpoint.address if self.endpoint else None,
                        self.is_live(now, lost_after))


@dataclass
class _RayHandle:
    generation: int
    node: RayNode
    temp_dir: str
    address: str | None
    ports: dict[str, int] = field(default_factory=dict)
    raylet: psutil.Process | None = None
    reported: bool = False  # its end was already fed to the machine


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class Agent:
    def __init__(self, options: AgentOptions):
        self.o = options
        self.session = SessionDir.open(options.session)
        self.info = self.session.info()
        self.secret = self.session.secret()
        self.launcher = RayLauncher.from_dict(self.info.launcher)
        self.allocation = self._load_allocation()
        rejoin = getattr(self.allocation, "rejoin_timeout", 600.0)
        self.settings = Settings(role=options.role, rejoin_timeout=rejoin, backoff_base=options.backoff_base,
                                 backoff_max=options.backoff_max, start_timeout=options.start_timeout)
        self.started_at = time.time()
        self.pid_create_time = psutil.Process().create_time()
        self.status_file = status_path(options.job_id, options.node, os.getpid())
        self.ctx: Context
        self.head = _HeadWatch()
        self.ray: _RayHandle | None = None
        self.hosted: _RayHandle | None = None
        self.hosted_state: dict[str, Any] | None = None
        self.generation = 0
        # Guards ``generation``, ``ray`` and ``_nodes`` between the loop and
        # the effects thread: a stop must cancel a start that is still in
        # flight, or the node it launches would outlive its agent.
        self._lock = threading.Lock()
        self._nodes: list[RayNode] = []      # every node this agent started, for the final sweep
        self._starts = 0                     # numbers the per-start temp dirs
        self._stopping = False
        self.transitions: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)
        self._events: "queue.Queue[tuple[int | None, Event]]" = queue.Queue()
        self._work: "queue.Queue[Callable[[], None] | None]" = queue.Queue()
        self._signals: list[int] = []
        self._exit_code: int | None = None
        self._next_beat = 0.0
        self._next_pointer = 0.0
        self._next_status = 0.0
        self._pointer_missing_logged = False
        # (exit code, deadline) while a leaving agent still serves the run's head.
        self._handover: tuple[int, float] | None = None
        self.zctx = zmq.Context.instance()
        self.control = ControlServer(self.secret, self.info.session_id, options.node_ip, context=self.zctx)
        self.publisher: HeartbeatPublisher | None = None
        if options.role == "head":
            self.publisher = HeartbeatPublisher(self.secret, self.info.session_id, options.node_ip,
                                                context=self.zctx)
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # ------------------------------------------------------------ setup
    def _load_allocation(self) -> SlurmRunAllocationConfig:
        if self.o.role == "head":
            return SlurmRunAllocationConfig.from_dict(self.info.head)
        if self.o.spec is not None:
            data = read_json(self.o.spec)
            return SlurmWorkerAllocationConfig.from_dict(data.get("config", data))
        if self.info.worker_allocation is not None:
            return SlurmWorkerAllocationConfig.from_dict(self.info.worker_allocation)
        return SlurmWorkerAllocationConfig()

    def _log(self, event: str, **fields: Any) -> None:
        state = self.ctx.state.value if hasattr(self, "ctx") else "-"
        extra = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}" for k, v in fields.items())
        log.info("event=%s job=%s node=%s role=%s state=%s %s", event, self.o.job_id, self.o.node, self.o.role,
                 state, extra)

    # ------------------------------------------------------------ public
    def run(self) -> int:
        """Run until the machine says exit; returns the process exit code."""
        for sig in DRAIN_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        worker = threading.Thread(target=self._work_loop, name="agent-effects", daemon=True)
        worker.start()
        self.ctx, actions = initial(self.settings, time.time(), self.o.job_id)
        self._log("agent_started", control=self.control.endpoint, pid=os.getpid())
        self._remove_stale_temp_dirs()
        try:
            prune()
        except OSError as exc:
            log.warning("event=status_prune_failed error=%s", exc)
        self._publish_status(force_session=True)
        self._act(actions)
        try:
            self._loop()
        finally:
            # Cancel a start still in flight, let the queued stops run, then
            # sweep: no Ray process this agent started may outlive it.
            with self._lock:
                self._stopping = True
                self.generation += 1
            self._work.put(None)
            worker.join(timeout=60)
            self._shutdown()
        return self._exit_code if self._exit_code is not None else 0

    # ------------------------------------------------------------ loop
    def _loop(self) -> None:
        poller = zmq.Poller()
        poller.register(self.control.socket, zmq.POLLIN)
        poller.register(self._wake_r, zmq.POLLIN)
        subscribed = None
        subscribed_socket = None  # kept apart: a closed subscriber no longer hands out its socket
        while self._exit_code is None:
            now = time.time()
            if self.head.subscriber is not subscribed:
                if subscribed_socket is not None:
                    poller.unregister(subscribed_socket)
                subscribed = self.head.subscriber
                subscribed_socket = subscribed.socket if subscribed is not None else None
                if subscribed_socket is not None:
                    poller.register(subscribed_socket, zmq.POLLIN)
            timeout = max(0.0, min(self._next_pointer, self._next_beat if self._beats_due() else 1e300,
                                   self._next_status) - now)
            try:
                ready = dict(poller.poll(timeout=min(timeout, 1.0) * 1000))
            except zmq.ZMQError as exc:
                if exc.errno == errno.EINTR:
                    ready = {}
                else:
                    raise
            now = time.time()
            if self.control.socket in ready:
                self.control.handle_ready(self._on_request)
            if subscribed_socket is not None and subscribed_socket in ready:
                self._read_heartbeats(now)
            if self._wake_r in ready:
                self._drain_wake_pipe()
            self._handle_signals(now)
            self._handle_posted_events()
            if now >= self._next_pointer:
                self._next_pointer = now + self.o.poll_interval
                self._refresh_head(now)
            self._watch_ray(now)
            self._check_handover(now)
            self._check_silent_head(now)
            self._feed(self.head.seen(now, self.o.head_lost_after))
            self._feed(Tick(now))
            if self._beats_due() and now >= self._next_beat:
                self._next_beat = now + self.o.heartbeat_interval
                self._beat()
            if now >= self._next_status:
                self._publish_status()

    def _feed(self, event: Event) -> None:
        if self._exit_code is not None:
            return
        before = self.ctx
        self.ctx, actions = step(self.ctx, event)
        if self.ctx.state is not before.state:
            self.transitions.append({"at": round(self.ctx.since, 3), "from": before.state.value,
                                     "to": self.ctx.state.value, "reason": self.ctx.reason})
            self._log("state_changed", previous=before.state.value, reason=self.ctx.reason)
        # Act first: a StopRay detaches the node at once, so what is published
        # for the new state no longer names the Ray processes being stopped.
        self._act(actions)
        if self.ctx.state is not before.state:
            self._publish_status(force_session=True)

    def _act(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, StartRay):
                with self._lock:
                    self.generation += 1
                    gen = self.generation
                    old, self.ray = self.ray, None
                if old is not None:  # the machine stops first; this only guards against a leak
                    self._work.put(lambda h=old: self._stop_ray(h, False))
                self._work.put(lambda a=action, g=gen: self._start_ray(a.head_address, g))
            elif isinstance(action, StopRay):
                # A new generation cancels a start still in flight: it stops
                # the node it launched itself (see _start_ray).
                with self._lock:
                    self.generation += 1
                    handle, self.ray = self.ray, None
                if handle is not None:
                    self._work.put(lambda h=handle, g=action.graceful: self._stop_ray(h, g))
            elif isinstance(action, DrainRay):
                handle = self.ray
                if handle is not None:
                    self._work.put(lambda a=action, h=handle: self._drain_ray(h, a))
            elif isinstance(action, PublishHead):
                self._publish_head()
            elif isinstance(action, Exit):
                if self._serving_hosted_head():
                    # The run's head lives in this agent: hand it over before
                    # leaving (as a head allocation does), instead of taking
                    # the run's GCS down with this node.
                    deadline = self.ctx.drain_deadline or (time.time() + ENDING_GRACE)
                    self._handover = (action.code, deadline)
                    self._log("hosted_head_handover", deadline_in=f"{deadline - time.time():.1f}s")
                    self._publish_status(force_session=True)
                else:
                    self._exit_code = action.code

    # ------------------------------------------------------------ observations
    def _refresh_head(self, now: float) -> None:
        job = self.session.read_ray_head()
        if self.o.role == "head":
            # A head only needs to know whether the session moved the head away.
            self.head.job = job
            return
        if job is None and self.head.job is not None and self.head.is_live(now, self.o.head_lost_after):
            # Absent or unreadable (a damaged file, an NFS hiccup): keep the
            # head we follow while its heartbeat lives. A head that is really
            # gone falls silent within head_lost_after and is left then;
            # dropping every worker on one bad read would cost the cluster.
            if not self._pointer_missing_logged:
                self._log("head_pointer_missing", keeping=self.head.job)
                self._pointer_missing_logged = True
            return
        self._pointer_missing_logged = False
        if job != self.head.job:
            self._subscribe(None)
            self.head = _HeadWatch(job=job)
            self._log("head_pointer", head_job=job)
        if (self.head.job == self.o.job_id and self.head.last_beat is None and self.hosted_state
                and self.hosted_state.get("state") == "READY"):
            # We host this head ourselves: no need to wait for our own heartbeat
            # to come back through the subscription before joining it.
            self.head.last_beat, self.head.beat_ok = now, True
        if self.head.job is not None and self.head.endpoint is None:
            endpoint = self.session.read_head_endpoint(self.head.job)
            if endpoint is not None and "heartbeat" in endpoint.ports:
                self.head.endpoint = endpoint
                host = endpoint.address.rpartition(":")[0]
                self._subscribe(HeartbeatSubscriber(f"tcp://{host}:{endpoint.ports['heartbeat']}", self.secret,
                                                    self.info.session_id, context=self.zctx))
                if "control" in endpoint.ports:
                    threading.Thread(target=self._ask_head, args=(self.head, f"tcp://{host}:{endpoint.ports['control']}"),
                                     name="agent-ask-head", daemon=True).start()

    def _ask_head(self, watch: _HeadWatch, endpoint: str) -> None:
        """Ask a newly found head directly whether it serves, instead of waiting
        for its next heartbeat (up to an interval, plus the time a new
        subscription takes): a worker that joins starts Ray that much sooner.
        An answer counts as one heartbeat; no answer changes nothing."""
        try:
            with ControlClient(endpoint, self.secret, self.info.session_id, context=self.zctx) as client:
                status = client.request("status", {}, timeout=2.0).get("status") or {}
        except (ControlError, ValueError) as exc:
            self._log("head_not_asked", head_job=watch.job, error=str(exc)[:120])
            return
        serving = ((status.get("role") == "head" and status.get("state") in ("JOINED", "DRAINING"))
                   or (status.get("hosted_head") or {}).get("state") == "READY")
        if status.get("job_id") == watch.job and serving and watch.last_beat is None:
            watch.last_beat, watch.beat_ok = time.time(), True
            self._wake()

    def _serving_hosted_head(self) -> bool:
        return (self.hosted is not None and bool(self.hosted_state) and self.hosted_state.get("state") == "READY"
                and self.session.read_ray_head() == self.o.job_id)

    def _check_handover(self, now: float) -> None:
        """A leaving agent that hosts the run's head exits once the session moved
        the head elsewhere, its hosted head failed, or the deadline came."""
        if self._handover is None:
            return
        code, deadline = self._handover
        moved = self.head.job is not None and self.head.job != self.o.job_id
        failed = not (self.hosted_state and self.hosted_state.get("state") == "READY")
        if moved or failed or now >= deadline:
            why = "head moved" if moved else ("hosted head failed" if failed else "deadline reached")
            self._log("hosted_head_handed_over", head_job=self.head.job, why=why)
            self._handover = None
            self._exit_code = code

    def _check_silent_head(self, now: float) -> None:
        """Ask the GCS whether a head whose heartbeat fell silent still serves."""
        watch = self.head
        if self.o.role != "worker" or watch.probing or now < watch.next_probe \
                or not watch.silent(now, self.o.head_lost_after):
            return
        if watch.gcs_failed_at is not None and watch.last_beat is not None and watch.gcs_failed_at > watch.last_beat:
            return  # already judged lost; a heartbeat (or another pointer) starts over
        assert watch.endpoint is not None
        watch.probing = True
        watch.next_probe = now + self.o.head_lost_after
        address, quiet = watch.endpoint.address, now - (watch.last_beat or now)
        self._log("head_silent", head_job=watch.job, quiet=f"{quiet:.1f}s", action="asking its GCS")

        def probe() -> None:
            try:
                answered = gcs.gcs_ready(address, timeout=HEAD_PROBE_TIMEOUT) is not None
            except Exception as exc:   # auth or usage trouble: no evidence that it serves
                self._log("head_probe_failed", error=str(exc)[:200])
                answered = False
            at = time.time()
            if answered:
                watch.gcs_ok_at = at
            else:
                watch.gcs_failed_at = at
            watch.probing = False
            self._log("head_probe", head_job=watch.job, gcs="answers" if answered else "silent")
            self._wake()

        threading.Thread(target=probe, name="agent-head-probe", daemon=True).start()

    def _subscribe(self, subscriber: HeartbeatSubscriber | None) -> None:
        if self.head.subscriber is not None:
            self.head.subscriber.close()
        self.head.subscriber = subscriber

    def _read_heartbeats(self, now: float) -> None:
        sub = self.head.subscriber
        if sub is None:
            return
        while True:
            envelope = sub.poll(0)
            if envelope is None:
                return
            body = envelope.body
            if body.get("head_job") != self.head.job:
                continue
            self.head.last_beat = now
            self.head.beat_ok = bool(body.get("ray_ok"))
            self.head.beat_draining = bool(body.get("draining"))

    def _watch_ray(self, now: float) -> None:
        handle = self.ray
        if handle is not None and not handle.reported:
            rc = handle.node.poll_exit()
            if rc is not None:
                handle.reported = True
                self._feed(RayEnded(now, f"ray start exited with {rc}"))
            elif handle.raylet is not None and not _proc_alive(handle.raylet):
                # A drained raylet exits 0 while `ray start --block` stays up.
                handle.reported = True
                self._feed(RayEnded(now, "the raylet ended"))
        hosted = self.hosted
        if hosted is not None and self.hosted_state and self.hosted_state.get("state") == "READY":
            if hosted.node.poll_exit() is not None:
                self.hosted_state = {"state": "FAILED", "reason": "the hosted head's Ray stopped", "at": now}
                self._log("hosted_head_failed")
                self._publish_status(force_session=True)

    # ------------------------------------------------------------ signals and posted events
    def _on_signal(self, signum: int, _frame: Any) -> None:
        self._signals.append(signum)

    def _drain_wake_pipe(self) -> None:
        try:
            while os.read(self._wake_r, 4096):
                pass
        except BlockingIOError:
            pass

    def _wake(self) -> None:
        try:
            os.write(self._wake_w, b"\0")
        except BlockingIOError:
            pass

    def _handle_signals(self, now: float) -> None:
        while self._signals:
            signum = self._signals.pop(0)
            name = signal.Signals(signum).name
            self._log("signal", signal=name)
            # Not on the effects thread: that may be busy starting Ray for
            # many seconds, and Slurm's KillWait is running.
            threading.Thread(target=self._drain_for_signal, args=(name,), name="agent-signal",
                             daemon=True).start()

    def _post(self, generation: int | None, event: Event) -> None:
        self._events.put((generation, event))
        self._wake()

    def _handle_posted_events(self) -> None:
        while True:
            try:
                generation, event = self._events.get_nowait()
            except queue.Empty:
                return
            if generation is not None and generation != self.generation:
                continue  # about a Ray node we have already replaced
            self._feed(event)

    # ------------------------------------------------------------ control requests
    def _on_request(self, envelope: Any) -> dict[str, Any]:
        kind, body, now = envelope.kind, envelope.body, time.time()
        if kind == "status":
            log.debug("event=request job=%s node=%s kind=status", self.o.job_id, self.o.node)
        else:
            self._log("request", kind=kind)
        if kind == "status":
            return {"ok": True, "status": self._status()}
        if kind == "drain":
            self._feed(DrainRequested(now, float(body["deadline"]), str(body.get("reason") or "drain request")))
            return {"ok": True, "state": self.ctx.state.value}
        if kind == "follow":
            self._next_pointer = 0.0  # read the pointer now rather than at the next poll
            return {"ok": True, "state": self.ctx.state.value}
        if kind == "shutdown":
            self._feed(ShutdownRequested(now, str(body.get("reason") or "shutdown request")))
            return {"ok": True, "state": self.ctx.state.value}
        if kind == "host_head":
            return self._host_head_request()
        return {"ok": False, "error": f"unsupported request {kind}"}

    # ------------------------------------------------------------ effects (run on the effects thread)
    def _work_loop(self) -> None:
        while True:
            job = self._work.get()
            if job is None:
                return
            try:
                job()
            except Exception as exc:  # an effect must never kill the agent
                log.exception("event=effect_failed job=%s node=%s error=%s", self.o.job_id, self.o.node, exc)

    def _temp_root(self) -> str:
        # Short on purpose: Ray puts Unix sockets under it (107-byte limit).
        # The session id keeps two runs whose job ids coincide (two local
        # clusters both start at job 1) apart on a shared /tmp.
        return f"/tmp/er/{self.info.session_id[:8]}"

    def _temp_dir(self, suffix: str) -> str:
        """A fresh directory for every start of a Ray node.

        Never reused: the agent finds its node id in the GCS by the raylet's
        socket path under this directory, and right after a crash the GCS
        still lists the dead incarnation ALIVE (until its health check fails,
        about 15 s). A restart in the same directory was measured to "join"
        in 0.5 s under the dead node's id; later drains then went to the dead
        node while the live one kept running.
        """
        with self._lock:
            self._starts += 1
            number = self._starts
        return f"{self._temp_root()}/{self.o.job_id}.{self.o.node_index}{suffix}{number}"

    def _remove_stale_temp_dirs(self) -> None:
        """Remove temp dirs an earlier agent of this job and node left behind
        (killed before it could clean up, or a requeued job), unless a live
        process still names them."""
        mine = glob.glob(f"{self._temp_root()}/{self.o.job_id}.{self.o.node_index}[hw]*")
        if not mine:
            return
        in_use: set[str] = set()
        for proc in psutil.process_iter(["cmdline"]):
            try:
                text = " ".join(proc.info["cmdline"] or ())
            except (psutil.Error, TypeError):
                continue
            in_use.update(d for d in mine if d in text)
        for directory in mine:
            if directory not in in_use:
                shutil.rmtree(directory, ignore_errors=True)
                self._log("stale_temp_dir_removed", path=directory)

    def _start_ray(self, head_address: str | None, generation: int, *, hosted: bool = False) -> None:
        role = "head" if (self.o.role == "head" or hosted) else "worker"
        with self._lock:
            if not hosted and generation != self.generation:
                return  # superseded before it began (a stop or another start came first)
            if self._stopping:
                return
        temp_dir = self._temp_dir("h" if role == "head" else "w")
        Path(temp_dir).mkdir(parents=True, exist_ok=True)
        ports = choose_ports(self.launcher.port_strategy, self.o.job_id, role, _free_port,
                             head_port=self.launcher.head_port)
        labels = {"slurm.job-id": self.o.job_id, "slurm.node": self.o.node}
        memory = slurm_memory_bytes(os.environ)
        if role == "head":
            cmd = build_ray_start("head", job_id=self.o.job_id, node_ip=self.o.node_ip, temp_dir=temp_dir,
                                  launcher=self.launcher, ports=ports, memory_bytes=memory, labels=labels)
        else:
            alloc = self.allocation if isinstance(self.allocation, SlurmWorkerAllocationConfig) else None
            cmd = build_ray_start(
                "worker", job_id=self.o.job_id, node_ip=self.o.node_ip, temp_dir=temp_dir, launcher=self.launcher,
                ports=ports, allocation=alloc, head_address=head_address,
                num_cpus=slurm_cpus_on_node(os.environ) or 1, num_gpus=worker_gpus(self.launcher, alloc),
                memory_bytes=memory, labels=labels)
        log_path = self.session.log_dir / f"ray-{self.o.job_id}-{self.o.node}-{role}{'-hosted' if hosted else ''}.log"
        started = time.time()
        node = RayNode.start(cmd, log_path)
        address = head_address if role == "worker" else cmd.gcs_address
        handle = _RayHandle(generation, node, temp_dir, address, dict(ports))
        with self._lock:
            self._nodes.append(node)
            superseded = self._stopping or (not hosted and generation != self.generation)
            if not superseded:
                if hosted:
                    self.hosted = handle
                else:
                    self.ray = handle
        if superseded:
            # A stop (or the agent's exit) came while we were launching it:
            # nobody else holds this node, so it is ours to stop.
            self._stop_ray(handle, graceful=False)
            return
        deadline = started + self.o.start_timeout
        node_id = None
        next_probe = 0.0
        logged_checked, finished_seen, how = False, 0.0, "gcs"
        while time.time() < deadline:
            if node.poll_exit() is not None:
                break
            with self._lock:
                if self._stopping or (not hosted and generation != self.generation):
                    return  # the stop that superseded us holds the handle and stops the node
            now = time.time()
            if hosted:
                # A hosted head is ready for workers once its GCS accepts
                # connections: a joining `ray start` needs nothing more, and
                # publishing now overlaps the workers' own start-up with the
                # rest of the head's.
                if _port_open(address):
                    node_id = "head"
                    break
                time.sleep(0.1)
                continue
            node_id = node.registered_node_id()
            if node_id:
                how = "raylet registered"
                break
            finished = node.startup_finished()
            if finished and not logged_checked:
                # `ray start` printed its start-up line only once the GCS
                # listed the node: the id its raylet logged is the one joined.
                # (No such line within 2 s, say a new log format: ask the GCS.)
                finished_seen = finished_seen or now
                node_id = node.logged_node_id()
                if node_id:
                    how = "raylet log"
                    break
                logged_checked = now - finished_seen > 2.0
            ready = finished or now - started > PROBE_WITHOUT_STARTUP_LINE_AFTER
            if ready and (logged_checked or not finished) and now >= next_probe:
                next_probe = now + PROBE_INTERVAL
                try:
                    # A head's own raylet registers like any node, so both roles
                    # learn their node id the same way once the GCS lists it.
                    node_id = gcs.own_node_id(address, temp_dir, timeout=10)
                except gcs.ProbeError as exc:
                    self._log("probe_failed", error=str(exc)[:200])
                if node_id:
                    break
            time.sleep(0.1)
        handle.raylet = _find_proc(node.raylet_pid())
        if hosted:
            self._hosted_ready(handle, node_id, address)
            return
        if node_id:
            self._log("ray_joined", node_id=node_id, seconds=f"{time.time() - started:.2f}",
                      raylet_pid=handle.raylet.pid if handle.raylet else "-", seen_in=how)
            self._post(generation, RayJoined(time.time(), node_id))
        else:
            rc = node.poll_exit()
            self._post(generation, RayEnded(time.time(), f"did not join (ray start exit {rc}); see {log_path}"))

    def _stop_ray(self, handle: _RayHandle, graceful: bool) -> None:
        report = handle.node.stop(grace=5.0) if graceful else handle.node.kill()
        self._log("ray_stopped", graceful=graceful, seconds=f"{report.seconds:.2f}",
                  killed=",".join(report.killed) or "-")
        # Ray's per-node files (sockets, spilled objects, its own logs) are
        # of no use once the node is gone; our log of `ray start` is kept.
        shutil.rmtree(handle.temp_dir, ignore_errors=True)

    def _drain_ray(self, handle: _RayHandle, action: DrainRay) -> None:
        address = handle.address
        if address is None:
            return
        try:
            result = gcs.drain_node(address, action.node_id, reason="preemption", message=action.reason[:200],
                                    deadline_ms=int(action.deadline * 1000), timeout=20)
            self._log("drain_requested", accepted=result.accepted, message=result.message or "-")
        except gcs.ProbeError as exc:
            self._log("drain_failed", error=str(exc)[:200])

    def _drain_for_signal(self, signal_name: str) -> None:
        """Find out why the signal came, then drain with the right deadline."""
        now = time.time()
        state, end = None, None
        try:
            from ..scheduler.factory import make_scheduler

            sched = make_scheduler(self.info.scheduler["kind"], state_dir=self.info.scheduler.get("state_dir"))
            if hasattr(sched, "timeout"):
                sched.timeout = SIGNAL_LOOKUP_TIMEOUT  # type: ignore[attr-defined]
            info = sched.query(self.info.job_name, [self.o.job_id]).get(self.o.job_id)
            if info is not None:
                state, end = info.state, info.end_time
        except Exception as exc:
            self._log("end_time_unknown", error=str(exc)[:200])
        deadline = drain_deadline_for_signal(now, state, end)
        self._log("signal_drain", signal=signal_name, job_state=state.value if state else "-",
                  end_in=f"{end - now:.1f}s" if end is not None else "-", deadline_in=f"{deadline - now:.1f}s",
                  lookup=f"{time.time() - now:.2f}s")
        self._post(None, DrainRequested(time.time(), deadline, f"{signal_name} (job {state.value if state else '?'})"))

    # ------------------------------------------------------------ head publishing
    def _beats_due(self) -> bool:
        return self.publisher is not None and (self.o.role == "head" or self.hosted is not None)

    def _beat(self) -> None:
        if self.publisher is None:
            return
        if self.o.role == "head":
            ok = self.ray is not None and self.ctx.state in (State.JOINED, State.DRAINING)
            draining = self.ctx.state is State.DRAINING
        else:
            ok = bool(self.hosted_state and self.hosted_state.get("state") == "READY")
            # The allocation is leaving: whoever watches the head should elect another.
            draining = self._handover is not None or self.ctx.state in (State.DRAINING, State.LEFT, State.RELEASED)
        self.publisher.publish({"head_job": self.o.job_id, "ray_ok": ok, "draining": draining})

    def _publish_head(self) -> None:
        handle = self.ray
        if handle is None or self.publisher is None:
            return
        self._write_endpoint(handle)

    def _write_endpoint(self, handle: _RayHandle) -> None:
        assert self.publisher is not None
        ports = {k: v for k, v in handle.ports.items() if isinstance(v, int) and v > 0}
        ports["gcs_port"] = int(handle.address.rpartition(":")[2]) if handle.address else ports.get("gcs_port", 0)
        ports["heartbeat"] = int(self.publisher.endpoint.rpartition(":")[2])
        ports["control"] = int(self.control.endpoint.rpartition(":")[2])
        endpoint = HeadEndpoint(job_id=self.o.job_id, host=self.o.node, address=f"{self.o.node_ip}:{ports['gcs_port']}",
                                ray_version=_ray_version(), started_at=time.time(), ports=ports)
        self.session.write_head_endpoint(endpoint)
        self._log("head_published", address=endpoint.address)

    def _host_head_request(self) -> dict[str, Any]:
        if self.o.role != "worker" or self.o.node_index != 0:
            return {"ok": False, "error": "only the first node of a worker allocation hosts a head"}
        if not self.launcher.can_host_elected_head:
            return {"ok": False, "error": f"port_strategy {self.launcher.port_strategy!r} cannot host a head"}
        if self.hosted_state and self.hosted_state.get("state") in ("STARTING", "READY"):
            return {"ok": True, "hosted_head": self.hosted_state}
        self.hosted_state = {"state": "STARTING", "at": time.time()}
        if self.publisher is None:
            self.publisher = HeartbeatPublisher(self.secret, self.info.session_id, self.o.node_ip, context=self.zctx)
        # Its own thread, not the effects queue: the node's worker Ray may need
        # stopping and starting meanwhile (it follows the new head), and a
        # slow head start must not hold that up.
        threading.Thread(target=self._start_ray, args=(None, 0), kwargs={"hosted": True},
                         name="agent-hosted-head", daemon=True).start()
        self._publish_status(force_session=True)
        return {"ok": True, "hosted_head": self.hosted_state}

    def _hosted_ready(self, handle: _RayHandle, node_id: str | None, address: str) -> None:
        if node_id and handle.node.poll_exit() is None:
            self._write_endpoint(handle)
            self.hosted_state = {"state": "READY", "address": address, "at": time.time()}
            self._log("hosted_head_ready", address=address)
        else:
            handle.node.kill()
            self.hosted = None
            self.hosted_state = {"state": "FAILED", "reason": "the head did not start; see the Ray log",
                                 "at": time.time()}
            self._log("hosted_head_failed")
        self._wake()
        self._next_status = 0.0

    # ------------------------------------------------------------ status
    def _node_state(self) -> NodeState:
        """What this agent publishes: the session's node file, the node-local status file."""
        c = self.ctx
        handle = self.ray
        raylet = handle.raylet if handle is not None else None
        return NodeState(
            session=str(self.session.path), job_id=self.o.job_id, node=self.o.node,
            node_ip=self.o.node_ip, node_index=self.o.node_index, role=self.o.role,
            state=AgentState(c.state.value), reason=c.reason, since=c.since,
            head_job=c.head_job, head_address=c.head_address, node_id=c.node_id,
            ports=dict(handle.ports) if handle else {},
            ray_pid=handle.node.pid if handle else None, raylet_pid=raylet.pid if raylet else None,
            temp_dir=handle.temp_dir if handle else None,
            ray_address=handle.address if handle else None,
            restarts=c.restarts, failures=c.failures, max_restarts=c.settings.max_restarts,
            next_retry_at=c.next_retry_at, gave_up_on=c.gave_up_on, drain_deadline=c.drain_deadline,
            no_head_since=c.no_head_since, rejoin_timeout=c.settings.rejoin_timeout,
            started_at=self.started_at, updated_at=time.time(),
            pid=os.getpid(), pid_create_time=self.pid_create_time, control=self.control.endpoint,
            requests=RequestCounts(accepted=self.control.accepted, rejected=sum(self.control.rejected.values()),
                                   rejected_by_reason=dict(self.control.rejected)),
            hosted_head=HostedHead.from_dict(self.hosted_state) if self.hosted_state else None,
            history=tuple(c.history[-5:]),
            handover_deadline=self._handover[1] if self._handover else None,
            transitions=tuple(Transition.from_dict(t) for t in list(self.transitions)[-20:]),
            exited=self._exit_code is not None, exit_code=self._exit_code,
        )

    def _status(self) -> dict[str, Any]:
        """The node state as the control channel's ``status`` reply carries it."""
        return self._node_state().to_dict()

    def _publish_status(self, force_session: bool = False) -> None:
        self._next_status = time.time() + REFRESH_SECONDS
        try:
            state = self._node_state()
            write_status(self.status_file, state)
            if force_session:
                self.session.write_node_state(state)
        except (OSError, ValueError) as exc:  # ValueError: a state the record refuses; a bug, never fatal
            log.warning("event=status_write_failed job=%s node=%s error=%s", self.o.job_id, self.o.node, exc)

    # ------------------------------------------------------------ shutdown
    def _shutdown(self) -> None:
        handles = [h for h in (self.ray, self.hosted) if h is not None]
        self.ray = self.hosted = None
        for handle in handles:
            try:
                self._stop_ray(handle, graceful=True)
            except Exception as exc:
                log.warning("event=stop_failed job=%s error=%s", self.o.job_id, exc)
        # Anything still running was started by us and missed by the stops
        # above (an effect that did not finish in time): it goes too.
        for node in self._nodes:
            try:
                if node.members():
                    report = node.kill()
                    self._log("leftover_ray_killed", pid=node.pid, killed=",".join(report.killed) or "-")
            except Exception as exc:
                log.warning("event=sweep_failed job=%s pid=%s error=%s", self.o.job_id, node.pid, exc)
        try:
            os.rmdir(self._temp_root())     # only if no other job of the session still uses it
        except OSError:
            pass
        self._log("agent_exit", code=self._exit_code)
        self._publish_status(force_session=True)
        self._subscribe(None)
        self.control.close()
        if self.publisher is not None:
            # A last heartbeat saying the head is down: followers leave now
            # instead of after head_lost_after of silence plus a GCS probe.
            # The socket drops what is unsent when it closes, so give its I/O
            # thread a moment to hand the frame to TCP.
            try:
                self.publisher.publish({"head_job": self.o.job_id, "ray_ok": False, "draining": True})
                time.sleep(0.1)
            except Exception as exc:
                log.warning("event=last_heartbeat_failed job=%s error=%s", self.o.job_id, exc)
            self.publisher.close()
        signal.set_wakeup_fd(-1)


def _port_open(address: str | None, timeout: float = 0.5) -> bool:
    if not address:
        return False
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            return True
    except OSError:
        return False


def _proc_alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _find_proc(pid: int | None) -> psutil.Process | None:
    if not pid:
        return None
    try:
        return psutil.Process(pid)
    except psutil.NoSuchProcess:
        return None


def _ray_version() -> str:
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return "unknown"
