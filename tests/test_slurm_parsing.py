"""Slurm's output, parsed: every state, every time form, every host-list form.

The inputs are the forms Slurm 22.05 prints (seen on the lab; see
notes/slurm-in-this-sandbox.md), plus malformed text. A malformed input must
give a clear ValueError that quotes it, or ENDED_UNKNOWN where the interface
promises that, never an unrelated crash.

The last section drives :class:`SlurmScheduler`'s query fallbacks with
scripted command answers (the purge after MinJobAge takes 10 minutes on the
lab, so the decision logic is checked here and the real commands in
integration/test_slurm_scheduler.py).
"""

from __future__ import annotations

import calendar

import pytest

from elastic_ray.errors import SchedulerError
from elastic_ray.scheduler.base import JobState
from elastic_ray.config.slurm_values import MAX_HOSTS, expand_hostlist
from elastic_ray.scheduler.slurm import SlurmScheduler
from elastic_ray.scheduler.slurm_parse import (
    FIELD_SEP,
    SQUEUE_FIELDS,
    SQUEUE_FORMAT,
    child_env,
    ended_unknown,
    parse_sacct_output,
    parse_sbatch_parsable,
    parse_scontrol_fields,
    parse_scontrol_job,
    parse_slurm_timestamp,
    parse_squeue_line,
    parse_squeue_output,
    parse_test_only,
    parse_time_left,
    script_name_prefix,
)
from elastic_ray.scheduler.states import (
    SLURM_STATES,
    UNKNOWN_STATE_FALLBACK,
    is_known_state,
    normalise_state_name,
    translate_state,
)


def epoch(text: str) -> float:
    return float(calendar.timegm(tuple(int(x) for x in text.replace("T", "-").replace(":", "-").split("-"))
                                 + (0, 0, 0)))


# ----------------------------------------------------------------- states

STATE_TABLE = [
    # (long name, short code, JobState)
    ("PENDING", "PD", JobState.PENDING),
    ("CONFIGURING", "CF", JobState.PENDING),
    ("REQUEUED", "RQ", JobState.PENDING),
    ("REQUEUE_FED", "RF", JobState.PENDING),
    ("REQUEUE_HOLD", "RH", JobState.PENDING),
    ("SPECIAL_EXIT", "SE", JobState.PENDING),
    ("RESV_DEL_HOLD", "RD", JobState.PENDING),
    ("RUNNING", "R", JobState.RUNNING),
    ("RESIZING", "RS", JobState.RUNNING),
    ("SIGNALING", "SI", JobState.RUNNING),
    ("SUSPENDED", "S", JobState.SUSPENDED),
    ("STOPPED", "ST", JobState.SUSPENDED),
    ("COMPLETING", "CG", JobState.COMPLETING),
    ("STAGE_OUT", "SO", JobState.COMPLETING),
    ("COMPLETED", "CD", JobState.COMPLETED),
    ("CANCELLED", "CA", JobState.CANCELLED),
    ("FAILED", "F", JobState.FAILED),
    ("TIMEOUT", "TO", JobState.TIMEOUT),
    ("NODE_FAIL", "NF", JobState.NODE_FAIL),
    ("PREEMPTED", "PR", JobState.PREEMPTED),
    ("OUT_OF_MEMORY", "OOM", JobState.OUT_OF_MEMORY),
    ("BOOT_FAIL", "BF", JobState.BOOT_FAIL),
    ("DEADLINE", "DL", JobState.DEADLINE),
    ("REVOKED", "RV", JobState.CANCELLED),
]


@pytest.mark.parametrize("long,short,state", STATE_TABLE)
def test_state_table_row(long, short, state):
    assert translate_state(long) is state
    assert translate_state(short) is state
    assert is_known_state(long) and is_known_state(short)


def test_state_table_has_no_row_the_tests_do_not_pin():
    pinned = {long for long, _, _ in STATE_TABLE} | {short for _, short, _ in STATE_TABLE}
    assert set(SLURM_STATES) == pinned


@pytest.mark.parametrize("state", [JobState.PENDING, JobState.RUNNING, JobState.COMPLETING, JobState.SUSPENDED])
def test_active_states_stay_active(state):
    assert state.is_active


