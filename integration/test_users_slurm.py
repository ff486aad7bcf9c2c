"""Ordinary users on the real lab (issue 25): what a user does, done with that user's uid.

The lab creates two users (``integration/labctl/users.py``); each gets their
own copy of this tree and a virtualenv built with the system Python in their
home, as ``docs/real-cluster.md`` tells users (``integration/users.py``).
Everything a user does runs as that user, with a clean environment; root
only does what an operator (or a preemption) does: cancelling a head job.

* the elastic story as a user: a session with a CPU head and a worker
  allocation, the committing payload through the seed's loop, the head
  cancelled mid-run, every unit committed once, teardown; every process of
  the session's jobs and every file of its directory belonged to the user;
* two users at once on the same nodes: both fail over and finish; neither can
  read the other's secret or Ray token, command the other's agent, join the
  other's Ray or cancel the other's jobs; one's teardown leaves the other's
  run going;
* the Dagster example materialized as a user, on Slurm.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import uuid
from pathlib import Path

import pytest

from integration.faults import lab_ops
from integration.users import ALICE, BOB, LabUser, lab_user
from tests.helpers import committed_units, wait_until

# Full tier for now (a user's venv takes minutes to build on a fresh machine): the same runs as
# root are per change in test_coordinator_slurm, test_faults_slurm and test_dagster_slurm;
# what only these add (the uid of every process and file, one user against another) is not.
pytestmark = [pytest.mark.slurm, pytest.mark.ray, pytest.mark.slow, pytest.mark.timeout(1800)]

# Run as the user, with their venv's python: argv = session dir, commits file, units, head node, worker node.
STORY = r'''
import json, sys
from elastic_ray import Session, SlurmAllocationEnded, SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
from elastic_ray.config.launcher import RayLauncher

path, commits, units, head_node, worker_node = sys.argv[1:6]
def say(**event):
    print(json.dumps(event), flush=True)

head = SlurmRunAllocationConfig(partition="cpu", cpus_per_task=1, mem="1G", time_limit="30", nodelist=head_node)
s = Session.create(path, scheduler="slurm", head=head, launcher=RayLauncher(object_store_memory=100_000_000))
s.wait_for_head(timeout=300)
w = s.add_worker_allocation(SlurmWorkerAllocationConfig(partition="gpu-a", num_nodes=1, cpus_per_task=1, mem="1G",
                                                        time_limit="30", nodelist=worker_node))
s.wait_for_worker_allocation(w, timeout=300)
say(event="up", head=s.record().head_job, worker=w.job_id)
handle, relaunches = None, 0
while True:
    try:
        run = s.run([sys.executable, "-m", "elastic_ray.demo.payload", commits, units], head=handle,
                    env={"ELASTIC_RAY_PAYLOAD_UNIT_SECONDS": "0.5"})
        run.wait(timeout=900)
        break
    except SlurmAllocationEnded as exc:
        relaunches += 1
        say(event="ended", state=str(exc.allocation_state))
        handle = s.replace_head(timeout=600)
        say(event="replaced", head=handle.job_id)
say(event="finished", relaunches=relaunches)
s.teardown(wait=True)
say(event="torn down")
'''


# Run as the session's owner (root does not open a user's session: it is not root's to trust):
# what the test needs to know of it, as JSON.
PEEK = r"""
import json, sys
from elastic_ray import Session
s = Session.open(sys.argv[1], supervise=False)
rec = s.record()
jobs = sorted(j for j in {rec.head_job, *rec.workers, *rec.predecessors, rec.successor} if j)
endpoint = s.dir.read_head_endpoint(rec.head_job) if rec.head_job else None
print(json.dumps({"session_id": s.info.session_id, "head": rec.head_job, "jobs": jobs,
                  "secret_file": str(s.dir.secret_file), "token_file": str(s.dir.ray_token_file),
                  "states": {j: i.state.value for j, i in s.query(jobs).items()},
                  "controls": {j: [n.control for n in s.node_states(j).values()] for j in rec.workers},
                  "head_address": endpoint.address if endpoint else None}))
