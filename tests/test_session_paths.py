"""The session directory's names have one owner: ``protocol/disk/paths``.

What is held here:

* the names on disk, spelled out literally (a golden list: a change to one is
  a protocol change, never a refactoring);
* every name with a varying part is parsed back by its own module, and the
  parsers refuse the names nobody writes;
* every path function is described by exactly one entry of ``paths.ENTRIES``,
  and every file a real session directory ends up with is too;
* the two written descriptions of the layout, the module's docstring and the
  table in docs/architecture.md ("The session directory"), are renderings of
  ``paths.ENTRIES``: when one fails, the message holds the text to paste.
"""

from __future__ import annotations

import inspect
import textwrap
import time
from pathlib import Path, PurePosixPath

import pytest

from elastic_ray.config import SlurmWorkerAllocationConfig
from elastic_ray.coordinator import detached
from elastic_ray.coordinator.allocations import submit
from elastic_ray.coordinator.allocations.answers import SchedulerAnswer, SharedAnswers
from elastic_ray.protocol.disk import generations, paths
from elastic_ray.protocol.disk.records import HeadEndpoint, SessionInfo, WorkerRecord
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.scheduler.slurm_parse import script_name_prefix
from tests.helpers import node_state

REPO = Path(__file__).resolve().parent.parent
ARCHITECTURE = REPO / "docs" / "architecture.md"
OPERATIONS = REPO / "docs" / "operations.md"
BEGIN = "<!-- session-paths:begin"
END = "<!-- session-paths:end -->"
S = PurePosixPath("/shared/s")

# Every path function, with arguments, and the name it must give (relative to
# the session directory; "../" for the two beside it). Literal on purpose.
GOLDEN = [
    (paths.session_file, (), "session.json"),
    (paths.events_file, (), "events.jsonl"),
    (paths.events_rotated_file, (), "events.1.jsonl"),
    (paths.timeline_page, (), "timeline.html"),
    (paths.allocation_file, (), "allocation.json"),
    (paths.backup_file, (), "allocation.json.bak"),
    (paths.generation_dir, (), "allocation.gen"),
    (paths.generation_file, (7,), "allocation.gen/7.json"),
    (paths.allocation_lock_file, (), ".allocation.lock"),
    (paths.corrupt_copy, ("allocation.json", "20250101T120000"), "allocation.json.corrupt-20250101T120000"),
    (paths.corrupt_copy, ("allocation.gen.12", "20250101T120000", 3), "allocation.gen.12.corrupt-20250101T120000.3"),
    (paths.ray_head_file, (), "ray_head"),
    (paths.secret_file, (), "secret"),
    (paths.ray_token_file, (), "ray_token"),
    (paths.jobs_dir, (), "jobs"),
    (paths.job_dir, ("41",), "jobs/41"),
    (paths.head_endpoint_file, ("41",), "jobs/41/head.json"),
    (paths.nodes_dir, ("41",), "jobs/41/nodes"),
    (paths.node_state_file, ("41", "cpu-1"), "jobs/41/nodes/cpu-1.json"),
    (paths.specs_dir, (), "specs"),
    (paths.worker_spec_file, ("3f9c2a1b0d4e",), "specs/worker-3f9c2a1b0d4e.json"),
    (paths.answer_file, (), "scheduler-answer.json"),
    (paths.answer_lock_file, (), "scheduler-answer.lock"),
    (paths.log_dir, (), "logs"),
    (paths.agent_log, ("41", "cpu-1"), "logs/agent-41-cpu-1.log"),
    (paths.job_output_template, ("head",), "logs/head-%j.out"),
    (paths.job_output_template, ("worker",), "logs/worker-%j.out"),
    (paths.job_output, ("head", "41"), "logs/head-41.out"),
    (paths.job_output, ("worker", "42"), "logs/worker-42.out"),
    (paths.ray_log, ("41", "cpu-1", "worker"), "logs/ray-41-cpu-1-worker.log"),
    (paths.ray_log, ("42", "gpu-a-1", "head", True), "logs/ray-42-gpu-a-1-head-hosted.log"),
    (paths.detached_log, (), "logs/detached-supervisor.log"),
    (paths.remote_dir, (), "remote"),
    (paths.supervisor_lock_file, (), "remote/supervisor.lock"),
    (paths.supervisor_pid_file, (), "remote/supervisor.pid"),
    (paths.stop_marker, (), "remote/stop"),
    (paths.last_call_file, (), "remote/last_call"),
    (paths.payloads_dir, (), "payloads"),
    (paths.payload_file, ("0123456789abcdef", "train.py"), "payloads/0123456789abcdef-train.py"),
    (paths.pipes_dir, (), "pipes"),
    (paths.pipes_file, ("train", "1a2b3c4d"), "pipes/train-1a2b3c4d.jsonl"),
    (paths.local_scheduler_dir, (), "local-scheduler"),
    (paths.demo_commits_file, (), "commits.txt"),
    (paths.demo_payload_log, (), "payload.log"),
    (paths.autoscale_file, (), "autoscale.json"),
    (paths.autoscale_state_file, (), "autoscale-state.json"),
    (paths.creation_lock_file, (), "../s.lock"),
    (paths.ended_marker, (), "../s.ended"),
]
# Folders: described by the entries of what they hold.
FOLDERS = {"allocation.gen", "jobs", "jobs/41", "jobs/41/nodes", "specs", "logs", "remote", "payloads", "pipes"}