@pytest.mark.parametrize("raw,state", [
    ("CANCELLED by 0", JobState.CANCELLED),      # sacct / scontrol add who cancelled
    ("CANCELLED by 1000", JobState.CANCELLED),
    ("  running  ", JobState.RUNNING),           # blanks and case do not matter
    ("OUT_OF_ME+", UNKNOWN_STATE_FALLBACK),      # sacct cut the name: unknown, not a guess
    ("CANCELLED+", JobState.CANCELLED),
    ("", UNKNOWN_STATE_FALLBACK),
    ("EXPEDITING", UNKNOWN_STATE_FALLBACK),      # a state from some future Slurm
    ("\x00garbage\n", UNKNOWN_STATE_FALLBACK),
])
def test_state_spellings_and_fallback(raw, state):
    assert translate_state(raw) is state


def test_unknown_states_fall_back_to_an_active_state():
    # Abandoning a job whose state we cannot read could leak its nodes.
    assert UNKNOWN_STATE_FALLBACK.is_active
    assert not is_known_state("EXPEDITING")


def test_normalise_state_name():
    assert normalise_state_name("cancelled by 0") == "CANCELLED"
    assert normalise_state_name("   ") == ""


# ----------------------------------------------------------------- sbatch --parsable

@pytest.mark.parametrize("stdout,job_id", [("12345\n", "12345"), ("12345;lab\n", "12345"), ("7", "7"),
                                           ("\n42\n\n", "42"), ("42;my-cluster.x\n", "42")])
def test_sbatch_parsable(stdout, job_id):
    assert parse_sbatch_parsable(stdout) == job_id


@pytest.mark.parametrize("stdout", ["", "\n", "Submitted batch job 12", "12 13", "12\n13\n", "12;", "-1",
                                    "12;lab;x", "1e5", "12;bad cluster", "\u0661\u0662\n", "\u0664\u0662;lab",
                                    "1" * 21])
def test_sbatch_parsable_refuses_anything_else(stdout):
    with pytest.raises(ValueError, match="sbatch --parsable"):
        parse_sbatch_parsable(stdout)


# ----------------------------------------------------------------- times

@pytest.mark.parametrize("text,expected", [
    ("2026-11-29T23:59:59", epoch("2026-11-29T23:59:59")),
    ("1970-01-01T00:00:00", 0.0),
    (" 2026-03-29T01:30:00 ", epoch("2026-03-29T01:30:00")),
    ("N/A", None), ("Unknown", None), ("None", None), ("NONE", None), ("", None), ("(null)", None),
])
def test_slurm_timestamp(text, expected):
    assert parse_slurm_timestamp(text) == expected


@pytest.mark.parametrize("text", ["2026-11-29 23:59:59", "2026-13-01T00:00:00", "2026-02-30T00:00:00",
                                  "Sun Nov 29 23:59", "1732924799", "2026-11-29T23:59", "tomorrow",
                                  "2026-11-29T23:59:59\nx", "\u0662\u0660\u0662\u0666-11-29T23:59:59",
                                  "2026-11-29T23:59:\u0665\u0669"])
def test_slurm_timestamp_refuses_other_forms(text):
    with pytest.raises(ValueError, match="timestamp|date"):
        parse_slurm_timestamp(text)


@pytest.mark.parametrize("text,seconds", [
    ("1-02:03:04", 86400 + 2 * 3600 + 3 * 60 + 4), ("0-00:00:01", 1), ("12-23:59:59", 12 * 86400 + 86399),
    ("2:03:04", 2 * 3600 + 184), ("100:00:00", 360000), ("3:04", 184), ("0:00", 0), ("59:59", 3599),
    ("123:45", 123 * 60 + 45),
    ("UNLIMITED", None), ("INVALID", None), ("NOT_SET", None), ("N/A", None), ("unlimited", None),
])
def test_time_left(text, seconds):
    assert parse_time_left(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "1-2", "1-02:03", "3:4", "1:60", "1:60:00", "1-24:00:00",
                                  "-1:00", "1:00:00:00", "abc", "1-02:03:04x", "3:04\n5",
                                  "\u0663:\u0660\u0664", "1-02:03:\u0660\u0664"])
def test_time_left_refuses_other_forms(text):
    with pytest.raises(ValueError, match="time left"):
        parse_time_left(text)


# ----------------------------------------------------------------- host lists

