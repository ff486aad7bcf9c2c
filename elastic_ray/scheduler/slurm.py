"""The Slurm scheduler: sbatch, squeue, scancel, scontrol and sacct.

Two halves, kept apart on purpose:

* Pure parsers, in ``scheduler/slurm_parse.py``: Slurm's output in, typed
  values out, tested exhaustively in ``tests/test_slurm_parsing.py``.
* :class:`SlurmScheduler`, here: a thin shell. Every command goes through
  :meth:`SlurmScheduler._call`: argv lists only (never a shell), a timeout on
  every call, failures raised as :class:`SchedulerError` with argv, return
  code and stderr, and a count of calls per command for tests and benchmarks.

Times: the queries run with ``TZ=UTC`` and ``SLURM_TIME_FORMAT=standard``, so
Slurm prints ISO timestamps in UTC whatever the user's locale and time zone
(a local time would be ambiguous for an hour every autumn). ``sbatch`` itself
keeps the user's TZ, because the job inherits the submitting environment.
"""

from __future__ import annotations

import collections
import logging
import os
import shlex
import subprocess
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from ..config.scheduler_choice import SchedulerKind
from ..config.slurm_values import check_job_id, check_job_name
from ..errors import SchedulerError
from .base import JobInfo, JobSpec, JobState, Scheduler, current_user
from .render import render_batch_script
from .slurm_parse import (
    ACCOUNTING_DISABLED,
    SACCT_FIELDS,
    STEP_FIELDS,
    USAGE_FIELDS,
    JobAccounting,
    parse_step_states,
    parse_usage_output,
    child_env,
    ended_unknown,
    normalise_signal,
    parse_sacct_output,
    parse_sbatch_parsable,
    parse_scontrol_job,
    parse_squeue_output,
    parse_test_only,
    only_gone_errors,
    scancel_ids_argv,
    scancel_name_argv,
    script_name_prefix,
    squeue_argv,
)

log = logging.getLogger(__name__)

# --------------------------------------------------------------------------
# The shell.