def _relative(path: PurePosixPath) -> str:
    return str(path.relative_to(S)) if path.is_relative_to(S) else f"../{path.name}"


@pytest.mark.parametrize("function, args, expected", GOLDEN, ids=lambda v: getattr(v, "__name__", None))
def test_the_names_on_disk(function, args, expected):
    assert _relative(function(S, *args)) == expected


def test_a_path_is_the_kind_it_was_given():
    assert isinstance(paths.agent_log(Path("/s"), "1", "n"), Path)
    assert type(paths.agent_log(PurePosixPath("/s"), "1", "n")) is PurePosixPath


def test_every_path_function_has_its_golden_name():
    functions = {name for name, f in vars(paths).items() if inspect.isfunction(f) and f.__module__ == paths.__name__
                 and list(inspect.signature(f).parameters)[:1] == ["session"]}
    assert functions == {f.__name__ for f, _, _ in GOLDEN}


@pytest.mark.parametrize("function, args, expected", GOLDEN, ids=lambda v: getattr(v, "__name__", None))
def test_every_path_is_described_by_one_entry(function, args, expected):
    relative = _relative(function(S, *args))
    if relative in FOLDERS:
        folders = {p.rsplit("/", k)[0] for e in paths.ENTRIES for p in e.paths for k in (1, 2) if "/" in p}
        assert any(paths.Entry((f,), "", "", "").matches(relative) for f in folders), (
            f"{relative}/ holds nothing any entry describes")
        return
    beside = relative.startswith("../")
    name = relative.replace("../s", "<session>") if beside else relative
    found = [e for e in paths.ENTRIES if e.beside == beside and e.matches(name)]
    assert len(found) == 1, (relative, [e.path for e in found])


def test_every_entry_has_a_builder_but_the_temporary_files():
    built = {_relative(f(S, *a)) for f, a, _ in GOLDEN}
    # The kept batch script: the scheduler names it in any workdir (mkstemp adds the random part).
    built.add(script_name_prefix("er-x", "worker", 0.0) + "k2j4h1.sbatch")
    for entry in paths.ENTRIES:
        if entry.paths[0].startswith(".<name>"):
            continue
        names = {n.replace("../s", "<session>") if n.startswith("../") else n for n in built}
        assert any(entry.matches(n) for n in names), f"no path function builds {entry.path}"


@pytest.mark.parametrize("name, parsed", [
    ("7.json", 7), ("0.json", 0), ("01.json", None), ("7.json.tmp", None), (".allocation.x.tmp", None), ("x", None),
])
def test_generation_names(name, parsed):
    assert paths.generation_of(name) == parsed
    if parsed is not None:
        assert paths.generation_name(parsed) == name


@pytest.mark.parametrize("name, parsed", [
    ("head-41.out", ("head", "41")), ("worker-42.out", ("worker", "42")),
    ("worker-%j.out", None), ("head-41.err", None), ("other-41.out", None), ("worker-4x.out", None),
    ("agent-41-cpu-1.log", None), ("head-.out", None),
])
def test_job_output_names(name, parsed):
    assert paths.parse_job_output_name(name) == parsed
    if parsed is not None:
        assert paths.job_output_name(*parsed) == name


@pytest.mark.parametrize("name, parsed", [
    ("agent-41-cpu-1.log", ("41", "cpu-1")), ("agent-7-n.log", ("7", "n")),
    ("agent-41.log", None), ("agent-x-cpu-1.log", None), ("agent-41-cpu-1.out", None), ("ray-41-n-head.log", None),
])
def test_agent_log_names(name, parsed):
    assert paths.parse_agent_log_name(name) == parsed
    if parsed is not None:
        assert paths.agent_log_name(*parsed) == name


@pytest.mark.parametrize("name, parsed", [
    ("ray-41-cpu-1-worker.log", ("41", "cpu-1", "worker", False)),
    ("ray-42-gpu-a-1-head-hosted.log", ("42", "gpu-a-1", "head", True)),
    ("ray-42-n-head.log", ("42", "n", "head", False)),
    ("ray-42-head.log", None), ("ray-x-n-head.log", None), ("ray-42-n-driver.log", None), ("agent-42-n.log", None),
])
def test_ray_log_names(name, parsed):
    assert paths.parse_ray_log_name(name) == parsed
    if parsed is not None:
        assert paths.ray_log_name(*parsed) == name


@pytest.mark.parametrize("name, parsed", [
    ("worker-3f9c2a1b0d4e.json", "3f9c2a1b0d4e"), ("worker-dryrun1.json", "dryrun1"),
    ("worker-.json", None), ("head-1.json", None), ("worker-1.json.tmp", None),
])
def test_worker_spec_names(name, parsed):
    assert paths.worker_spec_id(name) == parsed
    if parsed is not None:
        assert paths.worker_spec_name(parsed) == name


