"""A Ray node's memory and object store come from what Slurm granted: every rule of plan_memory, no Ray."""

from __future__ import annotations

import pytest

from elastic_ray.agent.node.ray_memory import (
    CGROUP_UNLIMITED,
    GIB,
    HEAD_SHARE_MAX,
    MIB,
    OBJECT_STORE_MIN,
    MemoryPlan,
    cgroup_memory_limit,
    head_share,
    plan_memory,
    read_cgroup_limit,
    shm_free_bytes,
    user_memory_options,
)

BIG_SHM = 24 * GIB
V1_UNLIMITED = 9223372036854771712     # what an unlimited v1 cgroup reads


def _plan(environ=None, *, cgroup=None, shm=BIG_SHM, store=None, args=(), share="whole") -> MemoryPlan:
    return plan_memory(environ or {}, cgroup_limit=cgroup, shm_free=shm, launcher_object_store=store,
                       user_args=args, share=share)


def _default_store(part: int) -> int:
    return max(OBJECT_STORE_MIN, int(part * 0.3))


G1 = 1024 * MIB
# (name, environ, kwargs, expected (grant, source, share, memory, object_store))
TABLE = [
    ("nothing known: Ray's defaults", {}, {}, (None, "none", None, None, None)),
    ("nothing known, launcher store", {}, {"store": 100_000_000}, (None, "none", None, None, 100_000_000)),
    ("nothing known, user values", {}, {"args": ("--memory=5000000000", "--object-store-memory=90000000")},
     (None, "none", None, 5_000_000_000, 90_000_000)),
    ("--mem=1G (the lab's case: not 7.6 GB)", {"SLURM_MEM_PER_NODE": "1024"}, {},
     (G1, "SLURM_MEM_PER_NODE", G1, G1 - _default_store(G1), _default_store(G1))),
    ("--mem-per-cpu x CPUs", {"SLURM_MEM_PER_CPU": "512", "SLURM_CPUS_ON_NODE": "4"}, {},
     (2 * GIB, "SLURM_MEM_PER_CPU", 2 * GIB, 2 * GIB - _default_store(2 * GIB), _default_store(2 * GIB))),
    ("--mem-per-cpu without a CPU count", {"SLURM_MEM_PER_CPU": "512"}, {}, (None, "none", None, None, None)),
    ("per node wins over per CPU", {"SLURM_MEM_PER_NODE": "1024", "SLURM_MEM_PER_CPU": "4096",
                                    "SLURM_CPUS_ON_NODE": "8"}, {},
     (G1, "SLURM_MEM_PER_NODE", G1, G1 - _default_store(G1), _default_store(G1))),
    ("garbage Slurm values", {"SLURM_MEM_PER_NODE": "1G", "SLURM_MEM_PER_CPU": "-1", "SLURM_CPUS_ON_NODE": "4"}, {},
     (None, "none", None, None, None)),
    ("a lower cgroup limit wins", {"SLURM_MEM_PER_NODE": "4096"}, {"cgroup": G1},
     (G1, "cgroup", G1, G1 - _default_store(G1), _default_store(G1))),
    ("a higher cgroup limit does not", {"SLURM_MEM_PER_NODE": "1024"}, {"cgroup": 8 * GIB},
     (G1, "SLURM_MEM_PER_NODE", G1, G1 - _default_store(G1), _default_store(G1))),
    ("an unlimited cgroup is no limit", {"SLURM_MEM_PER_NODE": "1024"}, {"cgroup": V1_UNLIMITED},
     (G1, "SLURM_MEM_PER_NODE", G1, G1 - _default_store(G1), _default_store(G1))),
    ("cgroup only (no Slurm memory)", {}, {"cgroup": 2 * GIB},
     (2 * GIB, "cgroup", 2 * GIB, 2 * GIB - _default_store(2 * GIB), _default_store(2 * GIB))),
    ("/dev/shm smaller than 30 %", {"SLURM_MEM_PER_NODE": "4096"}, {"shm": 200 * MIB},
     (4 * GIB, "SLURM_MEM_PER_NODE", 4 * GIB, 4 * GIB - int(200 * MIB * 0.95), int(200 * MIB * 0.95))),
    ("/dev/shm unknown: no cap", {"SLURM_MEM_PER_NODE": "4096"}, {"shm": None},
     (4 * GIB, "SLURM_MEM_PER_NODE", 4 * GIB, 4 * GIB - _default_store(4 * GIB), _default_store(4 * GIB))),
    ("/dev/shm tiny: Ray's minimum store", {"SLURM_MEM_PER_NODE": "4096"}, {"shm": 10 * MIB},
     (4 * GIB, "SLURM_MEM_PER_NODE", 4 * GIB, 4 * GIB - OBJECT_STORE_MIN, OBJECT_STORE_MIN)),
    ("tiny grant: minimum store, a tenth for the heap at least", {"SLURM_MEM_PER_NODE": "100"}, {},
     (100 * MIB, "SLURM_MEM_PER_NODE", 100 * MIB, 100 * MIB - OBJECT_STORE_MIN, OBJECT_STORE_MIN)),
    ("launcher store inside the grant", {"SLURM_MEM_PER_NODE": "1024"}, {"store": 100_000_000},
     (G1, "SLURM_MEM_PER_NODE", G1, G1 - 100_000_000, 100_000_000)),
    ("launcher store is not capped by /dev/shm", {"SLURM_MEM_PER_NODE": "1024"},
     {"store": 100_000_000, "shm": 10 * MIB}, (G1, "SLURM_MEM_PER_NODE", G1, G1 - 100_000_000, 100_000_000)),
    ("launcher store above the grant: heap keeps a tenth", {"SLURM_MEM_PER_NODE": "1024"}, {"store": 2 * GIB},
     (G1, "SLURM_MEM_PER_NODE", G1, int(G1 * 0.1), 2 * GIB)),
    ("user store beats the launcher's", {"SLURM_MEM_PER_NODE": "1024"},
     {"store": 100_000_000, "args": ("--object-store-memory=300000000",)},
     (G1, "SLURM_MEM_PER_NODE", G1, G1 - 300_000_000, 300_000_000)),
    ("user memory wins; the store stays 30 %", {"SLURM_MEM_PER_NODE": "1024"}, {"args": ("--memory=123456789",)},
     (G1, "SLURM_MEM_PER_NODE", G1, 123_456_789, _default_store(G1))),
    ("the last user value wins", {"SLURM_MEM_PER_NODE": "1024"},
     {"args": ("--memory=1", "--num-cpus=2", "--memory=2000000")},
     (G1, "SLURM_MEM_PER_NODE", G1, 2_000_000, _default_store(G1))),
    ("a malformed user value is not read", {"SLURM_MEM_PER_NODE": "1024"}, {"args": ("--memory=lots",)},
     (G1, "SLURM_MEM_PER_NODE", G1, G1 - _default_store(G1), _default_store(G1))),
    ("hosted head: a quarter of the grant", {"SLURM_MEM_PER_NODE": "8192"}, {"share": "hosted_head"},
     (8 * GIB, "SLURM_MEM_PER_NODE", 2 * GIB, 2 * GIB - _default_store(2 * GIB), _default_store(2 * GIB))),
    ("worker beside a hosted head: the rest", {"SLURM_MEM_PER_NODE": "8192"}, {"share": "worker_beside_head"},
     (8 * GIB, "SLURM_MEM_PER_NODE", 6 * GIB, 6 * GIB - _default_store(6 * GIB), _default_store(6 * GIB))),
    ("hosted head on a big node: capped", {"SLURM_MEM_PER_NODE": str(64 * 1024)}, {"share": "hosted_head"},
     (64 * GIB, "SLURM_MEM_PER_NODE", HEAD_SHARE_MAX, HEAD_SHARE_MAX - _default_store(HEAD_SHARE_MAX),
      _default_store(HEAD_SHARE_MAX))),
    ("worker beside a head on a big node", {"SLURM_MEM_PER_NODE": str(64 * 1024)}, {"share": "worker_beside_head"},
     (64 * GIB, "SLURM_MEM_PER_NODE", 60 * GIB, 60 * GIB - _default_store(60 * GIB), _default_store(60 * GIB))),
    ("hosted head under a cgroup limit", {"SLURM_MEM_PER_NODE": "8192"}, {"cgroup": 4 * GIB, "share": "hosted_head"},
     (4 * GIB, "cgroup", GIB, GIB - _default_store(GIB), _default_store(GIB))),
    ("hosted head on a small node: at least 256 MiB", {"SLURM_MEM_PER_NODE": "768"}, {"share": "hosted_head"},
     (768 * MIB, "SLURM_MEM_PER_NODE", 256 * MIB, 256 * MIB - _default_store(256 * MIB), _default_store(256 * MIB))),
    ("hosted head on a tiny node: half", {"SLURM_MEM_PER_NODE": "256"}, {"share": "hosted_head"},
     (256 * MIB, "SLURM_MEM_PER_NODE", 128 * MIB, 128 * MIB - OBJECT_STORE_MIN, OBJECT_STORE_MIN)),
    ("hosted head, nothing known", {}, {"share": "hosted_head"}, (None, "none", None, None, None)),
]