class SlurmScheduler(Scheduler):
    """:class:`Scheduler` on the Slurm command-line tools.

    ``slurm_conf`` sets ``SLURM_CONF`` for every command (the lab, or a
    second cluster); by default the commands find their config as usual.
    ``calls`` counts the commands run, by name (``calls["squeue"]``), so
    tests and benchmarks can check what a poll costs the controller.
    ``user`` is whose jobs queries list and cancels touch (default: this
    process's user, who is also the one sbatch submits as).
    """

    kind = SchedulerKind.SLURM

    #: Lookups of purged ids through ``scontrol`` per query; the rest go
    #: straight to sacct. A caller that keeps passing hundreds of ended ids
    #: must not turn each poll into hundreds of controller requests.
    MAX_SCONTROL_LOOKUPS = 10

    #: Ids per scancel call: one command line stays far below ARG_MAX.
    CANCEL_CHUNK = 500

    def __init__(self, slurm_conf: str | os.PathLike[str] | None = None, *, timeout: float = 60.0,
                 user: str | None = None):
        self.slurm_conf = None if slurm_conf is None else os.fspath(slurm_conf)
        self.user = user or current_user()
        self.timeout = timeout
        self.calls: collections.Counter[str] = collections.Counter()
        # None: not known yet; False once sacct said accounting is disabled.
        self._accounting: bool | None = None

    # -- the one place that runs Slurm commands -----------------------------

    def _call(self, argv: list[str], *, timeout: float | None = None, query: bool = True,
              stdin_text: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        """Run one Slurm command; raise :class:`SchedulerError` unless it exits 0."""
        argv = [str(a) for a in argv]
        command = os.path.basename(argv[0])
        self.calls[command] += 1
        limit = self.timeout if timeout is None else timeout
        shown = shlex.join(argv)
        try:
            proc = subprocess.run(
                argv, input=stdin_text, stdin=None if stdin_text is not None else subprocess.DEVNULL,
                capture_output=True, text=True, errors="replace", timeout=limit, cwd=cwd,
                env=child_env(os.environ, slurm_conf=self.slurm_conf, query=query))
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise SchedulerError(f"{shown} did not finish within {limit:g} s", argv=tuple(argv),
                                 stderr=stderr) from None
        except OSError as exc:
            raise SchedulerError(f"{shown} could not be started: {exc}", argv=tuple(argv)) from None
        if proc.returncode != 0:
            raise SchedulerError(f"{shown} failed with exit code {proc.returncode}: {proc.stderr.strip()}",
                                 argv=tuple(argv), returncode=proc.returncode, stderr=proc.stderr)
        return proc

    # -- submit / test ------------------------------------------------------

    def submit(self, spec: JobSpec) -> str:
        """Render, keep the script in ``spec.workdir`` and submit it.

        The script stays next to the run for whoever wants to see what was
        submitted (mode 0600: it may carry secrets from the launcher's env).
        sbatch runs in ``spec.workdir``, so a relative ``output`` is relative
        to it.
        """
        script = render_batch_script(spec)
        spec.workdir.mkdir(parents=True, exist_ok=True)
        fd, path = tempfile.mkstemp(prefix=script_name_prefix(spec.job_name, spec.role, time.time()),
                                    suffix=".sbatch", dir=spec.workdir)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(script)
        proc = self._call(["sbatch", "--parsable", path], query=False, cwd=spec.workdir)
        try:
            job_id = parse_sbatch_parsable(proc.stdout)
        except ValueError as exc:
            raise SchedulerError(f"sbatch accepted {path} but its answer is not a job id ({exc}); "
                                 f"the job, if queued, carries the comment {spec.comment or '(none)'}",
                                 argv=("sbatch", "--parsable", path), returncode=0,
                                 stderr=proc.stderr) from None
        log.info("event=submitted job_id=%s job_name=%s role=%s script=%s", job_id, spec.job_name,
                 spec.role, path)
        return job_id

    def test_only(self, spec: JobSpec) -> float:
        """Slurm's predicted start for ``spec`` (``sbatch --test-only``).

        The script goes to sbatch on stdin, so probing leaves no files behind.
        Note that every probe consumes a job id.
        """
        script = render_batch_script(spec)
        proc = self._call(["sbatch", "--test-only"], stdin_text=script)
        try:
            return parse_test_only(proc.stderr)
        except ValueError as exc:
            raise SchedulerError(str(exc), argv=("sbatch", "--test-only"), returncode=0,
                                 stderr=proc.stderr) from None

    # -- observe ------------------------------------------------------------

    def query(self, job_name: str, job_ids: Iterable[str] = (), *, user: str | None = None) -> dict[str, JobInfo]:
        """Every job named ``job_name`` of ``user``: ONE squeue call in the normal case.

        Ids in ``job_ids`` that squeue no longer lists (purged after
        MinJobAge) cost extra calls, once each, through
        :meth:`_resolve_missing`; they never raise.
        """
        check_job_name(job_name)
        wanted = [check_job_id(job_id) for job_id in job_ids]
        argv = squeue_argv(job_name, user or self.user)
        proc = self._call(argv)
        try:
            jobs = parse_squeue_output(proc.stdout)
        except ValueError as exc:
            raise SchedulerError(f"cannot read squeue's output: {exc}", argv=tuple(argv), returncode=0,
                                 stderr=proc.stderr) from None
        missing = [job_id for job_id in dict.fromkeys(wanted) if job_id not in jobs]
        if missing:
            jobs.update(self._resolve_missing(missing, job_name))
        return jobs

    def _resolve_missing(self, job_ids: list[str], job_name: str) -> dict[str, JobInfo]:
        """Ids squeue did not list: scontrol, then sacct, else ENDED_UNKNOWN.

        scontrol still knows a job that carries another name; sacct knows
        purged jobs when accounting is on. Any failure here means "unknown",
        never an exception: the caller asked about jobs that are gone.
        """
        found: dict[str, JobInfo] = {}
        for job_id in job_ids[: self.MAX_SCONTROL_LOOKUPS]:
            try:
                proc = self._call(["scontrol", "--oneliner", "show", "job", job_id])
                found[job_id] = parse_scontrol_job(proc.stdout, job_id, time.time())
            except (SchedulerError, ValueError) as exc:
                if "Invalid job id" not in str(exc):
                    log.warning("event=scontrol_lookup_failed job_id=%s error=%r", job_id, str(exc))
        rest = [job_id for job_id in job_ids if job_id not in found]
        if rest and self._accounting is not False:
            found.update(self._sacct(rest))
        for job_id in job_ids:
            if job_id not in found:
                log.info("event=job_record_gone job_id=%s job_name=%s state=ENDED_UNKNOWN", job_id, job_name)
                found[job_id] = ended_unknown(job_id, job_name)
        return found

    def _sacct_lines(self, fields: tuple[str, ...], job_ids: list[str], steps: bool = False) -> str | None:
        """``sacct -X -n -P`` of ``fields`` for these jobs (with their steps' lines too: without ``-X``):
        its stdout, or None when accounting is disabled (remembered: later calls ask no more).
        Any other failure raises SchedulerError."""
        argv = ["sacct", *(() if steps else ("-X",)), "--noheader", "--parsable2", f"--format={','.join(fields)}",
                f"--jobs={','.join(job_ids)}"]
        try:
            proc = self._call(argv)
        except SchedulerError as exc:
            if ACCOUNTING_DISABLED not in exc.stderr:
                raise
            proc = None
        if proc is None or ACCOUNTING_DISABLED in proc.stdout or ACCOUNTING_DISABLED in proc.stderr:
            if self._accounting is not False:
                log.info("event=accounting_disabled action=skip_sacct")
            self._accounting = False
            return None
        self._accounting = True
        return proc.stdout

    def _sacct(self, job_ids: list[str]) -> dict[str, JobInfo]:
        try:
            out = self._sacct_lines(SACCT_FIELDS, job_ids)
        except SchedulerError as exc:
            log.warning("event=sacct_failed job_ids=%s error=%r", ",".join(job_ids), str(exc))
            return {}
        if out is None:
            return {}
        try:
            return parse_sacct_output(out, job_ids)
        except ValueError as exc:
            log.warning("event=sacct_unreadable job_ids=%s error=%r", ",".join(job_ids), str(exc))
            return {}

    def accounting(self, job_ids: Iterable[str]) -> dict[str, JobAccounting] | None:
        """sacct's figures of these jobs (elapsed, nodes, GPUs, CPU time); None when accounting is off."""
        ids = [check_job_id(j) for j in job_ids]
        if self._accounting is False:
            return None
        if not ids:
            return {}
        out = self._sacct_lines(USAGE_FIELDS, ids, steps=True)   # the job's line sums its steps' CPU time
        return None if out is None else parse_usage_output(out, ids)

    def step_states(self, job_id: str, step_name: str) -> dict[str, JobState] | None:
        """sacct's states of the steps of ``job_id`` named ``step_name``; None when accounting is off.
        A step that ended a moment ago may not be listed yet (slurmdbd hears of it a little later)."""
        job_id = check_job_id(job_id)
        if self._accounting is False:
            return None
        out = self._sacct_lines(STEP_FIELDS, [job_id], steps=True)
        return None if out is None else parse_step_states(out, job_id, step_name)

    def end_time(self, job_id: str, job_name: str | None = None) -> float | None:
        """The job's end time (expected while it runs, actual once it ended).

        With ``job_name`` this is one :meth:`query`; without, the id is looked
        up alone (scontrol, then sacct).
        """
        job_id = check_job_id(job_id)
        if job_name is not None:
            return self.query(job_name, [job_id])[job_id].end_time
        return self._resolve_missing([job_id], "")[job_id].end_time

    # -- act ------------------------------------------------------------------

    # scancel's answers for a job that has already ended or been purged.
    _ALREADY_GONE = ("Invalid job id specified", "already completing or completed", "Job/step already")

    def cancel(self, job_id: str) -> None:
        job_id = check_job_id(job_id)
        try:
            self._call(["scancel", job_id])
        except SchedulerError as exc:
            if not any(text in exc.stderr for text in self._ALREADY_GONE):
                raise
            log.info("event=cancel_noop job_id=%s reason=%r", job_id, exc.stderr.strip())
            return
        log.info("event=cancelled job_id=%s", job_id)

    def cancel_jobs(self, job_ids: Iterable[str], *, user: str | None = None) -> None:
        """One scancel per :attr:`CANCEL_CHUNK` ids, filtered by ``user``.

        scancel reports an ended or purged id as an error line and exits 1
        after cancelling the rest; only other errors raise.
        """
        ids = list(dict.fromkeys(check_job_id(job_id) for job_id in job_ids))
        for start in range(0, len(ids), self.CANCEL_CHUNK):
            chunk = ids[start:start + self.CANCEL_CHUNK]
            try:
                self._call(scancel_ids_argv(chunk, user or self.user))
            except SchedulerError as exc:
                if not only_gone_errors(exc.stderr, self._ALREADY_GONE):
                    raise
                log.info("event=cancel_partly_noop job_ids=%s reason=%r", ",".join(chunk), exc.stderr.strip())
            log.info("event=cancelled job_ids=%s user=%s", ",".join(chunk), user or self.user)

    def cancel_by_name(self, job_name: str, *, user: str | None = None) -> None:
        check_job_name(job_name)
        self._call(scancel_name_argv(job_name, user or self.user))
        log.info("event=cancelled_by_name job_name=%s user=%s", job_name, user or self.user)

    def signal(self, job_id: str, signal_name: str, *, batch: bool = False) -> None:
        job_id = check_job_id(job_id)
        argv = ["scancel", f"--signal={normalise_signal(signal_name)}"]
        if batch:
            argv.append("--batch")
        self._call(argv + [job_id])
        log.info("event=signalled job_id=%s signal=%s batch=%s", job_id, argv[1].split("=", 1)[1], batch)
