"""The one vocabulary of Slurm values: job ids, job names, signals, host lists,
times and memory sizes, each rule tested here once, by table.

Every validator is also fed the two inputs that slipped through the old
copies of these rules: a trailing newline (``re.match`` with ``$`` accepts
``"123\\n"``) and digits of another script (``\\d`` and ``str.isdigit``
accept ``"١٢٣"``, which ``int()`` reads as 123).
"""

from __future__ import annotations

import signal

import pytest

from elastic_ray.config import slurm_values as sv
from elastic_ray.config.slurm_values import (
    JOB_ID_MAX_DIGITS,
    JOB_NAME_MAX,
    MAX_HOSTS,
    MAX_SIGNAL_SECONDS,
    check_hostlist,
    check_job_id,
    check_job_name,
    expand_hostlist,
    is_job_id,
    is_job_name,
    parse_memory_mb,
    parse_signal,
    parse_signal_name,
    parse_slurm_time,
    signal_name,
)
from elastic_ray.errors import ConfigError

ARABIC_123 = "\u0661\u0662\u0663"       # '١٢٣'
FULLWIDTH_12 = "\uff11\uff12"            # '１２'
DEVANAGARI_15 = "\u0967\u096b"           # '१५'

# ----------------------------------------------------------------- job ids

GOOD_JOB_IDS = ["1", "7", "123", "4294967295", "0", "007", "9" * JOB_ID_MAX_DIGITS]
BAD_JOB_IDS = [
    "", "123\n", "\n123", " 123", "123 ", "1\n2", ARABIC_123, FULLWIDTH_12, "12" + ARABIC_123,
    "9" * (JOB_ID_MAX_DIGITS + 1), "-1", "+1", "--all", "12 13", "12;x", "12;lab", "7_1", "7+0", "12.0",
    "1e5", "0x1f", "abc", 12, 0, None, True, b"12", ["12"],
]


@pytest.mark.parametrize("value", GOOD_JOB_IDS)
def test_job_id_accepted(value):
    # Leading zeros are accepted, as before: Slurm never prints them, and
    # refusing them would be a new rule for files already written.
    assert is_job_id(value)
    assert check_job_id(value) == value


@pytest.mark.parametrize("value", BAD_JOB_IDS)
def test_job_id_refused_naming_the_field(value):
    assert not is_job_id(value)
    with pytest.raises(ConfigError) as info:
        check_job_id(value, "predecessors[]")
    assert info.value.field == "predecessors[]" and info.value.value == value
    assert str(info.value).startswith("predecessors[]=")


def test_job_id_error_names_job_id_by_default():
    with pytest.raises(ValueError, match="^job_id='x'"):
        check_job_id("x")


# ----------------------------------------------------------------- job names

GOOD_JOB_NAMES = [
    "a", "er-3f9c2a1b", "A.b_c-9", "x" * JOB_NAME_MAX, "123", "-x", "...",
    # Names the code itself makes: Session.create, the demo, the scheduler
    # contract tests and the Slurm integration tests.
    # Fixed hex (a uuid4's digits): the ids must be the same in every
    # collecting process (pytest-xdist compares them).
    "er-5c3e2d7e", "er-demo-71a3d3", "ct-63a59a7194", "er-test-ea0c0f08", "er-cli-1f1f31e0", "er-bench",
]
BAD_JOB_NAMES = [
    "", "x" * (JOB_NAME_MAX + 1), "er\n", "er-x\n", "\ner", "er x", "er\tx", "er,other", "er:x", "er@x",
    "er=x", "er+x", "er/x", "er'x", 'er"x', "er#x", "er$x", "er`x`", "er\\x", "er;x", "er\x00", "é",
    "er-" + ARABIC_123, "ｅｒ", 5, None, True, b"er",
]


@pytest.mark.parametrize("name", GOOD_JOB_NAMES)
def test_job_name_accepted(name):
    assert is_job_name(name)
    assert check_job_name(name) == name


@pytest.mark.parametrize("name", BAD_JOB_NAMES)
def test_job_name_refused_naming_the_field(name):
    assert not is_job_name(name)
    with pytest.raises(ConfigError) as info:
        check_job_name(name)
    assert info.value.field == "job_name" and info.value.value == name


# ----------------------------------------------------------------- signal names