@pytest.mark.parametrize("text,hosts", [
    ("cpu-[1-2],gpua-1", ("cpu-1", "cpu-2", "gpua-1")),
    ("gpua-1", ("gpua-1",)),
    ("node[01-03,07]", ("node01", "node02", "node03", "node07")),
    ("node[8-11]", ("node8", "node9", "node10", "node11")),
    ("node[098-101]", ("node098", "node099", "node100", "node101")),
    ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    ("node[1-2]-ib", ("node1-ib", "node2-ib")),
    ("a[3],b", ("a3", "b")),
    ("a,b,c", ("a", "b", "c")),
    ("host.example.org", ("host.example.org",)),
    ("", ()), ("  ", ()), ("(null)", ()), ("None assigned", ()),
])
def test_hostlist_expansion(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["cpu-[1-2", "cpu-1-2]", "cpu-[[1-2]]", "cpu-[2-1]", "cpu-[a-b]", "cpu-[]",
                                  "cpu-[1-]", "a,,b", ",a", "a b", f"n[1-{MAX_HOSTS + 1}]",
                                  "a[1-1000]b[1-1000]", "cpu-[\u0661-\u0662]", "cpu-[1-2]\n[3]"])
def test_hostlist_refuses_malformed_lists(text):
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(text)


# ----------------------------------------------------------------- squeue

def squeue_line(**fields: str) -> str:
    base = dict(job_id="7", name="er-x", state="RUNNING", partition="cpu", nodes="cpu-[1-2]",
                submit_time="2026-11-29T23:57:12", start_time="2026-11-29T23:57:13",
                end_time="2026-11-30T00:02:13", time_left="4:58", user="alice", comment="(null)",
                reason="None")
    base.update(fields)
    return FIELD_SEP.join(base[name] for name, _ in SQUEUE_FIELDS)


def test_squeue_format_asks_for_every_field_in_order():
    assert SQUEUE_FORMAT.split(FIELD_SEP) == ["%A", "%j", "%T", "%P", "%N", "%V", "%S", "%e", "%L", "%u", "%k",
                                                "%r"]


def test_squeue_running_job():
    info = parse_squeue_line(squeue_line())
    assert info.job_id == "7" and info.name == "er-x" and info.state is JobState.RUNNING
    assert info.raw_state == "RUNNING" and info.partition == "cpu" and info.reason == "None"
    assert info.nodes == ("cpu-1", "cpu-2")
    assert info.submit_time == epoch("2026-11-29T23:57:12")
    assert info.start_time == epoch("2026-11-29T23:57:13")
    assert info.end_time == epoch("2026-11-30T00:02:13")
    assert info.time_left == 298


def test_squeue_pending_job_has_no_predicted_times():
    # squeue fills start/end of a pending job with predictions; JobInfo does not.
    info = parse_squeue_line(squeue_line(state="PENDING", nodes="", start_time="2026-11-30T00:57:12",
                                         end_time="2026-11-30T01:00:12", time_left="3:00", reason="BeginTime"))
    assert info.state is JobState.PENDING and info.nodes == ()
    assert info.start_time is None and info.end_time is None and info.time_left is None
    assert info.submit_time is not None and info.reason == "BeginTime"


def test_squeue_unlimited_running_job():
    info = parse_squeue_line(squeue_line(end_time="NONE", time_left="UNLIMITED"))
    assert info.end_time is None and info.time_left is None


def test_squeue_ended_job_reports_no_time_left():
    info = parse_squeue_line(squeue_line(state="CANCELLED", end_time="2026-11-29T23:57:15"))
    assert info.state is JobState.CANCELLED and info.time_left is None
    assert info.end_time == epoch("2026-11-29T23:57:15")


def test_squeue_reason_may_contain_anything_but_a_newline():
    info = parse_squeue_line(squeue_line(reason=f"launch failed{FIELD_SEP}requeued | held"))
    assert info.reason == f"launch failed{FIELD_SEP}requeued | held"


def test_squeue_unknown_state_is_kept_raw():
    info = parse_squeue_line(squeue_line(state="EXPEDITING"))
    assert info.state is UNKNOWN_STATE_FALLBACK and info.raw_state == "EXPEDITING"


