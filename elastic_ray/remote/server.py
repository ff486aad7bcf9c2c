"""The cluster side of one SSH-mode call: ``python -m elastic_ray.remote.server``.

Reads one request line (:mod:`.wire`), runs it against the session
directory with an ordinary :class:`Session` (no supervision of its own: the
session's detached supervisor, :mod:`..coordinator.detached`, watches the head), and
writes the events back. It lives only as long as the call: every call opens
the session afresh, so a reconnecting client always sees the current state
and nothing lives in this process that a dropped connection could lose.

While a call runs, its stdin stays open; when it closes (the client was
killed, the laptop slept away the connection), a payload driver is stopped
by its PID and a wait is abandoned. Changes that are under way (an election,
a submission) are finished: they are journaled in the session directory and
the supervisor carries on from them anyway.
"""

from __future__ import annotations

import base64
import codecs
import logging
import os
import select
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

from .. import __version__, defaults, knobs
from . import wire
from ..coordinator import detached
from ..protocol.disk import paths

log = logging.getLogger(__name__)

READ_CHUNK = 65536
TOUCH_INTERVAL = 60.0  # s between notes that a long call's client is still there


class Reply:
    """The call's stdout: one writer at a time (payload output comes from two threads)."""

    def __init__(self, out: BinaryIO):
        self.out = out
        self.lock = threading.Lock()
        self._last_progress: str | None = None

    def send(self, event: Mapping[str, Any]) -> None:
        with self.lock:
            try:
                self.out.write(wire.encode(event))
                self.out.flush()
            except (BrokenPipeError, ValueError):
                pass  # the client is gone; the stdin watch ends the call

    def progress(self, message: str) -> None:
        """A wait's news; a repeat of the last one is not sent again."""
        if message != self._last_progress:
            self._last_progress = message
            self.send({"ev": "progress", "message": message})


def _session(args: Mapping[str, Any]):
    from ..coordinator.session import Session

    return Session.open(_path(args), supervise=False)


def _path(args: Mapping[str, Any]) -> Path:
    path = args.get("path")
    if not isinstance(path, str) or not path.startswith("/"):
        raise ValueError(f"path: {path!r} must be an absolute path on the cluster side")
    return Path(path)


def _head(head) -> dict[str, str] | None:
    return None if head is None else {"job_id": head.job_id, "address": head.address}


def _describe(session, args: Mapping[str, Any]) -> dict[str, Any]:
    """What a client learns on create/open; the session's supervisor runs from here on."""
    pid = detached.ensure_supervisor(session.path,
                                     float(args.get("supervise_interval", defaults.SUPERVISE_INTERVAL)),
                                     float(args.get("abandon_after", defaults.ABANDON_AFTER)))
    return {"path": str(session.path), "job_name": session.job_name, "info": session.info.to_dict(),
            "supervisor_pid": pid}


def op_hello(args: Mapping[str, Any], reply: Reply) -> Any:
    return {"version": __version__, "python": sys.executable, "schema": wire.SCHEMA}


def _create(args: Mapping[str, Any]):
    from ..config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
    from ..config.launcher import RayLauncher
    from ..coordinator.session import Session

    worker = args.get("worker_allocation")
    launcher = args.get("launcher")
    return Session.create(
        _path(args), head=SlurmRunAllocationConfig.from_dict(args["head"]), scheduler=args.get("scheduler"),
        launcher=None if launcher is None else RayLauncher.from_dict(launcher),
        ray_head_only=bool(args.get("ray_head_only", True)),
        worker_allocation=None if worker is None else SlurmWorkerAllocationConfig.from_dict(worker),
        job_name=args.get("job_name"), supervise=False)


def op_create(args: Mapping[str, Any], reply: Reply) -> Any:
    return _describe(_create(args), args)


def op_open_or_create(args: Mapping[str, Any], reply: Reply) -> Any:
    """The session at ``path``, created by the first caller of any client
    (a run's steps may arrive at once from several processes)."""
    from filelock import FileLock

    path = _path(args)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with FileLock(str(paths.creation_lock_file(path)), timeout=300):
        created = not paths.session_file(path).exists()
        session = _create(args) if created else _session(args)
    return {**_describe(session, args), "created": created}


def op_open(args: Mapping[str, Any], reply: Reply) -> Any:
    return _describe(_session(args), args)


def op_record(args: Mapping[str, Any], reply: Reply) -> Any:
    return _session(args).record().to_dict()


def op_head(args: Mapping[str, Any], reply: Reply) -> Any:
    return _head(_session(args).head)


def op_wait_for_head(args: Mapping[str, Any], reply: Reply) -> Any:
    return _session(args).wait_for_head(timeout=float(args.get("timeout", defaults.HEAD_WAIT_TIMEOUT)),
                                        progress=reply.progress)