GOOD_SIGNAL_NAMES = [
    # (input, Signals member)
    ("TERM", signal.SIGTERM), ("SIGTERM", signal.SIGTERM), ("term", signal.SIGTERM),
    ("sigterm", signal.SIGTERM), ("SigTerm", signal.SIGTERM), (" TERM ", signal.SIGTERM),
    ("TERM\n", signal.SIGTERM), ("USR1", signal.SIGUSR1), ("usr2", signal.SIGUSR2),
    ("15", signal.SIGTERM), ("0015", signal.SIGTERM), (15, signal.SIGTERM), (int(signal.SIGUSR1), signal.SIGUSR1),
    (signal.SIGINT, signal.SIGINT), ("9", signal.SIGKILL), ("KILL", signal.SIGKILL), ("STOP", signal.SIGSTOP),
    # Aliases resolve to the canonical member, so every part spells it alike.
    ("IOT", signal.SIGABRT), ("SIGCLD", signal.SIGCHLD),
]
BAD_SIGNAL_NAMES = [
    "", " ", "SIG", "SIGSIGTERM", "NOPE", "SIGFOO", "TERMX", "0", "999", "-15", "+15", "1.5", ARABIC_123,
    DEVANAGARI_15, "\uff34\uff25\uff32\uff2d",  # fullwidth TERM
    "s\u0131gterm",  # dotless i: upper-cases to "SIGTERM"
    "TERM@30", "B:TERM", "TERM;ls", "SIG TERM", "TE RM", "RTMIN+1", "TERM\x00", "1" * 5000, "00015" + "0" * 30,
    None, True, False, 1.5, b"TERM", 0, -1, 999,
]


@pytest.mark.parametrize("value,member", GOOD_SIGNAL_NAMES)
def test_signal_name_accepted(value, member):
    assert parse_signal_name(value) is member
    assert signal_name(value) == member.name[3:]


@pytest.mark.parametrize("value", BAD_SIGNAL_NAMES)
def test_signal_name_refused_saying_signal(value):
    with pytest.raises(ValueError, match="signal"):
        parse_signal_name(value)


# ----------------------------------------------------------------- signal_before_timeout

GOOD_SIGNAL_SPECS = [
    # (text, name, seconds)
    ("TERM@600", "TERM", 600), ("SIGUSR1@90", "USR1", 90), ("usr2@5", "USR2", 5), ("15@30", "TERM", 30),
    (" TERM@600\n", "TERM", 600), ("TERM@1", "TERM", 1), (f"TERM@{MAX_SIGNAL_SECONDS}", "TERM", 65535),
    ("TERM@0600", "TERM", 600), ("INT@60", "INT", 60), ("sigusr1@300", "USR1", 300),
]
BAD_SIGNAL_SPECS = [
    # (text, words in the reason)
    ("TERM@0", "between 1 and"), ("TERM@000", "between 1 and"),
    (f"TERM@{MAX_SIGNAL_SECONDS + 1}", "between 1 and"), ("TERM@70000", "between 1 and"),
    ("TERM@" + "9" * 5000, "between 1 and"),
    ("KILL@60", "cannot be caught"), ("SIGKILL@60", "cannot be caught"), ("9@60", "cannot be caught"),
    ("STOP@60", "cannot be caught"), ("sigstop@60", "cannot be caught"),
    (f"{int(signal.SIGSTOP)}@60", "cannot be caught"),
    ("NOPE@60", "unknown signal"), ("99@60", "unknown signal number"), ("0@60", "unknown signal number"),
    ("s\u0131gterm@60", "SIGNAL@SECONDS"),
    ("B:TERM@60", "prefixes"), ("R:TERM@60", "prefixes"),
    ("TERM", "SIGNAL@SECONDS"), ("@60", "SIGNAL@SECONDS"), ("TERM@", "SIGNAL@SECONDS"),
    ("", "SIGNAL@SECONDS"), ("TERM@60s", "SIGNAL@SECONDS"), ("TERM@-1", "SIGNAL@SECONDS"),
    ("TERM@+60", "SIGNAL@SECONDS"), ("TERM@1.5", "SIGNAL@SECONDS"), (f"TERM@{ARABIC_123}", "SIGNAL@SECONDS"),
    (f"{DEVANAGARI_15}@60", "SIGNAL@SECONDS"), ("TERM @60", "SIGNAL@SECONDS"), ("TERM@ 60", "SIGNAL@SECONDS"),
    ("TERM@60@60", "SIGNAL@SECONDS"), ("TERM@60\nUSR1@5", "SIGNAL@SECONDS"),
    (600, "expected a string"), (None, "expected a string"),
]


@pytest.mark.parametrize("text,name,seconds", GOOD_SIGNAL_SPECS)
def test_signal_spec_accepted(text, name, seconds):
    spec = parse_signal(text)
    assert (spec.name, spec.seconds) == (name, seconds)
    assert spec.sbatch_value() == f"{name}@{seconds}"


@pytest.mark.parametrize("text,words", BAD_SIGNAL_SPECS)
def test_signal_spec_refused_with_a_reason(text, words):
    with pytest.raises(ValueError, match=words):
        parse_signal(text)


def test_every_untrappable_signal_is_a_real_signal():
    assert all(parse_signal_name(name) for name in sv.UNTRAPPABLE_SIGNALS)


# ----------------------------------------------------------------- host lists