@pytest.mark.parametrize("line,match", [
    ("7|er-x|RUNNING", "expected 12 fields"),
    ("", "expected 12 fields"),
    (squeue_line(job_id="7_1"), "bad job id"),
    (squeue_line(job_id=""), "bad job id"),
    (squeue_line(job_id="\u0667"), "bad job id"),
    (squeue_line(job_id="1" * 21), "bad job id"),
    (squeue_line(time_left="\u0663:\u0660\u0664"), "time left"),
    (squeue_line(nodes="cpu-[1-"), "host list"),
    (squeue_line(start_time="yesterday"), "timestamp"),
    (squeue_line(time_left="soon"), "time left"),
])
def test_squeue_malformed_line_names_the_line(line, match):
    with pytest.raises(ValueError, match=match):
        parse_squeue_line(line)


def test_squeue_output_keys_by_id_and_skips_blank_lines():
    out = "\n".join([squeue_line(job_id="7"), "", squeue_line(job_id="8", state="PENDING", nodes=""), ""])
    jobs = parse_squeue_output(out)
    assert sorted(jobs) == ["7", "8"] and jobs["8"].state is JobState.PENDING
    assert parse_squeue_output("") == {}


# ----------------------------------------------------------------- scontrol

SCONTROL_LINE = (
    "JobId=7 JobName=er-probe-1 UserId=root(0) GroupId=root(0) MCS_label=N/A Priority=4294901753 Nice=0 "
    "Account=(null) QOS=(null) JobState=CANCELLED Reason=None Dependency=(null) Requeue=1 Restarts=0 "
    "BatchFlag=1 Reboot=0 ExitCode=0:15 RunTime=00:00:02 TimeLimit=00:05:00 TimeMin=N/A "
    "SubmitTime=2026-11-29T23:57:12 EligibleTime=2026-11-29T23:57:12 AccrueTime=2026-11-29T23:57:12 "
    "StartTime=2026-11-29T23:57:13 EndTime=2026-11-29T23:57:15 Deadline=N/A SuspendTime=None "
    "SecsPreSuspend=0 LastSchedEval=2026-11-29T23:57:13 Scheduler=Main Partition=cpu "
    "AllocNode:Sid=localhost:3524 ReqNodeList=(null) ExcNodeList=(null) NodeList=cpu-[1-2] BatchHost=cpu-1 "
    "NumNodes=2 NumCPUs=2 NumTasks=2 CPUs/Task=1 ReqB:S:C:T=0:0:*:* TRES=cpu=2,mem=512M,node=2,billing=2 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=* MinCPUsNode=1 MinMemoryCPU=256M MinTmpDiskNode=0 "
    "Features=(null) DelayBoot=00:00:00 OverSubscribe=OK Contiguous=0 Licenses=(null) Network=(null) "
    "Command=(null) WorkDir=/work/main/.lab/test-work/probe StdErr=/x/probe-7.out StdIn=/dev/null "
    "StdOut=/x/probe-7.out Power= "
)


def test_scontrol_fields_keep_values_with_blanks_and_equals_signs():
    fields = parse_scontrol_fields("JobId=3 Reason=launch failed requeued held TRES=cpu=2,node=1 Power= ")
    assert fields == {"JobId": "3", "Reason": "launch failed requeued held", "TRES": "cpu=2,node=1",
                      "Power": ""}
    assert parse_scontrol_fields(SCONTROL_LINE)["AllocNode:Sid"] == "localhost:3524"


def test_scontrol_ended_job():
    info = parse_scontrol_job(SCONTROL_LINE + "\n", "7", now=0.0)
    assert info.state is JobState.CANCELLED and info.name == "er-probe-1" and info.partition == "cpu"
    assert info.nodes == ("cpu-1", "cpu-2") and info.time_left is None
    assert info.end_time == epoch("2026-11-29T23:57:15")


def test_scontrol_running_job_time_left_comes_from_the_end_time():
    line = SCONTROL_LINE.replace("JobState=CANCELLED", "JobState=RUNNING")
    now = epoch("2026-11-29T23:57:05")
    assert parse_scontrol_job(line, "7", now=now).time_left == 10.0
    assert parse_scontrol_job(line, "7", now=now + 60).time_left == 0.0


def test_scontrol_pending_job_has_no_nodes():
    line = SCONTROL_LINE.replace("JobState=CANCELLED", "JobState=PENDING").replace("NodeList=cpu-[1-2]",
                                                                                   "NodeList=(null)")
    info = parse_scontrol_job(line, "7", now=0.0)
    assert info.state is JobState.PENDING and info.nodes == () and info.start_time is None


