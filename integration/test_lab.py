"""Real jobs against the multi-node Slurm lab: does it behave like a small cluster?

No fixed sleeps: everything that waits polls with a deadline, and every subprocess has a
timeout, so a broken lab fails in bounded time even without pytest-timeout.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

# tests/helpers.py, loaded by path: a plain `import helpers` could pick up
# another directory's module of the same name.
_spec = importlib.util.spec_from_file_location(
    "elastic_ray_tests_helpers", Path(__file__).resolve().parent.parent / "tests" / "helpers.py")
_helpers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_helpers)
wait_until = _helpers.wait_until

pytestmark = pytest.mark.slurm

PY = sys.executable  # nodes share the host's filesystem (except /tmp), so this path works there
FINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                "BOOT_FAIL", "DEADLINE", "PREEMPTED"}


# --------------------------------------------------------------------------- helpers


def run(*cmd: str, timeout: float = 60, check: bool = True) -> subprocess.CompletedProcess:
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                        stdin=subprocess.DEVNULL)
    if check and cp.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} -> rc={cp.returncode}\nstdout: {cp.stdout}\n"
                             f"stderr: {cp.stderr}")
    return cp


def job_state(job_id: str) -> str:
    # -t all keeps finished jobs visible (for MinJobAge seconds).
    cp = run("squeue", "-h", "-j", job_id, "-t", "all", "-o", "%T", check=False)
    return cp.stdout.strip()


def wait_final(job_id: str, timeout: float = 60) -> str:
    return wait_until(lambda: (st := job_state(job_id)) in FINAL_STATES and st, timeout, 0.2,
                      f"job {job_id} to finish")


class Jobs:
    """Submits jobs and cancels, by id, everything it submitted when the test ends."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.names: list[str] = []

    def new_name(self) -> str:
        name = f"erlab-test-{uuid.uuid4().hex[:8]}"
        self.names.append(name)
        return name

    def sbatch(self, *args: str) -> str:
        cp = run("sbatch", "--parsable", f"--job-name={self.new_name()}", *args, timeout=30)
        job_id = cp.stdout.strip().split(";")[0]
        self.ids.append(job_id)
        return job_id

    def srun(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess:
        # srun blocks; if it hangs, cleanup() still finds its job through the unique name.
        return run("srun", f"--job-name={self.new_name()}", *args, timeout=timeout)

    def cleanup(self) -> None:
        ids = set(self.ids)
        for name in self.names:
            cp = run("squeue", "-h", "-n", name, "-o", "%i", check=False)
            ids.update(cp.stdout.split())
        if ids:
            run("scancel", *sorted(ids), check=False)


@pytest.fixture
def jobs(slurm_lab):
    j = Jobs()
    try:
        yield j
    finally:
        j.cleanup()


def sinfo_rows() -> list[dict[str, str]]:
    cp = run("sinfo", "-h", "-N", "-o", "%N|%R|%t|%G|%P")
    keys = ("node", "partition", "state", "gres", "partition_flagged")
    return [dict(zip(keys, line.split("|"))) for line in cp.stdout.splitlines() if line]


# --------------------------------------------------------------------------- tests


def test_sinfo_shows_partitions_and_idle_nodes(slurm_lab):
    want = {n.name: n for n in slurm_lab.nodes}

    def all_idle():
        rows = sinfo_rows()
        ok = {r["node"] for r in rows} == set(want) and all(r["state"] == "idle" for r in rows)
        return rows if ok else None

    rows = wait_until(all_idle, 30, 0.2, "every lab node to be idle")
    assert {r["partition"] for r in rows} == {"cpu", "gpu-a", "gpu-b"} == slurm_lab.partitions
    assert len({r["node"] for r in rows}) == len(slurm_lab.nodes) >= 4
    assert {"cpu-1", "cpu-2", "gpua-1", "gpub-1"} <= set(want)
    by_node = {r["node"]: r for r in rows}
    assert by_node["cpu-1"]["partition_flagged"] == "cpu*"  # the default partition
    assert by_node["gpua-1"]["gres"].startswith("gpu:a40:4")
    assert by_node["gpub-1"]["gres"].startswith("gpu:h100:2")
    assert by_node["cpu-1"]["gres"] == "(null)"


def test_two_node_batch_job_runs_on_both_cpu_nodes(slurm_lab, jobs):
    work = slurm_lab.shared_dir(f"batch-{uuid.uuid4().hex[:8]}")
    script = work / "job.sh"
    script.write_text("#!/bin/sh\nsrun hostname\n")
    out = work / "out.txt"
    job_id = jobs.sbatch("-p", "cpu", "-N", "2", "-o", str(out), "-D", str(work), str(script))

    state = wait_final(job_id, 60)
    output = out.read_text() if out.exists() else "<no output file>"
    assert state == "COMPLETED", output
    assert sorted(output.split()) == ["cpu-1", "cpu-2"]


def test_gpu_partition_gives_cpus_and_gpus(slurm_lab, jobs):
    cp = jobs.srun("-p", "gpu-a", "--gpus-per-node=2", "-c", "2", "sh", "-c",
                   'echo "CPUS=$SLURM_CPUS_ON_NODE"; echo "GPUS=$CUDA_VISIBLE_DEVICES"; hostname')
    lines = cp.stdout.split()
    assert "CPUS=2" in lines, cp.stdout
    gpus = next(x for x in lines if x.startswith("GPUS=")).removeprefix("GPUS=")
    assert len([g for g in gpus.split(",") if g]) == 2, cp.stdout
    assert lines[-1] == "gpua-1"


NODE_IDENTITY = r"""
import json, socket, sys
name = socket.gethostname()
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
udp.connect((sys.argv[1], 9))  # a UDP connect sends nothing; it only picks the source address
outside = None
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM).connect(("198.51.100.1", 9))
except OSError as e:
    outside = e.errno
print(json.dumps({"hostname": name, "resolved": socket.gethostbyname(name),
                  "source_ip": udp.getsockname()[0], "outside_errno": outside}))
"""


def test_node_has_own_hostname_ip_and_no_route_out(slurm_lab, jobs):
    node = slurm_lab.node("cpu-2")
    ctl_ip = node.ip.rsplit(".", 1)[0] + ".1"
    cp = jobs.srun("-p", "cpu", "-w", node.name, "-N1", "-n1", PY, "-c", NODE_IDENTITY, ctl_ip)
    seen = json.loads(cp.stdout.strip().splitlines()[-1])
    assert seen["hostname"] == "cpu-2"
    assert seen["source_ip"] == node.ip  # the node's own veth address
    assert seen["resolved"] == node.ip  # /etc/hosts block, which Ray's IP fallback relies on
    assert seen["outside_errno"] == errno.ENETUNREACH  # no default route inside a node


WRITE_TMP = r"""
import os, socket, sys
with open(sys.argv[1], "w") as f:
    f.write(socket.gethostname())
print(os.path.exists(sys.argv[1]))
"""
CHECK_TMP = "import os, sys; print(os.path.exists(sys.argv[1]))"


def test_node_tmp_is_private(slurm_lab, jobs):
    if not slurm_lab.private_tmp:
        pytest.skip("private /tmp is off for this lab (checkout or python under /tmp)")
    name = f"erlab-private-{uuid.uuid4().hex[:8]}"
    in_node = f"/tmp/{name}"
    on_host_view = slurm_lab.lab_dir / "nodes" / "cpu-2" / "tmp" / name
    try:
        cp = jobs.srun("-p", "cpu", "-w", "cpu-2", "-N1", "-n1", PY, "-c", WRITE_TMP, in_node)
        assert cp.stdout.split() == ["True"]
        assert not Path(in_node).exists(), "a node's /tmp leaked into the host's /tmp"
        assert on_host_view.read_text() == "cpu-2"  # it went to cpu-2's own dir
        other = jobs.srun("-p", "cpu", "-w", "cpu-1", "-N1", "-n1", PY, "-c", CHECK_TMP, in_node)
        assert other.stdout.split() == ["False"], "cpu-1 sees cpu-2's /tmp"
    finally:
        on_host_view.unlink(missing_ok=True)


LISTENER = r"""
import socket, sys
srv = socket.create_server(("0.0.0.0", int(sys.argv[1])))
srv.settimeout(30)
conn, peer = srv.accept()
conn.sendall(f"hello from {socket.gethostname()} to {peer[0]}".encode())
conn.close()
"""
CLIENT = r"""
import socket, sys, time
deadline = time.monotonic() + 20
while True:
    try:
        with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2) as c:
            data = b""
            while chunk := c.recv(4096):
                data += chunk
        break
    except OSError:  # the listener may not be bound yet
        if time.monotonic() > deadline:
            raise
        time.sleep(0.1)
print(data.decode(), "| client", socket.gethostname())
"""


def test_tcp_between_nodes(slurm_lab, jobs):
    port = "47811"
    job_id = jobs.sbatch("-p", "cpu", "-N", "2", "-o", "/dev/null", "--wrap", "sleep 300")
    wait_until(lambda: job_state(job_id) == "RUNNING", 30, 0.2, f"job {job_id} to run")

    step = ("srun", f"--jobid={job_id}", "--overlap", "-N1", "-n1")
    listener = subprocess.Popen([*step, "-w", "cpu-2", PY, "-c", LISTENER, port],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        cp = run(*step, "-w", "cpu-1", PY, "-c", CLIENT, "cpu-2", port, timeout=60)
        assert cp.stdout.strip() == f"hello from cpu-2 to {slurm_lab.node('cpu-1').ip} | client cpu-1"
        _, err = listener.communicate(timeout=30)
        assert listener.returncode == 0, err
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.communicate()


ACCT_FIELDS = "JobID,State,NNodes,AllocTRES,ElapsedRaw,TotalCPU"


def accounting_on() -> bool:
    cp = run("scontrol", "show", "config")
    return "accounting_storage/slurmdbd" in cp.stdout


def sacct_job(job_id: str, *prefix: str) -> dict[str, str] | None:
    """sacct's line of the job itself (not its steps), or None when slurmdbd has no record of it yet."""
    cp = run(*prefix, "sacct", "-n", "-P", f"--format={ACCT_FIELDS}", f"--jobs={job_id}", timeout=60)
    for line in cp.stdout.splitlines():
        row = dict(zip(ACCT_FIELDS.split(","), line.split("|")))
        if row["JobID"] == job_id:
            return row
    return None


def test_accounting_answers_with_a_finished_job_s_figures(slurm_lab, jobs):
    """slurmdbd (and the lab's MariaDB behind it) records a job: sacct shows it, from the host and
    from inside a node, with the resources it was given and CPU time it used, soon after its end."""
    if not accounting_on():
        pytest.skip("this lab runs without accounting (ELASTIC_RAY_LAB_ACCOUNTING=0)")
    job_id = jobs.sbatch("-p", "gpu-a", "-c", "2", "--gpus-per-node=1", "-o", "/dev/null", "--wrap",
                         f"{PY} -c 'sum(range(20_000_000))'")
    assert wait_final(job_id, 60) == "COMPLETED"
    # slurmctld tells slurmdbd of the end a moment later: until then sacct may still say RUNNING.
    row = wait_until(lambda: (r := sacct_job(job_id)) and r["State"] == "COMPLETED" and r, 30, 0.5,
                     f"sacct to record the end of job {job_id}")
    tres = dict(item.split("=", 1) for item in row["AllocTRES"].split(","))
    assert (row["NNodes"], tres["cpu"], tres["gres/gpu"]) == ("1", "2", "1"), row
    assert int(row["ElapsedRaw"]) >= 0 and row["TotalCPU"] not in ("", "00:00:00"), row
    # Reachable from inside a node too (AccountingStorageHost=slurmctl, the bridge address).
    inside = jobs.srun("-p", "cpu", "sacct", "-n", "-P", f"--format={ACCT_FIELDS}", f"--jobs={job_id}")
    assert any(line.split("|")[:2] == [job_id, "COMPLETED"] for line in inside.stdout.splitlines()), inside.stdout