s.close()
"""
TEARDOWN = r"""
import sys
from elastic_ray import Session
s = Session.open(sys.argv[1], supervise=False)
s.teardown(wait=True)
"""


def peek(user: LabUser, session_dir: Path) -> dict:
    return json.loads(user.python_code(PEEK, str(session_dir), timeout=120).stdout.strip().splitlines()[-1])


class Story:
    """One user's run of STORY in the background; its events as they come."""

    def __init__(self, user: LabUser, units: int, head_node: str, worker_node: str, logs: Path):
        self.user = user
        self.dir = user.home / "sessions" / f"story-{uuid.uuid4().hex[:6]}"
        self.commits = user.home / "work" / f"{self.dir.name}.txt"
        self.units = units
        user.run(["mkdir", "-p", str(self.dir.parent), str(self.commits.parent)])
        self.stderr_path = logs / f"{user.name}-{self.dir.name}.err"
        with open(self.stderr_path, "w") as err:   # a file, not a pipe nobody reads (it would fill and block)
            self.proc = user.popen([str(user.python), "-c", STORY, str(self.dir), str(self.commits), str(units),
                                    head_node, worker_node], stderr=err)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.append(json.loads(line))
            except ValueError:
                pass

    def seen(self, name: str) -> dict | None:
        return next((e for e in self.events if e.get("event") == name), None)

    def wait(self, name: str, timeout: float) -> dict:
        return wait_until(lambda: self.seen(name) or (self.proc.poll() is not None and self._failed()),
                          timeout=timeout, message=f"{self.user.name}: no '{name}' event; events {self.events}")

    def _failed(self):
        self.proc.wait()
        self._reader.join(timeout=30)
        err = self.stderr_path.read_text(errors="replace")
        raise AssertionError(f"{self.user.name}'s story exited {self.proc.returncode} before its end; "
                             f"events {self.events}\n{err[-4000:]}")

    def peek(self) -> dict:
        return peek(self.user, self.dir)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if (self.dir / "session.json").exists():   # a story that failed half-way: its owner tears it down
            self.user.python_code(TEARDOWN, str(self.dir), timeout=300, check=False)