@pytest.mark.parametrize("name, parsed", [("cpu-1.json", "cpu-1"), (".cpu-1.json.x.tmp", None), ("cpu-1", None)])
def test_node_file_names(name, parsed):
    assert paths.node_of(name) == parsed


@pytest.mark.parametrize("node", ["", "a/b", ".hidden"])
def test_a_node_name_that_is_no_file_name_is_refused(node):
    with pytest.raises(ValueError, match="not a usable node name"):
        paths.node_state_file(S, "41", node)


def test_a_job_folder_is_named_by_a_job_id_only():
    assert paths.job_of_dir("41") == "41" and paths.job_of_dir("x41") is None
    with pytest.raises(ValueError):
        paths.job_dir(S, "../41")


def test_the_generation_entry_says_how_many_are_kept():
    (entry,) = [e for e in paths.ENTRIES if e.matches("allocation.gen/1.json")]
    assert f"newest {generations.KEEP_GENERATIONS} are kept" in entry.holds


def _make_info() -> SessionInfo:
    return SessionInfo(session_id="s-1", job_name="er-paths", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu", "time_limit": "60"})


def test_every_file_of_a_session_directory_is_described(tmp_path):
    """A directory after the writes of a run (without Ray): each of its files is one entry's."""
    session = SessionDir.create(tmp_path / "s", _make_info())
    for job in ("101", "102"):
        session.update_allocation(lambda r, job=job: r.with_worker(WorkerRecord(
            job_id=job, config={"partition": "cpu"}, submitted_at=1.0)))
    session.write_ray_head("100")
    session.write_head_endpoint(HeadEndpoint(job_id="100", host="cpu-1", address="10.0.0.1:6380",
                                             ray_version="2.60.0", started_at=time.time(), ports={"gcs": 6380}))
    session.write_node_state(node_state("101", "cpu-2"))
    spec = submit.write_worker_spec(session, SlurmWorkerAllocationConfig.from_dict({"partition": "cpu"}))
    assert paths.worker_spec_id(spec.name) is not None and spec.parent == paths.specs_dir(session.path)
    SharedAnswers(session.path).write(SchedulerAnswer(job_name="er-paths", user="u", asked_at=time.time(),
                                                      ids=frozenset()))
    paths.answer_lock_file(session.path).touch()
    paths.remote_dir(session.path).mkdir()
    detached.touch_last_call(session.path)
    for role, job in (("head", "100"), ("worker", "101")):
        paths.job_output(session.path, role, job).write_text("out\n")
    paths.agent_log(session.path, "101", "cpu-2").write_text("log\n")
    paths.ray_log(session.path, "101", "cpu-2", "worker").write_text("ray\n")
    paths.allocation_file(session.path).write_bytes(b"{")      # damage, then a restore sets it aside
    session.restore_allocation_backup()
    files = sorted(str(p.relative_to(session.path)) for p in session.path.rglob("*") if p.is_file())
    assert any(f.startswith("allocation.json.corrupt-") for f in files)
    undescribed = [f for f in files if paths.describe(f) is None]
    assert not undescribed, undescribed


def test_the_module_docstring_is_the_rendering_of_its_entries():
    expected = textwrap.indent(paths.render_text(), "    ")
    assert expected in paths.__doc__, (
        "elastic_ray/protocol/disk/paths.py: the layout in the docstring differs from paths.ENTRIES; "
        "replace it with:\n\n" + expected)


def _doc_block(text: str) -> str:
    start = text.index(BEGIN)
    start = text.index("\n", start) + 1
    return text[start:text.index(END, start)].rstrip("\n")


def test_the_architecture_page_shows_the_entries():
    text = ARCHITECTURE.read_text()
    section = text[text.index("## The session directory"):]
    assert BEGIN in section.split("\n## ", 1)[0], "the table belongs to the section 'The session directory'"
    assert _doc_block(text) == paths.render_markdown(), (
        "docs/architecture.md: the session directory's table differs from paths.ENTRIES; replace the lines "
        f"between {BEGIN} ... and {END} with:\n\n" + paths.render_markdown())


def test_the_table_has_an_owner_for_every_file():
    header = paths.render_markdown().splitlines()[0]
    assert header == "| path | holds | written by | read by |"
    assert all(e.written_by and e.read_by and e.holds for e in paths.ENTRIES)


def test_the_operations_page_names_only_described_logs():
    """docs/operations.md's table of logs names files the layout knows."""
    text = OPERATIONS.read_text()
    section = text[text.index("### Logs"):].split("\n## ", 1)[0]
    named = [cell.strip("`") for line in section.splitlines() if line.startswith("| `logs/")
             for cell in line.split("|")[1].strip().split(", ")]
    assert named
    for name in named:
        assert paths.describe(name.replace("<", "").replace(">", "")) is not None, name
