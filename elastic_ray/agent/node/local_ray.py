"""The Ray nodes of this agent: launch (each in a fresh temp dir), stop, drain, sweep.

Three threads use this: the event loop orders starts and stops (taking the
node it stops out of ``ray`` at once), the effects thread launches, stops and
drains the node's Ray in order, and the hosted-head thread launches the
hosted head. Everything shared is guarded by ``lock``:

- ``generation``: bumped by every start and stop the loop orders, and at
  exit. A launch whose generation is no longer current was superseded: a stop
  must cancel a start still in flight, or the node it launches would outlive
  its agent. Whoever superseded it then holds the node (or it stops the node
  itself, when nobody held it yet).
- ``ray``: the node in use (worker, or the head role's head). Written under
  the lock by the loop (``supersede``) and by the effects thread (a launch);
  the loop reads a snapshot of it without the lock.
- ``hosted``: the hosted head's node. Written under the lock by the
  hosted-head thread (launch, and dropping a head that did not start) and by
  the loop at exit; the loop reads a snapshot.
- ``warm``: a worker node joined to this node's standby head ahead of need
  (``agent.head.standby_worker``). Written under the lock by the hosted-head
  thread (launch), by whoever drops it, and by the effects thread when the
  node's worker takes it over (``adopt_warm``).
- ``nodes``: every node ever launched, for the final sweep; ``_starts``
  numbers the temp dirs; ``stopping``: set once at exit, no launch after it.

A handle's ``raylet`` is set once by the launching thread after the start;
``reported`` belongs to the loop.
"""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import shutil
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import psutil

from ...config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from ...config.launcher import RayLauncher
from ...protocol.disk import paths
from . import gcs, simulation
from ..machine import DrainRay
from .proc_watch import ProcWatch
from .private_dirs import LEGACY_TEMP_ROOT, ensure_private_dir, remove_path, sweep_temp_roots, user_temp_root
from .health_check import head_health_env
from .ray_args import build_ray_start, choose_ports, slurm_cpus_on_node, worker_gpus
from .ray_memory import MemoryPlan, plan_memory, read_cgroup_limit, shm_free_bytes
from .ray_node import RayNode, free_port

log = logging.getLogger("elastic_ray.agent")

#: The warm worker's raylet starts one idle Python worker per CPU at its start,
#: assignable to any job: the relaunched driver's first tasks find them ready.
#: Each costs about 75 MiB RSS and a little CPU while idle (bench_run_cost), so
#: only on a node of at most WARM_PRESTART_MAX_CPUS CPUs; a bigger one starts
#: its worker processes when the first tasks come, as any node does.
WARM_WORKER_ENV = {"RAY_enable_worker_prestart": "1"}
WARM_PRESTART_MAX_CPUS = 8


@dataclass
class RayHandle:
    generation: int | None
    node: RayNode
    temp_dir: str
    address: str | None
    ports: dict[str, int] = field(default_factory=dict)
    raylet: ProcWatch | None = None
    reported: bool = False  # its end was already fed to the machine
    started: float = 0.0
    log_path: Path | None = None
    node_id: str | None = None  # a worker node's Ray id once joined (join.start_and_join)
    settled: threading.Event = field(default_factory=threading.Event)  # the warm worker: its start is over

    def ended(self) -> bool:
        """Its `ray start` exited, or its raylet did (a drained raylet exits while `ray start` stays)."""
        return self.node.poll_exit() is not None or (self.raylet is not None and not self.raylet.alive())


@dataclass(frozen=True)
class NodePlace:
    """Where this agent runs: what every `ray start` and temp dir is named after."""
    job_id: str
    node: str
    node_ip: str
    node_index: int
    session_id: str
    log_dir: Path