def op_add_worker(args: Mapping[str, Any], reply: Reply) -> Any:
    from ..config import SlurmWorkerAllocationConfig

    session = _session(args)
    config = args.get("config")
    handle = session.add_worker_allocation(None if config is None else SlurmWorkerAllocationConfig.from_dict(config))
    return handle.job_id


def op_wait_worker(args: Mapping[str, Any], reply: Reply) -> Any:
    return _session(args).wait_for_worker_allocation(str(args["job_id"]),
                                                     timeout=float(args.get("timeout", defaults.WAIT_TIMEOUT)),
                                                     progress=reply.progress)


def op_remove_worker(args: Mapping[str, Any], reply: Reply) -> Any:
    return _session(args).remove_worker_allocation(str(args["job_id"]),
                                                   drain_timeout=float(args.get("drain_timeout",
                                                                                defaults.DRAIN_TIMEOUT)),
                                                   wait=bool(args.get("wait", True)), progress=reply.progress)


def op_drain_job(args: Mapping[str, Any], reply: Reply) -> Any:
    return _session(args).drain_job(str(args["job_id"]), float(args.get("drain_timeout", defaults.DRAIN_TIMEOUT)),
                                    str(args.get("reason", "request_drain")))


def op_autoscale(args: Mapping[str, Any], reply: Reply) -> Any:
    # Stored for the session's supervising processes: in this mode the detached supervisor runs it.
    _session(args).autoscale(args.get("policy"))
    return None


def op_worker_allocations(args: Mapping[str, Any], reply: Reply) -> Any:
    return [w.job_id for w in _session(args).worker_allocations]


def op_replace_head(args: Mapping[str, Any], reply: Reply) -> Any:
    return _head(_session(args).replace_head(timeout=float(args.get("timeout", defaults.WAIT_TIMEOUT)),
                                             progress=reply.progress))


def op_ready_head(args: Mapping[str, Any], reply: Reply) -> Any:
    from ..coordinator.head.ready import ready_head

    return _head(ready_head(_session(args), float(args.get("timeout", defaults.WAIT_TIMEOUT)), progress=reply.progress))


def op_head_is_lost(args: Mapping[str, Any], reply: Reply) -> Any:
    from ..coordinator.head.ready import head_is_lost

    return head_is_lost(_session(args))


def op_usage(args: Mapping[str, Any], reply: Reply) -> Any:
    """The run's figures from the session's own event log, its timeline page drawn next to it.

    Only the session's files are read (no ``Session.open``: a finished run's
    directory answers too, as ``elastic-ray session usage`` does)."""
    from ..errors import SessionDirError
    from ..history.summary import read_summary

    path = _path(args)
    if not paths.session_file(path).is_file():
        raise SessionDirError(f"{path}: not a session directory (it has no {paths.session_file(path).name})")
    return read_summary(path).to_dict()


def op_teardown(args: Mapping[str, Any], reply: Reply) -> Any:
    # The teardown stops the detached supervisor first (SessionJobs.teardown).
    return list(_session(args).teardown(list(args.get("extra") or []), wait=args.get("wait", False),
                                        timeout=args.get("timeout", defaults.TEARDOWN_TIMEOUT),
                                        progress=reply.progress))


def op_put_file(args: Mapping[str, Any], reply: Reply) -> Any:
    from ..atomic import atomic_write_bytes

    target = _path({"path": args.get("target")})
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    atomic_write_bytes(target, base64.b64decode(args["data"]), mode=int(args.get("mode", 0o600)))
    return str(target)


