"""The agent's event loop: the effect shell around :mod:`agent.machine`.

One thread waits on everything that can happen (control socket, head heartbeat, signals and results of slow
actions, through one wake-up pipe) with a timeout that is the time to the next timer, so an idle agent sleeps.
A second thread carries out slow actions (start Ray and wait for it to join, drain through a GCS probe, stop
Ray) in order, and posts their outcome back as events. Decisions stay in the machines (``agent.machine`` for
the node, ``agent.head.hosted`` for a hosted head and its hand-over, ``agent.head.head_watch`` for the followed
head); this module only observes and acts. Its helpers: ``agent.head.following`` (the head pointer and
heartbeat), ``agent.head.hosted_head``, ``agent.requests`` (which machine answers which control request),
``agent.node.local_ray`` (this agent's Ray processes), ``agent.node.join`` and ``agent.history`` (its events).

Threads and what they share:

- the event loop (the main thread) owns the machine's context ``ctx``, ``transitions``, ``_signals`` (signal
  handlers run on it), ``_exit_code``, the loop's deadlines (``wakeups.LoopClock``), the heartbeat socket
  (``agent.head.publishing``) and the followed head's watch (``agent.head.following``); only the loop writes
  the status;
- ``agent-effects`` runs the queued slow actions in order; it and the other helper threads (``agent-signal``,
  ``agent-ask-head``, ``agent-head-probe``, ``agent-slurmd-job``) hand their results to the loop through
  ``_events`` (machine events, or callables the loop runs) instead of writing loop-owned state. The one flag a
  helper thread sets is ``_status_soon`` (a ``threading.Event``: the hosted-head thread asks for a prompt
  status);
- ``agent-prune`` (``agent.status``) deletes long-exited agents' status files and shares nothing;
  ``agent-gpu-load`` (``agent.node.ray_load``, on nodes with GPUs) keeps its meter under its own lock and
  only reads the current handle and state;
- the Ray nodes and their generation are guarded by ``LocalRay.lock`` (``agent.node.local_ray``); the hosted
  head's record by ``HostedHead._lock`` (``agent.head.hosted_head``).

The agent never imports Ray: that alone would cost 75 MB of resident memory, more than an idle agent may use.
GCS operations run in a short-lived probe process (``agent.node.gcs``).
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import queue
import signal
import threading
import time
from typing import Any, Callable

import psutil
import zmq

from .. import defaults, knobs
from ..config.launcher import RayLauncher
from ..errors import UnsafePathError
from ..protocol.wire.channel import ControlServer
from ..protocol.disk.records import AgentState, NodeState, RequestCounts, Transition
from ..protocol.disk.records import HostedHead as HostedHeadRecord
from ..protocol.disk.session_dir import SessionDir
from ..ray_auth import apply_auth_env, launcher_warnings
from .node import join
from . import requests, wakeups
from .head.following import HeadFollower
from .head.hosted import HostSettings
from .head.hosted_head import HostedHead
from .history import AgentHistory
from .node.oom import OomCounter
from .node.ray_load import GpuSampler
from .limits import raise_nofile_limit
from .node.local_ray import LocalRay, NodePlace, RayHandle
from .head.node_gone import GoneReporter, MarkDeadService
from .options import AgentOptions, hosts_head_at_start, load_allocation
from .machine import (Context, DrainRay, Event, Exit, PublishHead, RayEnded, Settings, StartRay, State, StopRay, Tick,
                      initial, step)
from .head.publishing import WRITE_RETRY_SECONDS, HeadPublishing, NodeFile
from .head.rejoin_order import RejoinTurn, host_in
from .slurm.signal_drain import DRAIN_SIGNALS, WalltimeWatch, drain_for_signal
from .slurm.slurmd_watch import SlurmdWatch
from .node.private_dirs import ensure_private_dir
from .status import REFRESH_SECONDS, STATUS_SLACK, prune_in_background, status_path, write_status
from .slurm.walltime import serves_head

log = logging.getLogger("elastic_ray.agent")

__all__ = ["Agent", "AgentOptions"]


class Agent:
    def __init__(self, options: AgentOptions):
        self.o = options
        self.session = SessionDir.open(options.session)
        self.info = self.session.info()
        self.secret = self.session.secret()
        self.launcher = RayLauncher.from_dict(self.info.launcher)
        self.token_path = self._set_up_ray_auth()
        self.allocation = load_allocation(options, self.info)
        rejoin = getattr(self.allocation, "rejoin_timeout", defaults.REJOIN_TIMEOUT)
        self.settings = Settings(role=options.role, rejoin_timeout=rejoin, backoff_base=options.backoff_base,
                                 backoff_max=options.backoff_max, start_timeout=options.start_timeout)
        self.started_at = time.time()
        self.pid_create_time = psutil.Process().create_time()
        self.status_file = status_path(options.job_id, options.node, os.getpid())
        self.ctx: Context
        place = NodePlace(options.job_id, options.node, options.node_ip, options.node_index, self.info.session_id,
                          self.session.log_dir)
        self.local = LocalRay(place, self.launcher, self.allocation, self._log, token_path=self.token_path)
        # Private per-user directories, checked before anything runs: one that
        # is not ours alone stops the agent here with a clear error.
        self.local.prepare()
        ensure_private_dir(self.status_file.parent)
        self.transitions: collections.deque[dict[str, Any]] = collections.deque(maxlen=50)
        self._events: "queue.Queue[tuple[int | None, Event | Callable[[], None]]]" = queue.Queue()
        self._work: "queue.Queue[Callable[[], None] | None]" = queue.Queue()
        self._signals: list[int] = []
        self._exit_code: int | None = None
        self.clock = wakeups.LoopClock(options.heartbeat_interval, options.poll_interval)
        self._next_raylet_check = 0.0
        self._status_soon = threading.Event()
        self._node_file = NodeFile(self.session, self._log)   # at state changes and every REFRESH_SECONDS
        self.history = AgentHistory(str(self.session.path), self.o.job_id, self.o.node, self.o.role)
        self.gpus = GpuSampler(lambda: (h.ports.get("metrics_export_port") if (h := self.ray) is not None and
                                        self.ctx.state is AgentState.JOINED else None),
                               interval=knobs.GPU_SAMPLE_INTERVAL.read(), host=place.node_ip)
        self.oom = OomCounter(lambda kills, new: (self._log("oom_killed", kills=kills, new=new),  # at status writes
                                                  self.history.oom_killed(kills, new)))
        self.walltime = WalltimeWatch(self.info.scheduler, self.info.job_name, options.job_id,
                                      options.head_drain_lead, self._log, self._post_call)
        self.slurmd = SlurmdWatch.for_agent(self.info, options, self._log, self._post_call, self._feed)
        self.zctx = zmq.Context.instance()
        self.control = ControlServer(self.secret, self.info.session_id, options.node_ip, context=self.zctx)
        self.publishing = HeadPublishing(self.session, self.secret, place, self.zctx, self.control.endpoint,
                                         self._log, heartbeat=options.role == "head")
        self.follower = HeadFollower(self.session, self.secret, self.info.session_id, self.zctx, role=options.role,
                                     lost_after=options.head_lost_after, log=self._log, on_loop=self._post_call)
        self.hosted_head = HostedHead(
            HostSettings(options.job_id, options.role, options.node_index, self.launcher.can_host_elected_head,
                         self.launcher.port_strategy),
            self.local, options.start_timeout, log=self._log, ensure_publisher=self.publishing.ensure,
            write_endpoint=self.publishing.write_endpoint, publish_status=lambda: self._publish_status(force_session=True),
            status_soon=self._request_status, standby_worker=knobs.STANDBY_WORKER.read() == "on")
        self.mark_dead = MarkDeadService(self.session, options.job_id, self._serves_head, self._post_call,
                                         self.control.answer, self._log)
        self._requests = requests.handlers(
            status=self._status, feed=self._feed, state=lambda: self.ctx.state.value,
            read_pointer_now=self._read_pointer_now, hosted=self.hosted_head, mark_dead=self.mark_dead)
        self.gone = GoneReporter(self.session, self.secret, self.info.session_id, self._log)
        self.rejoin = RejoinTurn(options.rejoin_order, options.node, host_in(self.session), self._log)
        self.local.on_stopped = lambda h: self.gone.report(h.node_id, h.address, f"agent of job {options.job_id} "
                                                                             f"on {options.node} stopped its Ray node")
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)

    # The status record reads these three (see _status).
    @property
    def ray(self) -> RayHandle | None:
        return self.local.ray

    @property
    def hosted_state(self) -> dict[str, Any] | None:
        return self.hosted_head.status()

    @property
    def _handover(self) -> tuple[int, float] | None:
        handover = self.hosted_head.record.handover
        return (handover.code, handover.deadline) if handover else None

    # ------------------------------------------------------------ setup
    def _set_up_ray_auth(self) -> str | None:
        """Put the session's Ray auth settings into this process's environment.

        Every child inherits them: the GCS probes (which must be accepted by
        a token-auth GCS) and ``ray start`` (whose command sets them again,
        explicitly). The token file path, never the token, is what travels.
        """
        auth = self.session.ray_auth_env(self.launcher.auth_mode)
        apply_auth_env(os.environ, auth)
        for event, text in launcher_warnings(self.launcher.auth_mode, self.launcher.redis_password):
            log.warning("event=%s job=%s node=%s %s", event, self.o.job_id, self.o.node, text)
        return auth.get("RAY_AUTH_TOKEN_PATH")

    def _log(self, event: str, **fields: Any) -> None:
        state = self.ctx.state.value if hasattr(self, "ctx") else "-"
        words = " ".join(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}" for k, v in fields.items())
        log.info("event=%s job=%s node=%s role=%s state=%s %s", event, self.o.job_id, self.o.node, self.o.role,
                 state, words, extra={"fields": {"event": event, "job": self.o.job_id, "node": self.o.node,
                                                 "role": self.o.role, "state": state, **fields}})

    # ------------------------------------------------------------ public
    def run(self) -> int:
        """Run until the machine says exit; returns the process exit code."""
        for sig in DRAIN_SIGNALS:
            signal.signal(sig, self._on_signal)
        signal.set_wakeup_fd(self._wake_w, warn_on_full_buffer=False)
        worker = threading.Thread(target=self._work_loop, name="agent-effects", daemon=True)
        worker.start()
        self.ctx, actions = initial(self.settings, time.time(), self.o.job_id)
        self._log("agent_started", control=self.control.endpoint, pid=os.getpid(), nofile=raise_nofile_limit())
        self.history.started(os.getpid())
        if getattr(self.allocation, "gpus_per_node", None):
            self.gpus.start()        # a node without GPUs has no GPU-hours to count
        self.slurmd.start()
        self.local.remove_stale_temp_dirs()
        self._publish_status(force_session=True)
        self._act(actions)
        if hosts_head_at_start(self.o):
            self._log("hosting_head_at_start")
            try:
                self.hosted_head.request(time.time())
            except (zmq.ZMQError, OSError) as exc:   # e.g. no descriptor for the heartbeat socket
                self._log("hosting_head_failed", error=str(exc)[:200])
        prune_in_background()   # housekeeping, after the start is on its way
        try:
            self._loop()
        finally:
            # Cancel a start still in flight, let the queued stops run, then
            # sweep: no Ray process this agent started may outlive it.
            self.local.stop_launching()
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
            if self.follower.subscriber is not subscribed:
                if subscribed_socket is not None:
                    poller.unregister(subscribed_socket)
                subscribed = self.follower.subscriber
                subscribed_socket = self.follower.wake_socket()
                if subscribed_socket is not None:
                    poller.register(subscribed_socket, zmq.POLLIN)
            beats = self._beats_due()
            timeout = self.clock.timeout(now, beats, self.follower.silence_at(now))
            try:
                ready = dict(poller.poll(timeout=wakeups.poll_ms(timeout)))
            except zmq.ZMQError as exc:
                if exc.errno == errno.EINTR:
                    ready = {}
                else:
                    raise
            now = time.time()
            if self.control.socket in ready:
                self.control.handle_ready(self._on_request)
            self.follower.read_heartbeats(now)   # queued beats, at every wakeup (see following.wake_socket)
            if self._wake_r in ready:
                self._drain_wake_pipe()
            self._handle_signals(now)
            self._handle_posted_events()
            if self.clock.read_pointer(now, beats):
                self.follower.refresh(now, self.hosted_head.record)
            self._watch_ray(now)
            self._check_handover(now)
            self._check_walltime(now)
            self.slurmd.check(now)
            self.follower.check_silent(now)
            self._feed(self.follower.seen(now))
            self._feed(Tick(now))
            # At its time, and at once when what it says changed (a drain, Ray down): no beat's wait.
            view = self._beat_view() if self._beats_due() else None
            if view is not None and (self.clock.beat(now, True) or self.publishing.changed(*view)):
                self.publishing.beat(*view)
            soon = self._status_soon.is_set()
            if soon or wakeups.due(now, self.clock.next_status, STATUS_SLACK):
                # Cleared before the status is taken: a request that comes
                # while it is written is served at the next turn. A prompt
                # status is a hosted head's new state (standby ready, dropped,
                # promoted): a fact the session acts on, so the node file is
                # written at once too, not at its next refresh.
                self._status_soon.clear()
                self._publish_status(force_session=soon)

    def _feed(self, event: Event) -> None:
        if self._exit_code is not None:
            return
        before = self.ctx
        self.ctx, actions = step(self.ctx, event)
        if self.ctx.state is not before.state:
            self.transitions.append({"at": round(self.ctx.since, 3), "from": before.state.value,
                                     "to": self.ctx.state.value, "reason": self.ctx.reason})
            self._log("state_changed", previous=before.state.value, reason=self.ctx.reason)
            self.history.transition(before.state, self.ctx.state, self.ctx.reason, head_job=self.ctx.head_job,
                                    ray_node_id=self.ctx.node_id, gpu_usage=self.gpus.usage())
        # Act first: a StopRay detaches the node at once, so what is published
        # for the new state no longer names the Ray processes being stopped.
        self._act(actions)
        if self.ctx.state is not before.state:
            self._publish_status(force_session=True)

    def _act(self, actions: list) -> None:
        for action in actions:
            if isinstance(action, StartRay):
                gen, old = self.local.supersede()
                if old is not None:  # the machine stops first; this only guards against a leak
                    self._work.put(lambda h=old: self.local.stop(h, False))
                self._work.put(lambda a=action, g=gen, j=self.ctx.head_job: self._start_ray(a.head_address, g, j))
            elif isinstance(action, StopRay):
                # A new generation cancels a start still in flight: it stops
                # the node it launched itself (see LocalRay.launch).
                _, handle = self.local.supersede()
                if handle is not None:
                    self._work.put(lambda h=handle, g=action.graceful: self.local.stop(h, g))
            elif isinstance(action, DrainRay):
                handle = self.local.ray
                if handle is not None:
                    self._work.put(lambda a=action, h=handle: self.local.drain(h, a))
            elif isinstance(action, PublishHead):
                self._publish_head()
            elif isinstance(action, Exit):
                # An agent serving the run's hosted head hands it over first.
                self._exit_code = self.hosted_head.exit_wanted(time.time(), action.code, self.ctx.drain_deadline,
                                                               self.session.read_ray_head)

    # ------------------------------------------------------------ observations
    def _check_handover(self, now: float) -> None:
        code = self.hosted_head.check_handover(now, self.follower.watch.job)
        if code is not None:
            self._exit_code = code

    def _serves_head(self) -> bool:
        return serves_head(self.o.role, self.o.job_id, self.follower.watch.job, self.hosted_head.record.ready)

    def _check_walltime(self, now: float) -> None:
        """The head drains itself ahead of its walltime when Slurm sends it no
        warning signal (``signal_drain.WalltimeWatch``)."""
        serves = self._serves_head()
        drain = self.walltime.check(now, serves, self.ctx.state is State.JOINED,
                                    self.allocation.signal_before_timeout is not None)
        if drain is not None:
            self._feed(drain)

    def _watch_ray(self, now: float) -> None:
        handle = self.local.ray
        if handle is not None and not handle.reported:
            rc = handle.node.poll_exit()
            if rc is not None:
                handle.reported = True
                self._feed(RayEnded(now, f"ray start exited with {rc}"))
            elif handle.raylet is not None and wakeups.raylet_check_due(now, self._next_raylet_check):
                self._next_raylet_check = now + wakeups.RAYLET_CHECK_SECONDS
                if not handle.raylet.alive():  # a drained raylet exits 0 while `ray start --block` stays up
                    handle.reported = True
                    self._feed(RayEnded(now, "the raylet ended"))
        own = self.ctx.head_job == self.o.job_id
        self.hosted_head.watch(now, joined_own_head=own and self.ctx.state is State.JOINED,
                               leaving=self.ctx.state in (State.DRAINING, State.LEFT, State.RELEASED))

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

    def _post_call(self, call: Callable[[], None]) -> None:
        """Have the loop run ``call``: how a helper thread changes loop-owned state."""
        self._events.put((None, call))
        self._wake()

    def _request_status(self) -> None:
        self._status_soon.set()
        self._wake()

    def _handle_posted_events(self) -> None:
        while True:
            try:
                generation, event = self._events.get_nowait()
            except queue.Empty:
                return
            if callable(event):
                event()
            elif generation is None or generation == self.local.generation:
                self._feed(event)
            # else: about a Ray node we have already replaced

    # ------------------------------------------------------------ control requests (agent.requests)
    def _on_request(self, envelope: Any) -> dict[str, Any]:
        return requests.answer(envelope.kind, envelope.body, time.time(), self._requests,
                               lambda kind: self._log("request", kind=kind))

    def _read_pointer_now(self) -> None:
        self.clock.read_pointer_soon()

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

    def _start_ray(self, head_address: str | None, generation: int, head_job: str | None = None) -> None:
        role = "head" if self.o.role == "head" else "worker"
        if role == "worker" and not self.rejoin.wait(head_job, lambda: self.local.current(generation)):
            return  # superseded while it waited its turn (agent.head.rejoin_order)
        own_head = role == "worker" and head_job == self.o.job_id
        if own_head and not join.hosted_head_registered(self.local, generation, self._log):
            return  # superseded while it waited for the head this node hosts
        # The head this node hosts was a standby: its warm worker is in that cluster already.
        event = self.hosted_head.worker.adopt(head_address, generation, lambda: not self.local.current(generation)) \
            if own_head else None
        event = event or join.start_and_join(self.local, head_address, generation, role, self.o.start_timeout, self._log)
        if event is not None:
            self._post(generation, event)

    def _drain_for_signal(self, signal_name: str) -> None:
        """On the signal's own thread: ask the scheduler why, then drain."""
        self._post(None, drain_for_signal(signal_name, self.info.scheduler, self.info.job_name, self.o.job_id,
                                          self._log))

    # ------------------------------------------------------------ head publishing
    def _beats_due(self) -> bool:
        return self.publishing.publisher is not None and (self.o.role == "head" or self.local.hosted is not None)

    def _beat_view(self) -> tuple[bool, bool]:
        """What a heartbeat says now: (the head's Ray serves, the head drains)."""
        if self.o.role == "head":
            return self.local.ray is not None and self.ctx.state in (State.JOINED, State.DRAINING), \
                self.ctx.state is State.DRAINING
        return self.hosted_head.heartbeat(self.ctx.state)

    def _publish_head(self) -> None:
        handle = self.local.ray
        if handle is not None and self.publishing.publisher is not None:
            self.publishing.publish_endpoint(handle)

    # ------------------------------------------------------------ status
    def _node_state(self) -> NodeState:
        """What this agent publishes: the session's node file, the node-local status file."""
        c = self.ctx
        handle = self.ray
        raylet = handle.raylet if handle is not None else None
        return NodeState(
            session=str(self.session.path), job_id=self.o.job_id, node=self.o.node,
            node_ip=self.o.node_ip, node_index=self.o.node_index, role=self.o.role,
            state=c.state, reason=c.reason, since=c.since,
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
            hosted_head=HostedHeadRecord.from_dict(self.hosted_state) if self.hosted_state else None,
            history=tuple(c.history[-5:]),
            handover_deadline=self._handover[1] if self._handover else None,
            transitions=tuple(Transition.from_dict(t) for t in list(self.transitions)[-20:]),
            exited=self._exit_code is not None, exit_code=self._exit_code, gpu_usage=self.gpus.usage(),
            oom_kills=self.oom.count())

    def _status(self) -> dict[str, Any]:
        """The node state as the control channel's ``status`` reply carries it."""
        return self._node_state().to_dict()

    def _publish_status(self, force_session: bool = False) -> None:
        self.clock.next_status = time.time() + REFRESH_SECONDS
        try:
            state = self._node_state()
            write_status(self.status_file, state)
            if not self._node_file.publish(state, time.time(), changed=force_session):
                self.clock.next_status = time.time() + WRITE_RETRY_SECONDS
        except (OSError, ValueError, UnsafePathError) as exc:  # ValueError: a state the record refuses; a bug
            log.warning("event=status_write_failed job=%s node=%s error=%s", self.o.job_id, self.o.node, exc)

    # ------------------------------------------------------------ shutdown
    def _shutdown(self) -> None:
        for handle in self.local.take_all():
            try:
                self.local.stop(handle, graceful=True)
            except Exception as exc:
                log.warning("event=stop_failed job=%s error=%s", self.o.job_id, exc)
        self.local.sweep()
        self.gone.wait()
        self._log("agent_exit", code=self._exit_code)
        self.gpus.stop()
        self.history.exited(self.ctx.state, self.ctx.reason, self._exit_code, self.gpus.usage())
        self._publish_status(force_session=True)
        self.follower.subscribe(None)
        self.control.close()
        self.publishing.close()
        signal.set_wakeup_fd(-1)