GOOD_HOSTLISTS = [
    # (text, hosts)
    ("cpu-1", ("cpu-1",)), ("gpua-[1-2]", ("gpua-1", "gpua-2")), ("cpu-1,cpu-2", ("cpu-1", "cpu-2")),
    ("node[01-03,07]", ("node01", "node02", "node03", "node07")), ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    ("host.example.org", ("host.example.org",)), ("a_b", ("a_b",)),
]
BAD_HOSTLISTS = [
    "", " ", "a b", "a\n", "gpua-[1-2]\n", "\ngpua-1", "a\tb", f"node[{ARABIC_123}]", f"node{ARABIC_123}",
    "nodé", "$(reboot)", "node/1", "(null)", "a;b", "a,,b", ",a", "a,", "cpu-[2-1]", "cpu-[1-2", "cpu-1-2]",
    "cpu-[[1-2]]", "cpu-[]", "cpu-[a-b]", "cpu-[1-]", f"n[1-{MAX_HOSTS + 1}]", 5, None, ["a"],
]


@pytest.mark.parametrize("text,hosts", GOOD_HOSTLISTS)
def test_hostlist_accepted(text, hosts):
    assert check_hostlist(text, "nodelist") == text
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", BAD_HOSTLISTS)
def test_hostlist_refused_naming_the_field(text):
    with pytest.raises(ConfigError) as info:
        check_hostlist(text, "exclude")
    assert info.value.field == "exclude" and info.value.value == text


@pytest.mark.parametrize("text", [f"node[{ARABIC_123}]", f"node[1-{ARABIC_123}]", f"n[{FULLWIDTH_12}]"])
def test_hostlist_expansion_reads_ascii_ranges_only(text):
    with pytest.raises(ValueError, match="host list"):
        expand_hostlist(text)


# ----------------------------------------------------------------- times and memory

@pytest.mark.parametrize("text,seconds", [
    ("30\n", 1800), (" 1-02:03 ", 86400 + 7200 + 180), ("007", 420), ("0:30", 30), ("UNLIMITED\n", None),
])
def test_time_forms_are_read_after_stripping_blanks(text, seconds):
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", [
    "", "\n", "0", "0:0", "0-0", "1:60", "1:00:60", "1-24", "-1", "1.5", "30s", "1h", "30\n30", "1 0",
    ARABIC_123, f"1:{ARABIC_123[:2]}", f"{FULLWIDTH_12}:00:00", f"1-{DEVANAGARI_15}",
    "\u0131nf\u0131n\u0131te",  # dotless i: upper-cases to "INFINITE"
])
def test_time_forms_refused(text):
    with pytest.raises(ValueError):
        parse_slurm_time(text)


@pytest.mark.parametrize("text,mb", [("16G\n", 16384), (" 512 ", 512), ("8g", 8192), ("0", 0), ("016G", 16384)])
def test_memory_forms_are_read_after_stripping_blanks(text, mb):
    assert parse_memory_mb(text) == mb


@pytest.mark.parametrize("text", [
    "", "G", "16GB", "16 G", "-1G", "1.5G", "16G\n16G", f"{ARABIC_123}G", f"{FULLWIDTH_12}",
    "16\u212a",  # KELVIN SIGN: case-insensitive Unicode matching would take it for 'k'
])
def test_memory_forms_refused(text):
    with pytest.raises(ValueError, match="memory size"):
        parse_memory_mb(text)


# ----------------------------------------------------------------- one rule, everywhere

def test_every_part_uses_the_one_vocabulary():
    """The records, both schedulers, the renderer and the frames check with
    these functions, not with copies that could drift apart again."""
    from elastic_ray.protocol.wire import frames
    from elastic_ray.protocol.disk import records
    from elastic_ray.scheduler import render, slurm, slurm_parse
    from elastic_ray.scheduler.local import record

    assert records.is_job_id is is_job_id and records.check_job_id is check_job_id
    assert records.check_job_name is check_job_name
    assert slurm.check_job_id is check_job_id and slurm.check_job_name is check_job_name
    assert slurm_parse.expand_hostlist is expand_hostlist and slurm_parse.is_job_id is is_job_id
    assert render.check_job_name is check_job_name
    assert record.parse_signal_name is parse_signal_name
    assert frames.is_job_id is is_job_id


# ----------------------------------------------------------------- the same sweep beyond the vocabulary

@pytest.mark.parametrize("address", ["10.0.0.1:\u0666\u0663\u0667\u0669", "10.0.0.1:6379\n", "10.0.0.1:\uff16379"])
def test_a_head_endpoint_port_is_ascii_digits(address):
    from elastic_ray.protocol.disk.records import HeadEndpoint

    good = {"job_id": "7", "host": "n1", "address": "10.0.0.1:6379", "ray_version": "2.0",
            "started_at": 1.0, "ports": {"gcs": 6379}}
    assert HeadEndpoint.from_dict(good).address == "10.0.0.1:6379"
    with pytest.raises(ValueError, match="host:port"):
        HeadEndpoint.from_dict({**good, "address": address})


@pytest.mark.parametrize("text", ["a40=\u0661", "a40=\uff11", "a40=1\u0660"])
def test_a_ray_resource_amount_is_ascii(text):
    from elastic_ray.cli.options import parse_ray_resource

    assert parse_ray_resource("a40=1\n") == ("a40", 1.0)  # float() ignores blanks; so does the CLI
    with pytest.raises(ValueError, match="not a number"):
        parse_ray_resource(text)