def _pump(stream: BinaryIO, fd: int, reply: Reply) -> None:
    """Forward a payload's output as it comes; a UTF-8 character split between reads stays whole."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    while chunk := stream.read1(READ_CHUNK) if hasattr(stream, "read1") else stream.read(READ_CHUNK):
        if text := decoder.decode(chunk):
            reply.send({"ev": "out", "fd": fd, "data": text})
    if text := decoder.decode(b"", final=True):
        reply.send({"ev": "out", "fd": fd, "data": text})


def _follow(path: Path, reply: Reply, done: threading.Event) -> None:
    """Forward a Pipes message file line by line until the driver ended and the file is read."""
    offset, partial = 0, b""
    while True:
        finished = done.is_set()
        try:
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
        except FileNotFoundError:
            data = b""
        offset += len(data)
        lines = (partial + data).split(b"\n")
        partial = lines.pop()
        for line in lines:
            if line.strip():
                reply.send({"ev": "pipes", "line": line.decode(errors="replace")})
        if finished:
            return
        done.wait(0.2)


def op_run(args: Mapping[str, Any], reply: Reply, client_gone: threading.Event) -> Any:
    from ..coordinator.handles import Head

    session = _session(args)
    argv, env = list(args["argv"]), dict(args.get("env") or {})
    expected = args.get("head")
    head = None if expected is None else Head(expected["job_id"], expected["address"], session)
    if args.get("pipes_path"):   # the payload appends its Pipes messages there
        Path(args["pipes_path"]).parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    driver = session.run(argv, env=env, head=head, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    reply.send({"ev": "started", "head_job": driver.head.job_id, "pid": driver.proc.pid})
    pumps = [threading.Thread(target=_pump, args=(s, fd, reply), daemon=True)
             for s, fd in ((driver.proc.stdout, 1), (driver.proc.stderr, 2))]
    ended = threading.Event()
    if args.get("pipes_path"):
        pumps.append(threading.Thread(target=_follow, args=(Path(args["pipes_path"]), reply, ended), daemon=True))
    for t in pumps:
        t.start()

    def stop_when_gone() -> None:
        client_gone.wait()
        if not ended.is_set():
            log.warning("event=remote_client_gone session=%s head=%s pid=%s action=stop_driver",
                        session.job_name, driver.head.job_id, driver.proc.pid)
            driver.stop()

    threading.Thread(target=stop_when_gone, daemon=True).start()
    timeout = args.get("timeout")
    try:
        result = driver.wait(timeout=None if timeout is None else float(timeout))
    finally:
        ended.set()
        for t in pumps:
            t.join(5.0)
    return {"returncode": result.returncode, "head_job": result.head_job, "seconds": result.seconds}


OPS: dict[str, Callable[[Mapping[str, Any], Reply], Any]] = {
    "hello": op_hello, "create": op_create, "open": op_open, "record": op_record, "head": op_head,
    "wait_for_head": op_wait_for_head, "add_worker": op_add_worker, "wait_worker": op_wait_worker,
    "remove_worker": op_remove_worker, "drain_job": op_drain_job, "worker_allocations": op_worker_allocations,
    "replace_head": op_replace_head, "teardown": op_teardown, "put_file": op_put_file,
    "open_or_create": op_open_or_create, "ready_head": op_ready_head, "head_is_lost": op_head_is_lost,
    "usage": op_usage, "autoscale": op_autoscale,
}
# Waits the client may abandon: nothing is under way that the client's absence changes.
ABANDONABLE = frozenset({"hello", "open", "record", "head", "wait_for_head", "wait_worker", "worker_allocations",
                         "ready_head", "head_is_lost", "usage"})


def _watch_stdin(fd: int, gone: threading.Event, op: str, session: Path | None,
                 silence: float = wire.CLIENT_SILENCE) -> None:
    """Raw reads (no buffered stdin shared with the main thread). The client
    writes a keep-alive byte every ``wire.KEEPALIVE`` s: end of file (killed
    client) or ``silence`` s without a byte (the network went away, which
    sshd may take hours to notice) means the client is gone. Meanwhile the
    session's abandonment clock is kept at now (a payload may run for days)."""
    last_touch = 0.0
    try:
        while True:
            ready, _, _ = select.select([fd], [], [], silence)
            if not ready or not os.read(fd, 4096):
                break
            if session is not None and time.monotonic() - last_touch > TOUCH_INTERVAL:
                last_touch = time.monotonic()
                detached.touch_last_call(session)
    except OSError:
        pass
    gone.set()
    if op in ABANDONABLE:
        os._exit(3)


def read_request_line(fd: int, limit: int = 64 << 20) -> bytes:
    """The first line of stdin, read byte-wise from the fd so nothing after it is buffered away."""
    data = bytearray()
    while len(data) < limit:
        chunk = os.read(fd, 1)
        if not chunk or chunk == b"\n":
            break
        data += chunk
    return bytes(data)


def serve(fd: int, stdout: BinaryIO) -> int:
    reply = Reply(stdout)
    line = read_request_line(fd)
    try:
        op, args = wire.parse_request(line, __version__)
        if op != "run" and op not in OPS:
            raise wire.ProtocolError(f"unknown op {op!r}")
        gone = threading.Event()
        session = Path(args["path"]) if isinstance(args.get("path"), str) else None
        if session is not None:
            detached.touch_last_call(session)
        threading.Thread(target=_watch_stdin, args=(fd, gone, op, session), daemon=True).start()
        value = op_run(args, reply, gone) if op == "run" else OPS[op](args, reply)
        reply.send({"ev": "result", "value": value})
        return 0
    except BaseException as exc:  # noqa: BLE001 - every error goes back to the caller
        reply.send(wire.error_event(exc, traceback.format_exc()))
        return 1


def main() -> int:
    logging.basicConfig(level=knobs.REMOTE_LOG.read(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    code = serve(sys.stdin.fileno(), sys.stdout.buffer)
    sys.stdout.flush()
    sys.stderr.flush()
    # No interpreter shutdown: daemon threads (the stdin watch, output pumps)
    # may still hold a stream, and there is nothing left to clean up.
    os._exit(code)


if __name__ == "__main__":
    main()