@pytest.mark.parametrize("environ,kwargs,expected", [t[1:] for t in TABLE], ids=[t[0] for t in TABLE])
def test_plan_memory_table(environ, kwargs, expected):
    plan = _plan(environ, **kwargs)
    assert (plan.grant, plan.source, plan.share, plan.memory, plan.object_store) == expected


@pytest.mark.parametrize("mb", [300, 1024, 3000, 8192, 100_000])
@pytest.mark.parametrize("share", ["whole", "hosted_head", "worker_beside_head"])
def test_without_explicit_values_memory_and_store_add_up_to_the_share(mb, share):
    plan = _plan({"SLURM_MEM_PER_NODE": str(mb)}, share=share)
    assert plan.memory + plan.object_store == plan.share
    assert plan.object_store >= OBJECT_STORE_MIN


@pytest.mark.parametrize("mb", [256, 1024, 8192, 64 * 1024, 1024 * 1024])
def test_head_and_worker_never_take_more_than_the_grant_together(mb):
    env = {"SLURM_MEM_PER_NODE": str(mb)}
    head, worker = _plan(env, share="hosted_head"), _plan(env, share="worker_beside_head")
    assert head.share + worker.share == mb * MIB
    assert head.memory + head.object_store + worker.memory + worker.object_store == mb * MIB
    assert head.share == head_share(mb * MIB) <= min(HEAD_SHARE_MAX, mb * MIB // 2)


def test_unknown_share_is_refused():
    with pytest.raises(ValueError, match="share"):
        _plan({"SLURM_MEM_PER_NODE": "1024"}, share="head")


def test_user_memory_options():
    assert user_memory_options(()) == (None, None)
    assert user_memory_options(("--memory=10", "--object-store-memory=20", "--num-cpus=3")) == (10, 20)
    assert user_memory_options(("--memory=0", "--object-store-memory=x")) == (None, None)


# ----------------------------------------------------------------- cgroup limits

HYBRID_MOUNTS = """tmpfs /sys/fs/cgroup tmpfs rw,relatime,mode=755 0 0
cgroup /sys/fs/cgroup/cpu cgroup rw,relatime,cpu 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime 0 0\n"


def test_cgroup_v1_job_limit_with_unlimited_parents():
    """Slurm's task/cgroup on v1: the job's cgroup has the limit, its parents none."""
    proc = "4:memory:/slurm/uid_1000/job_42/step_0\n1:cpu:/\n0::/\n"
    files = {"/sys/fs/cgroup/memory/slurm/uid_1000/job_42/step_0/memory.limit_in_bytes": str(V1_UNLIMITED),
             "/sys/fs/cgroup/memory/slurm/uid_1000/job_42/memory.limit_in_bytes": str(2 * GIB),
             "/sys/fs/cgroup/memory/slurm/memory.limit_in_bytes": str(V1_UNLIMITED),
             "/sys/fs/cgroup/memory/memory.limit_in_bytes": str(V1_UNLIMITED)}
    assert cgroup_memory_limit(proc, HYBRID_MOUNTS, files.get) == 2 * GIB


def test_cgroup_v2_lowest_of_the_chain():
    proc = "0::/system.slice/slurmstepd.scope/job_7/step_batch/user/task_0\n"
    base = "/sys/fs/cgroup/system.slice/slurmstepd.scope/job_7"
    files = {f"{base}/step_batch/user/task_0/memory.max": "max", f"{base}/step_batch/memory.max": str(3 * GIB),
             f"{base}/memory.max": str(4 * GIB), "/sys/fs/cgroup/memory.max": "max"}
    assert cgroup_memory_limit(proc, V2_MOUNTS, files.get) == 3 * GIB


@pytest.mark.parametrize("proc,mounts,files", [
    ("0::/\n", V2_MOUNTS, {"/sys/fs/cgroup/memory.max": "max"}),
    ("4:memory:/x\n", HYBRID_MOUNTS, {"/sys/fs/cgroup/memory/x/memory.limit_in_bytes": str(CGROUP_UNLIMITED)}),
    ("4:memory:/x\n", HYBRID_MOUNTS, {}),                            # unreadable
    ("4:memory:/x\n", V2_MOUNTS, {"/sys/fs/cgroup/memory/x/memory.limit_in_bytes": "1000"}),  # no v1 mount
    ("garbage\n", HYBRID_MOUNTS, {}),
    ("0::/../../etc\n", V2_MOUNTS, {"/etc/memory.max": "1"}),          # no escape from the mount
])
def test_cgroup_without_a_limit(proc, mounts, files):
    assert cgroup_memory_limit(proc, mounts, files.get) is None


def test_readers_run_here():
    """The impure readers work on this host (a number or None, never an error)."""
    limit = read_cgroup_limit()
    assert limit is None or 0 < limit < CGROUP_UNLIMITED
    free = shm_free_bytes()
    assert free is None or free >= 0
    assert shm_free_bytes("/nonexistent/shm") is None