@pytest.mark.parametrize("text", ["", "JobId=8 JobState=RUNNING", "JobId=7 JobName=x", "garbage"])
def test_scontrol_without_the_job_or_its_state_is_an_error(text):
    with pytest.raises(ValueError, match="job 7|JobState"):
        parse_scontrol_job(text, "7", now=0.0)


# ----------------------------------------------------------------- sacct

def test_sacct_rows_for_the_wanted_ids():
    out = ("7|CANCELLED by 0|cpu|cpu-[1-2]|2026-11-29T23:57:12|2026-11-29T23:57:13|2026-11-29T23:57:15|er|x\n"
           "8|PENDING|gpu-b|None assigned|2026-11-29T23:57:12|Unknown|Unknown|er\n"
           "9|COMPLETED|cpu|cpu-1|2026-11-29T23:57:12|2026-11-29T23:57:13|2026-11-29T23:57:14|other\n")
    jobs = parse_sacct_output(out, ["7", "8"])
    assert sorted(jobs) == ["7", "8"]
    assert jobs["7"].state is JobState.CANCELLED and jobs["7"].raw_state == "CANCELLED by 0"
    assert jobs["7"].name == "er|x" and jobs["7"].nodes == ("cpu-1", "cpu-2")
    assert jobs["8"].state is JobState.PENDING and jobs["8"].nodes == () and jobs["8"].start_time is None


def test_sacct_malformed_row_is_an_error():
    with pytest.raises(ValueError, match="sacct"):
        parse_sacct_output("7|COMPLETED|cpu\n", ["7"])


# ----------------------------------------------------------------- sbatch --test-only

def test_test_only_start_time():
    stderr = ("sbatch: warning: something harmless\n"
              "sbatch: Job 42 to start at 2026-11-29T23:59:59 using 2 processors on nodes gpua-1 in "
              "partition gpu-a\n")
    assert parse_test_only(stderr) == epoch("2026-11-29T23:59:59")


@pytest.mark.parametrize("stderr", ["", "sbatch: error: Batch job submission failed: Requested node "
                                        "configuration is not available",
                                    "sbatch: Job 42 to start at soon using 1 processors",
                                    "sbatch: Job 42 to start at N/A using 1 processors",
                                    "sbatch: Job \u0664\u0662 to start at 2026-11-29T23:59:59 using 1 processors"])
def test_test_only_without_a_start_is_an_error(stderr):
    with pytest.raises(ValueError):
        parse_test_only(stderr)


# ----------------------------------------------------------------- small checks

# Job ids and signal names are read by config/slurm_values.py, the one
# vocabulary, and tested there (tests/test_slurm_values.py). Here: the
# scheduler refuses them before any Slurm command runs.

@pytest.mark.parametrize("call", [
    lambda s: s.cancel("7_1"), lambda s: s.cancel("--all"), lambda s: s.cancel("12\n"),
    lambda s: s.cancel("\u0661\u0662"), lambda s: s.signal("8\n", "TERM"), lambda s: s.end_time("-1"),
    lambda s: s.query("er-x", ["12 13"]), lambda s: s.query("er-x", [12]),
])
def test_bad_job_ids_never_reach_a_slurm_command(call):
    slurm = ScriptedSlurm({})
    with pytest.raises(ValueError, match="job_id"):
        call(slurm)
    assert slurm.argvs == []


@pytest.mark.parametrize("name", ["", "SIGFOO", "TERM@30", "99", "B:TERM", "TERM;ls", "\u0967\u096b", None, True])
def test_bad_signals_never_reach_scancel(name):
    slurm = ScriptedSlurm({})
    with pytest.raises(ValueError, match="signal"):
        slurm.signal("8", name)
    assert slurm.argvs == []


@pytest.mark.parametrize("name,sent", [("TERM", "TERM"), ("SIGTERM", "TERM"), ("usr1", "USR1"), ("15", "TERM"),
                                       (10, "USR1"), (" SIGINT ", "INT"), ("IOT", "ABRT")])