def owners(pids: list[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            out.add(os.stat(f"/proc/{pid}").st_uid)
        except OSError:
            pass
    return out


def file_owners(root: Path) -> dict[int, list[str]]:
    found: dict[int, list[str]] = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            p = Path(dirpath) / name
            try:
                found.setdefault(p.lstat().st_uid, []).append(str(p.relative_to(root)))
            except OSError:
                pass
    return found


def head_up_and_working(story: Story, units: int) -> dict:
    up = story.wait("up", timeout=600)
    wait_until(lambda: len(committed_units(story.commits)) >= units, timeout=300,
               message=f"{story.user.name}'s payload committing")
    return up


@pytest.fixture(scope="module")
def users(slurm_lab):
    from integration import labctl
    if labctl.running_settings(labctl.settings_from_env()).swaps_usr:
        # A 24.11 node's /usr is the Debian 13 root's, without the system Python a user's venv is
        # made from, and the host's client wrappers need root (a mount namespace).
        pytest.skip("ordinary users run on the 22.05 lab only (see integration/labctl/slurm2411/README.md)")
    labctl.ensure_users()
    stage_dir = slurm_lab.shared_dir(f"users-stage/{uuid.uuid4().hex[:6]}")
    return {name: lab_user(name, stage_dir) for name in (ALICE, BOB)}


def test_the_elastic_story_as_a_user(users, tmp_path):
    alice = users[ALICE]
    story = Story(alice, units=240, head_node="cpu-1", worker_node="gpua-1", logs=tmp_path)
    try:
        up = head_up_and_working(story, 16)
        jobs = set(story.peek()["jobs"])
        procs = lab_ops.session_processes(jobs, since=time.time() - 3600)
        assert procs and owners([p.pid for p in procs]) == {alice.uid}, \
            [(p.kind, p.node, p.pid) for p in procs]
        subprocess.run(["scancel", up["head"]], check=True, timeout=30)   # the operator's part
        story.wait("finished", timeout=900)
        story.wait("torn down", timeout=300)
        assert story.proc.wait(timeout=60) == 0
        units = committed_units(story.commits)
        assert sorted(units) == list(range(240)), "every unit committed exactly once"
        assert story.seen("finished")["relaunches"] >= 1 and story.seen("replaced")
        assert set(file_owners(story.dir)) == {alice.uid}, file_owners(story.dir)
        assert not lab_ops.session_processes(jobs, since=time.time() - 3600)
    finally:
        story.stop()


def _refused_control(user: LabUser, endpoint: str, own_session: Path, other_session_id: str) -> str:
    """``user`` sends a status and a shutdown request to another session's agent with their own secret."""
    code = r'''
import sys
from elastic_ray import Session
from elastic_ray.protocol.wire.channel import ControlClient, ControlError
endpoint, own, other_id = sys.argv[1:4]
secret = Session.open(own, supervise=False).dir.secret()
for kind in ("status", "shutdown"):
    try:
        reply = ControlClient(endpoint, secret, other_id).request(kind, {}, timeout=5)
    except ControlError as exc:
        print(f"{kind}: refused ({type(exc).__name__})")
        continue
    print(f"{kind}: ANSWERED {reply}")
'''
    return user.python_code(code, endpoint, str(own_session), other_session_id, timeout=120).stdout


def _refused_ray(user: LabUser, address: str, own_session: Path) -> subprocess.CompletedProcess:
    """``user`` connects a driver to another session's head with their own session's Ray settings."""
    code = r'''
import os, sys
from elastic_ray import Session
address, own = sys.argv[1:3]
os.environ.update(Session.open(own, supervise=False).ray_client_env())
os.environ["RAY_NUM_REDIS_GET_RETRIES"] = "3"
import ray
ray.init(address=address, logging_level="ERROR", log_to_driver=False)
print("JOINED", ray.cluster_resources())
'''
    return user.python_code(code, address, str(own_session), timeout=300, check=False)


def test_two_users_on_the_same_nodes_fail_over_and_cannot_touch_each_other(users, tmp_path):
    alice, bob = users[ALICE], users[BOB]
    a = Story(alice, units=600, head_node="cpu-1", worker_node="gpua-1", logs=tmp_path)
    b = Story(bob, units=240, head_node="cpu-1", worker_node="gpua-1", logs=tmp_path)
    try:
        up_a, up_b = head_up_and_working(a, 16), head_up_and_working(b, 16)
        pa = a.peek()
        # Files: alice's home is hers (sessions, commits, logs), the secret and the Ray token above all.
        cp = bob.run(["ls", str(alice.home)], check=False)
        assert cp.returncode != 0 and "Permission denied" in cp.stderr, cp.stdout[:200]
        for path in (pa["secret_file"], pa["token_file"]):
            cp = bob.run(["cat", path], check=False)
            assert cp.returncode != 0 and "Permission denied" in cp.stderr, (path, cp.stdout[:80])
        # Agents: bob's secret does not command alice's agent.
        said = _refused_control(bob, pa["controls"][up_a["worker"]][0], b.dir, pa["session_id"])
        assert "ANSWERED" not in said and said.count("refused") == 2, said
        # Ray: bob's token does not let a driver into alice's cluster.
        cp = _refused_ray(bob, pa["head_address"], b.dir)
        assert cp.returncode != 0 and "JOINED" not in cp.stdout, cp.stdout[-2000:]
        # Slurm: bob cannot cancel alice's jobs.
        cp = bob.run(["scancel", up_a["worker"], up_a["head"]], check=False)
        assert "denied" in (cp.stderr + cp.stdout).lower(), cp.stderr
        states = a.peek()["states"]
        assert states[up_a["head"]] == states[up_a["worker"]] == "RUNNING", states
        # Both heads lost at once (the same node): both fail over.
        subprocess.run(["scancel", up_a["head"], up_b["head"]], check=True, timeout=30)
        a.wait("replaced", timeout=600)
        b.wait("torn down", timeout=900)    # bob's run is the shorter: finished and gone first
        assert b.proc.wait(timeout=60) == 0 and sorted(committed_units(b.commits)) == list(range(240))
        # Bob's teardown left alice's run going: her jobs run, her payload commits on.
        assert "RUNNING" in a.peek()["states"].values(), a.peek()["states"]
        before = len(committed_units(a.commits))
        wait_until(lambda: len(committed_units(a.commits)) > before, timeout=60,
                   message="alice's payload to go on after bob's teardown")
        a.wait("torn down", timeout=900)
        assert a.proc.wait(timeout=60) == 0 and sorted(committed_units(a.commits)) == list(range(600))
        for story, user in ((a, alice), (b, bob)):
            assert set(file_owners(story.dir)) == {user.uid}
    finally:
        a.stop()
        b.stop()


def stage(where: Path, files: dict[str, str]) -> Path:
    """Files a user copies from: root's, readable by all, on the lab's shared filesystem."""
    where.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (where / name).write_text(text)
        os.chmod(where / name, 0o644)
    os.chmod(where, 0o755)
    return where


def test_the_dagster_example_materializes_as_a_user_on_slurm(users, slurm_lab):
    alice = users[ALICE]
    project = alice.home / "dagster_project"
    example = Path(__file__).resolve().parents[1] / "examples" / "dagster_project"
    text = (example / "definitions.py").read_text()
    assert 'mode="local"' in text
    staged = stage(slurm_lab.shared_dir(f"users-stage/{uuid.uuid4().hex[:6]}"), {"payload.py": (example / "payload.py").read_text(),
                                          "definitions.py": text.replace('mode="local"', 'mode="slurm"')})
    sessions, dagster_home = alice.home / "dagster_sessions" / uuid.uuid4().hex[:6], alice.home / "dagster_home"
    alice.run(["rm", "-rf", str(project)])
    alice.run(["cp", "-r", str(staged), str(project)])      # the user's own copy, made by the user
    alice.run(["mkdir", "-p", str(sessions), str(dagster_home)])
    defs = project / "definitions.py"
    cp = alice.run([str(alice.python.with_name("dagster")), "asset", "materialize", "-f", str(defs), "--select", "*"],
                   cwd=project, check=False, timeout=900,
                   extra_env={"ELASTIC_RAY_SESSION_ROOT": str(sessions), "DAGSTER_HOME": str(dagster_home)})
    logs = cp.stdout + cp.stderr
    assert cp.returncode == 0 and "RUN_SUCCESS" in logs and logs.count("ASSET_MATERIALIZATION") >= 2, logs[-4000:]
    runs = [p for p in sessions.iterdir() if (p / "session.json").is_file()]
    assert runs, "the run's session"
    for run in runs:
        wait_until(lambda: not {"PENDING", "RUNNING", "COMPLETING"} & set(peek(alice, run)["states"].values()),
                   timeout=120, message=f"{run.name}: the run's jobs ended")
        assert set(file_owners(run)) == {alice.uid}, file_owners(run)