class LocalRay:
    def __init__(self, place: NodePlace, launcher: RayLauncher,
                 allocation: SlurmRunAllocationConfig | SlurmWorkerAllocationConfig, log: Callable[..., None],
                 token_path: str | None = None):
        self.place = place
        self.launcher = launcher
        self.allocation = allocation
        self.token_path = token_path
        self._log = log
        self.lock = threading.Lock()
        self.generation = 0
        self.ray: RayHandle | None = None
        self.hosted: RayHandle | None = None
        self.warm: RayHandle | None = None
        self.nodes: list[RayNode] = []
        self._starts = 0
        self._temp_dirs: list[str] = []
        self.stopping = False
        # Called after a worker node that had joined was stopped (the agent
        # reports it gone to the head: agent.head.node_gone); set once, before any start.
        self.on_stopped: Callable[[RayHandle], None] | None = None

    # ------------------------------------------------------------ orders (event loop)
    def supersede(self) -> tuple[int, RayHandle | None]:
        """A new generation: cancels a launch in flight and takes the node in use."""
        with self.lock:
            self.generation += 1
            handle, self.ray = self.ray, None
        return self.generation, handle

    def stop_launching(self) -> None:
        """At exit: no launch may start, and one in flight stops its node."""
        with self.lock:
            self.stopping = True
            self.generation += 1

    def current(self, generation: int | None) -> bool:
        """Is a launch of ``generation`` (None: the hosted head) still wanted?"""
        with self.lock:
            return not self.stopping and (generation is None or generation == self.generation)

    # ------------------------------------------------------------ effects (effects or hosted-head thread)
    def launch(self, head_address: str | None, generation: int | None, role: str, *,
               warm: bool = False) -> RayHandle | None:
        """Start `ray start` for ``role`` ("head" or "worker"); ``generation`` None
        is the hosted head, or with ``warm`` the worker joined to the standby head
        (see ``warm``). None if superseded (a node launched meanwhile is stopped)."""
        hosted = generation is None
        if not self.current(generation):
            return None  # superseded before it began (a stop or another start came first)
        p = self.place
        temp_dir = self._temp_dir("h" if role == "head" else "w")
        self._make_temp_dir(temp_dir)
        ports = choose_ports(self.launcher.port_strategy, p.job_id, role, free_port, head_port=self.launcher.head_port)
        labels = {"slurm.job-id": p.job_id, "slurm.node": p.node}
        alloc = self.allocation if isinstance(self.allocation, SlurmWorkerAllocationConfig) else None
        plan = self.memory_plan(role, hosted and not warm)
        exe = simulation.ray_executable()   # None: this environment's ray (a stand-in only in simulations)
        if role == "head":
            cmd = build_ray_start("head", job_id=p.job_id, node_ip=p.node_ip, temp_dir=temp_dir,
                                  launcher=self.launcher, ports=ports, memory_bytes=plan.memory,
                                  object_store_bytes=plan.object_store, labels=labels, token_path=self.token_path,
                                  ray_executable=exe)
            # The GCS's own detector, for nodes nobody reports gone (agent.node.health_check).
            cmd = replace(cmd, env={**head_health_env(os.environ, self.launcher.env), **cmd.env})
        else:
            cmd = build_ray_start(
                "worker", job_id=p.job_id, node_ip=p.node_ip, temp_dir=temp_dir, launcher=self.launcher,
                ports=ports, allocation=alloc, head_address=head_address,
                num_cpus=slurm_cpus_on_node(os.environ) or 1, num_gpus=worker_gpus(self.launcher, alloc),
                memory_bytes=plan.memory, object_store_bytes=plan.object_store, labels=labels,
                token_path=self.token_path, ray_executable=exe)
            if warm and (slurm_cpus_on_node(os.environ) or 1) <= WARM_PRESTART_MAX_CPUS:
                # Its worker processes up before a driver asks (see agent.head.standby_worker).
                cmd = replace(cmd, env={**cmd.env, **WARM_WORKER_ENV})
        self._log("ray_memory", role=role, hosted=hosted and not warm, grant=plan.grant, source=plan.source,
                  share=plan.share, memory=plan.memory, object_store=plan.object_store,
                  **({"standby_worker": True} if warm else {}))
        log_path = p.log_dir / paths.ray_log_name(p.job_id, p.node, role, hosted)   # warm: "worker-hosted"
        started = time.time()
        node = RayNode.start(cmd, log_path)
        address = head_address if role == "worker" else cmd.gcs_address
        handle = RayHandle(generation, node, temp_dir, address, dict(ports), started=started, log_path=log_path)
        with self.lock:
            self.nodes.append(node)
            superseded = self.stopping or (not hosted and generation != self.generation)
            if not superseded:
                if warm:
                    self.warm = handle
                elif hosted:
                    self.hosted = handle
                else:
                    self.ray = handle
        if superseded:
            # A stop (or the agent's exit) came while we were launching it:
            # nobody else holds this node, so it is ours to stop.
            self.stop(handle, graceful=False)
            return None
        return handle

    def memory_plan(self, role: str, hosted: bool) -> MemoryPlan:
        """This node's memory options from what Slurm (and the cgroup) granted.

        The first node of a worker allocation that may host an elected head
        splits its grant between that head and its own worker, from the
        worker's first start on (see :mod:`.ray_memory`).
        """
        alloc = self.allocation if isinstance(self.allocation, SlurmWorkerAllocationConfig) else None
        may_host = alloc is not None and self.place.node_index == 0 and self.launcher.can_host_elected_head
        share = "hosted_head" if hosted else "worker_beside_head" if may_host and role == "worker" else "whole"
        user_args = [*self.launcher.ray_start_args, *(alloc.ray_start_args if alloc and role == "worker" else ())]
        return plan_memory(os.environ, cgroup_limit=read_cgroup_limit(), shm_free=shm_free_bytes(),
                           launcher_object_store=self.launcher.object_store_memory, user_args=user_args,
                           share=share)

    def stop(self, handle: RayHandle, graceful: bool) -> None:
        report = handle.node.stop(grace=5.0) if graceful else handle.node.kill()
        self._log("ray_stopped", graceful=graceful, seconds=f"{report.seconds:.2f}",
                  killed=",".join(report.killed) or "-", **({"why_killed": "; ".join(report.why_killed)}
                                                            if report.why_killed else {}))
        # Ray's per-node files (sockets, spilled objects, its own logs) are
        # of no use once the node is gone; our log of `ray start` is kept.
        shutil.rmtree(handle.temp_dir, ignore_errors=True)
        if handle.node_id and self.on_stopped is not None:
            self.on_stopped(handle)

    def take_warm(self, handle: RayHandle | None = None) -> RayHandle | None:
        """Take the warm worker (only ``handle``, when given) out of ``warm``; its taker stops it."""
        with self.lock:
            taken = self.warm if handle is None or self.warm is handle else None
            if taken is not None:
                self.warm = None
        return taken

    def adopt_warm(self, handle: RayHandle, generation: int) -> bool:
        """The node's worker takes the warm worker as its own Ray node (a start of ``generation``)."""
        with self.lock:
            if self.stopping or generation != self.generation or self.warm is not handle:
                return False
            self.warm, self.ray = None, handle
            handle.generation = generation
        return True

    def kill_hosted(self, handle: RayHandle) -> None:
        """A hosted head that did not start: it serves nobody."""
        handle.node.kill()
        with self.lock:
            if self.hosted is handle:
                self.hosted = None

    def drain(self, handle: RayHandle, action: DrainRay) -> None:
        address = handle.address
        if address is None:
            return
        try:
            result = gcs.drain_node(address, action.node_id, reason="preemption", message=action.reason[:200],
                                    deadline_ms=int(action.deadline * 1000), timeout=20)
            self._log("drain_requested", accepted=result.accepted, message=result.message or "-")
        except gcs.ProbeError as exc:
            self._log("drain_failed", error=str(exc)[:200])

    # ------------------------------------------------------------ exit (event loop, after the effects thread ended)
    def take_all(self) -> list[RayHandle]:
        with self.lock:
            handles = [h for h in (self.ray, self.warm, self.hosted) if h is not None]
            self.ray = self.warm = self.hosted = None
        return handles

    def sweep(self) -> None:
        """Anything still running was started by us and missed by the stops
        (an effect that did not finish in time): it goes too."""
        with self.lock:
            nodes = list(self.nodes)
        for node in nodes:
            try:
                if node.members():
                    report = node.kill()
                    self._log("leftover_ray_killed", pid=node.pid, killed=",".join(report.killed) or "-")
            except Exception as exc:
                log.warning("event=sweep_failed job=%s pid=%s error=%s", self.place.job_id, node.pid, exc)
        # Every temp dir this agent made goes with it, also those of nodes
        # the stops missed (the stops remove their own already).
        with self.lock:
            temp_dirs = list(self._temp_dirs)
        for directory in temp_dirs:
            remove_path(directory)
        try:
            os.rmdir(self.temp_root())     # only if no other job of the session still uses it
        except OSError:
            pass

    # ------------------------------------------------------------ temp dirs
    def temp_root(self) -> str:
        # Short on purpose: Ray puts Unix sockets under it (107-byte limit).
        # Per user (see private_dirs): on a shared node, another user's agent
        # must neither lock us out of it nor read or plant anything in it.
        # The session id keeps two runs whose job ids coincide (two local
        # clusters both start at job 1) apart.
        return f"{user_temp_root()}/{self.place.session_id[:8]}"

    def prepare(self) -> None:
        """Check (and make) this user's private temp root; UnsafePathError if
        it is not ours alone. Called at the agent's start, so a refused
        directory stops the agent with a clear error before any Ray starts."""
        ensure_private_dir(user_temp_root())
        ensure_private_dir(self.temp_root())

    def _make_temp_dir(self, temp_dir: str) -> None:
        with self.lock:
            self._temp_dirs.append(temp_dir)
        for attempt in (1, 2):
            self.prepare()
            try:
                os.mkdir(temp_dir, 0o700)
                return
            except FileExistsError:
                return   # a dir left by an earlier agent of this job; remove_stale_temp_dirs spared it as in use
            except FileNotFoundError:
                # The session's folder went between the check and the mkdir
                # (the last agent of another job of this session left): again.
                if attempt == 2:
                    raise

    def _temp_dir(self, suffix: str) -> str:
        """A fresh directory for every start of a Ray node.

        Never reused: the agent finds its node id in the GCS by the raylet's
        socket path under this directory, and right after a crash the GCS
        still lists the dead incarnation ALIVE (until its health check fails,
        about 15 s). A restart in the same directory was measured to "join"
        in 0.5 s under the dead node's id; later drains then went to the dead
        node while the live one kept running.
        """
        with self.lock:
            self._starts += 1
            number = self._starts
        return f"{self.temp_root()}/{self.place.job_id}.{self.place.node_index}{suffix}{number}"

    def remove_stale_temp_dirs(self) -> None:
        """Remove temp dirs an earlier agent of this job and node left behind
        (killed before it could clean up, or a requeued job), unless a live
        process still names them; then those of any ended run of this user
        on this node (see ``private_dirs.stale_temp_dirs``), in this user's
        root and in the root older versions shared."""
        try:
            self._remove_own_stale_temp_dirs()
            for path in sweep_temp_roots([user_temp_root(), LEGACY_TEMP_ROOT]):
                self._log("stale_temp_dir_removed", path=path)
        except Exception as exc:   # housekeeping must never stop the agent
            log.warning("event=temp_sweep_failed job=%s error=%s", self.place.job_id, exc)
        with contextlib.suppress(OSError):
            os.rmdir(LEGACY_TEMP_ROOT)    # gone once no user's dirs are left in it

    def _remove_own_stale_temp_dirs(self) -> None:
        mine = glob.glob(f"{self.temp_root()}/{self.place.job_id}.{self.place.node_index}[hw]*")
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