def test_signals_reach_scancel_by_their_canonical_name(name, sent):
    slurm = ScriptedSlurm({"scancel": lambda argv: ("", "", 0)})
    slurm.signal("8", name)
    assert slurm.argvs == [["scancel", f"--signal={sent}", "8"]]


def test_child_env_drops_client_settings_and_pins_time_format():
    base = {"PATH": "/bin", "SQUEUE_PARTITION": "cpu", "SCANCEL_INTERACTIVE": "1", "SLURM_JOB_ID": "5",
            "SLURM_MEM_PER_CPU": "100", "SLURM_CONF": "/etc/x.conf", "SBATCH_ACCOUNT": "proj", "TZ": "Europe/Berlin",
            "SLURM_TIME_FORMAT": "relative"}
    env = child_env(base, slurm_conf=None, query=True)
    assert env == {"PATH": "/bin", "SLURM_CONF": "/etc/x.conf", "SBATCH_ACCOUNT": "proj", "TZ": "UTC",
                   "SLURM_TIME_FORMAT": "standard"}
    submit = child_env(base, slurm_conf="/lab/slurm.conf", query=False)
    assert submit == {"PATH": "/bin", "SLURM_CONF": "/lab/slurm.conf", "SBATCH_ACCOUNT": "proj",
                      "TZ": "Europe/Berlin"}


def test_script_name_prefix():
    assert script_name_prefix("er-x", "worker", 0.0) == "er-x-worker-19700101T000000Z-"


# ----------------------------------------------------------------- query fallbacks, scripted

class ScriptedSlurm(SlurmScheduler):
    """SlurmScheduler whose commands answer from a script instead of Slurm."""

    def __init__(self, answers):
        super().__init__()
        self.answers = answers  # command -> callable(argv) -> (stdout, stderr, rc)
        self.argvs: list[list[str]] = []

    def _call(self, argv, **kwargs):
        import subprocess
        self.calls[argv[0]] += 1
        self.argvs.append(list(argv))
        stdout, stderr, rc = self.answers[argv[0]](argv)
        if rc:
            raise SchedulerError(f"{argv[0]} failed: {stderr}", argv=tuple(argv), returncode=rc, stderr=stderr)
        return subprocess.CompletedProcess(argv, rc, stdout, stderr)


def squeue_answer(*lines):
    return lambda argv: ("\n".join(lines) + "\n", "", 0)


INVALID = ("", "slurm_load_jobs error: Invalid job id specified\n", 1)


def test_query_is_one_squeue_call_when_every_job_is_listed():
    lines = [squeue_line(job_id=str(i)) for i in range(1, 21)]
    slurm = ScriptedSlurm({"squeue": squeue_answer(*lines)})
    jobs = slurm.query("er-x", [str(i) for i in range(1, 21)])
    assert len(jobs) == 20 and dict(slurm.calls) == {"squeue": 1}
    assert slurm.argvs[0] == ["squeue", "--name=er-x", f"--user={slurm.user}", "--states=all", "--noheader",
                              f"--format={SQUEUE_FORMAT}"]


def test_purged_job_without_accounting_is_ended_unknown_and_sacct_is_asked_once():
    slurm = ScriptedSlurm({"squeue": squeue_answer(squeue_line(job_id="7")),
                           "scontrol": lambda argv: INVALID,
                           "sacct": lambda argv: ("", "Slurm accounting storage is disabled\n", 1)})
    jobs = slurm.query("er-x", ["7", "999999"])
    assert jobs["7"].state is JobState.RUNNING
    assert jobs["999999"] == ended_unknown("999999", "er-x")
    slurm.query("er-x", ["7", "999999"])
    assert dict(slurm.calls) == {"squeue": 2, "scontrol": 2, "sacct": 1}


def test_accounting_disabled_on_stdout_with_exit_0_is_understood_too():
    slurm = ScriptedSlurm({"squeue": squeue_answer(), "scontrol": lambda argv: INVALID,
                           "sacct": lambda argv: ("Slurm accounting storage is disabled\n", "", 0)})
    assert slurm.query("er-x", ["5"])["5"].state is JobState.ENDED_UNKNOWN
    slurm.query("er-x", ["5"])
    assert slurm.calls["sacct"] == 1


def test_scontrol_answers_for_a_job_of_another_name():
    slurm = ScriptedSlurm({"squeue": squeue_answer(), "scontrol": lambda argv: (SCONTROL_LINE + "\n", "", 0)})
    jobs = slurm.query("er-x", ["7"])
    assert jobs["7"].state is JobState.CANCELLED and jobs["7"].name == "er-probe-1"
    assert "sacct" not in slurm.calls


def test_sacct_answers_for_purged_jobs_in_one_call():
    row = "{}|TIMEOUT|cpu|cpu-1|2026-11-29T23:57:12|2026-11-29T23:57:13|2026-11-29T23:58:13|er-x"
    slurm = ScriptedSlurm({"squeue": squeue_answer(), "scontrol": lambda argv: INVALID,
                           "sacct": lambda argv: (row.format(5) + "\n" + row.format(6) + "\n", "", 0)})
    jobs = slurm.query("er-x", ["5", "6", "8"])
    assert jobs["5"].state is JobState.TIMEOUT and jobs["6"].state is JobState.TIMEOUT
    assert jobs["8"].state is JobState.ENDED_UNKNOWN
    assert slurm.calls["sacct"] == 1 and "--jobs=5,6,8" in slurm.argvs[-1]


def test_scontrol_lookups_per_query_are_capped():
    slurm = ScriptedSlurm({"squeue": squeue_answer(), "scontrol": lambda argv: INVALID,
                           "sacct": lambda argv: ("", "Slurm accounting storage is disabled\n", 1)})
    ids = [str(i) for i in range(100, 150)]
    jobs = slurm.query("er-x", ids)
    assert all(jobs[i].state is JobState.ENDED_UNKNOWN for i in ids)
    assert slurm.calls["scontrol"] == SlurmScheduler.MAX_SCONTROL_LOOKUPS


def test_fallback_failures_never_raise():
    def broken(argv):
        return "", "slurm_load_jobs error: Socket timed out on send/recv operation\n", 1
    slurm = ScriptedSlurm({"squeue": squeue_answer(), "scontrol": broken, "sacct": broken})
    assert slurm.query("er-x", ["5"])["5"].state is JobState.ENDED_UNKNOWN
    garbage = ScriptedSlurm({"squeue": squeue_answer(), "scontrol": lambda argv: ("JobId=5 nonsense", "", 0),
                             "sacct": lambda argv: ("5|what\n", "", 0)})
    assert garbage.query("er-x", ["5"])["5"].state is JobState.ENDED_UNKNOWN


def test_squeue_failure_is_a_scheduler_error_not_ended_jobs():
    # A controller that does not answer must not look like every job ended.
    slurm = ScriptedSlurm({"squeue": lambda argv: ("", "slurm_load_jobs error: Unable to contact slurm "
                                                       "controller (connect failure)\n", 1)})
    with pytest.raises(SchedulerError, match="Unable to contact"):
        slurm.query("er-x", ["5"])


def test_unreadable_squeue_output_is_a_clear_scheduler_error():
    slurm = ScriptedSlurm({"squeue": lambda argv: ("7|er-x|RUNNING\n", "", 0)})
    with pytest.raises(SchedulerError, match="cannot read squeue's output.*expected 12 fields"):
        slurm.query("er-x")


@pytest.mark.parametrize("name", ["a,b", "a b", ""])
def test_query_refuses_names_squeue_would_misread(name):
    with pytest.raises(ValueError, match="job_name"):
        ScriptedSlurm({}).query(name)


def test_cancel_of_an_ended_job_is_not_an_error():
    slurm = ScriptedSlurm({"scancel": lambda argv: ("", "scancel: error: Kill job error on job id 8: Invalid "
                                                        "job id specified\n", 1)})
    slurm.cancel("8")
    other = ScriptedSlurm({"scancel": lambda argv: ("", "scancel: error: Access/permission denied\n", 1)})
    with pytest.raises(SchedulerError, match="permission"):
        other.cancel("8")


def test_signal_and_cancel_argv():
    slurm = ScriptedSlurm({"scancel": lambda argv: ("", "", 0)})
    slurm.signal("8", "SIGUSR1")
    slurm.signal("8", "TERM", batch=True)
    slurm.cancel_by_name("er-x")
    assert slurm.argvs == [["scancel", "--signal=USR1", "8"], ["scancel", "--signal=TERM", "--batch", "8"],
                           ["scancel", "--name=er-x", f"--user={slurm.user}"]]
