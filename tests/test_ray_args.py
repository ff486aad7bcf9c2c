"""Which ports and which `ray start` command a node gets: every rule, no Ray processes.

The last tests parse the built command lines with Ray's own click command
(`ray.scripts.scripts.start.make_context`), which checks that every option we
emit exists and shows which value Ray would actually use.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import pytest

from elastic_ray.errors import ConfigError
from elastic_ray.agent.node.ray_args import (
    AGENT_CONTROL_PORT,
    HASH_BLOCK_SIZE,
    HASH_OFFSETS,
    HASH_PAIRS,
    HASH_PORT_BASE,
    HASH_PORT_LIMIT,
    HEAD_ONLY_PORTS,
    MAX_TEMP_DIR_LEN,
    PORT_ENV,
    PORT_OPTIONS,
    RayStartCommand,
    build_ray_start,
    choose_ports,
    default_ray_executable,
    format_labels,
    hash_block_start,
    job_number,
    merge_options,
    option_name,
    slurm_cpus_on_node,
    slurm_memory_bytes,
    worker_gpus,
)
from elastic_ray.config import SlurmWorkerAllocationConfig as Alloc
from elastic_ray.config.launcher import RayLauncher


class FakeFreePort:
    """Hands out 40000, 40001, ...: what the OS does for ports that are really free."""

    def __init__(self, start: int = 40000):
        self.next = start
        self.calls = 0

    def __call__(self) -> int:
        self.calls += 1
        self.next += 1
        return self.next - 1


def no_free_port() -> int:
    raise AssertionError("free_port must not be called for this strategy")


# ----------------------------------------------------------------- choose_ports

RANDOM_HEAD_KEYS = {"gcs_port", "ray_client_server_port", "dashboard_port", "dashboard_agent_listen_port",
                    "metrics_export_port", "autoscaler_metric_port", "dashboard_metric_port", "min_worker_port",
                    "max_worker_port", AGENT_CONTROL_PORT}
RANDOM_WORKER_KEYS = {"dashboard_agent_listen_port", "metrics_export_port", "min_worker_port", "max_worker_port",
                      AGENT_CONTROL_PORT}


@pytest.mark.parametrize("role,keys,picked", [
    ("head", RANDOM_HEAD_KEYS, 7),
    ("worker", RANDOM_WORKER_KEYS, 2),
])
def test_random_picks_only_what_ray_cannot(role, keys, picked):
    fake = FakeFreePort()
    ports = choose_ports("random", "77", role, fake)
    assert set(ports) == keys
    assert fake.calls == picked
    # Ray picks these itself: left at 0 / unset.
    assert ports["min_worker_port"] == ports["max_worker_port"] == 0
    assert ports[AGENT_CONTROL_PORT] == 0
    # (metrics_export_port is picked although Ray could: the agent reads its node's GPU load there)
    for key in ("node_manager_port", "object_manager_port",
                "dashboard_agent_grpc_port", "runtime_env_agent_port"):
        assert key not in ports
    assert all(1024 <= v <= 65535 for k, v in ports.items() if v)


def test_random_never_gives_one_node_the_same_port_twice():
    answers = iter([41000, 41000, 41001, 41000, 41001, 41002, 41003, 41003, 41004, 41005, 41006])
    ports = choose_ports("random", "1", "head", lambda: next(answers))
    picked = [v for v in ports.values() if v]
    assert len(picked) == len(set(picked)) == 7


def test_random_gives_up_on_a_broken_free_port():
    with pytest.raises(RuntimeError, match="kept returning"):
        choose_ports("random", "1", "head", lambda: 41000)
    for bad in (0, 80, 70000, True, "41000"):
        with pytest.raises(ValueError, match="free_port"):
            choose_ports("random", "1", "worker", lambda bad=bad: bad)


def test_random_many_nodes_on_one_host_do_not_collide():
    """Two heads (the run's and an elected one) and six workers on one host."""
    fake = FakeFreePort()
    nodes = [choose_ports("random", str(100 + i), role, fake)
             for i, role in enumerate(["head", "head"] + ["worker"] * 6)]
    used = [v for ports in nodes for k, v in ports.items() if v]
    assert len(used) == len(set(used)) == 2 * 7 + 6 * 2
    # And the command lines carry those ports (nothing fixed slipped in).
    cmds = [_cmd(("head" if "gcs_port" in p else "worker"), ports=p) for p in nodes]
    seen = []
    for cmd in cmds:
        seen += [int(a.split("=")[1]) for a in cmd.argv if a.startswith("--") and "port=" in a and not
                 a.split("=")[1] == "0"]
        seen += [int(v) for k, v in cmd.env.items() if k in PORT_ENV.values()]
    assert sorted(seen) == sorted(used)


def test_fixed_uses_head_port_and_ray_defaults():
    assert choose_ports("fixed", "5", "head", no_free_port, head_port=6390) == {"gcs_port": 6390}
    assert choose_ports("fixed", "5", "worker", no_free_port, head_port=6390) == {}


@pytest.mark.parametrize("strategy,role", [("nope", "head"), ("random", "driver")])
def test_choose_ports_rejects_unknown_values(strategy, role):
    with pytest.raises(ValueError):
        choose_ports(strategy, "1", role, FakeFreePort())


# ----------------------------------------------------------------- hash_jobid

def test_hash_formula_by_hand():
    # 12345 mod 399 = 375 -> worker block 750, head block 751.
    assert HASH_PAIRS == 399
    assert hash_block_start("12345", "worker") == 20000 + 16 * 750 == 32000
    assert hash_block_start("12345", "head") == 32016
    ports = choose_ports("hash_jobid", "12345", "head", no_free_port)
    assert ports["gcs_port"] == 32016 and ports["dashboard_agent_listen_port"] == 32019
    assert ports[AGENT_CONTROL_PORT] == 32027
    assert ports["min_worker_port"] == ports["max_worker_port"] == 0


@pytest.mark.parametrize("role", ["head", "worker"])
def test_hash_is_stable_and_stays_in_range(role):
    for job in ["0", "1", "398", "399", "797", "123456789", "local-7", "abc"]:
        first = choose_ports("hash_jobid", job, role, no_free_port)
        assert first == choose_ports("hash_jobid", job, role, no_free_port)
        values = [v for v in first.values() if v]
        assert HASH_PORT_BASE <= min(values) and max(values) < HASH_PORT_LIMIT
        start = hash_block_start(job, role)
        assert all(start <= v < start + HASH_BLOCK_SIZE for v in values)
        # Head-only ports only on a head; a worker gets the node-level ones.
        assert (set(first) & HEAD_ONLY_PORTS == set()) == (role == "worker")


def test_hash_range_ends_below_linux_ephemeral_ports():
    last_block = 2 * (HASH_PAIRS - 1) + 1
    assert HASH_PORT_BASE + HASH_BLOCK_SIZE * (last_block + 1) <= HASH_PORT_LIMIT == 32768
    assert max(HASH_OFFSETS.values()) < HASH_BLOCK_SIZE


def _block(job: str, role: str) -> set[int]:
    return {v for v in choose_ports("hash_jobid", job, role, no_free_port).values() if v}


@pytest.mark.parametrize("job", ["1", "398", "399", "4242", "9999999", "local-1"])
def test_hash_head_and_worker_of_one_job_are_disjoint(job):
    assert not _block(job, "head") & _block(job, "worker")


def test_hash_neighbouring_jobs_are_disjoint():
    """Any HASH_PAIRS consecutive job ids: all their head and worker blocks are pairwise disjoint."""
    for base in (1, 1000, 54321):
        blocks = [_block(str(j), role) for j in range(base, base + HASH_PAIRS) for role in ("head", "worker")]
        union = set().union(*blocks)
        assert len(union) == sum(len(b) for b in blocks)
    # ...and the period is exactly HASH_PAIRS (documented, not hidden).
    assert _block("7", "worker") == _block(str(7 + HASH_PAIRS), "worker")


def test_job_number():
    assert job_number(" 42 ") == 42
    assert job_number("local-1") == job_number("local-1") != job_number("local-2")
    with pytest.raises(ValueError):
        job_number("  ")


# ----------------------------------------------------------------- build_ray_start helpers

LAUNCHER = RayLauncher()
TEMP = "/tmp/er-t/j1-w"
TOKEN = "/s/session/ray_token"


def _cmd(role="worker", *, launcher=LAUNCHER, allocation=None, ports=None, **kw) -> RayStartCommand:
    if ports is None:
        ports = choose_ports("random", "1", role, FakeFreePort())
    kw.setdefault("job_id", "1")
    kw.setdefault("node_ip", "127.0.0.3" if role == "worker" else "127.0.0.2")
    kw.setdefault("temp_dir", TEMP)
    if role == "worker":
        kw.setdefault("head_address", "127.0.0.2:6390")
    kw.setdefault("token_path", TOKEN)
    return build_ray_start(role, launcher=launcher, allocation=allocation, ports=ports,
                           ray_executable="/x/bin/ray", **kw)


def _opts(cmd: RayStartCommand) -> dict[str, str | None]:
    """Option -> value (last one), for options after 'start'."""
    out: dict[str, str | None] = {}
    for arg in cmd.argv[2:]:
        name, _, value = arg[2:].partition("=")
        out[name] = value if "=" in arg else None
    return out


def _count(cmd: RayStartCommand, name: str) -> int:
    return sum(1 for a in cmd.argv[2:] if option_name(a) == name)


# ----------------------------------------------------------------- head

def test_head_command():
    ports = choose_ports("random", "1", "head", FakeFreePort())
    cmd = _cmd("head", ports=ports)
    assert cmd.argv[:4] == ("/x/bin/ray", "start", "--head", "--block")
    opts = _opts(cmd)
    assert opts["num-cpus"] == "0" and opts["num-gpus"] == "0"
    assert opts["node-ip-address"] == "127.0.0.2" and opts["temp-dir"] == TEMP
    assert opts["include-dashboard"] == "false"
    assert opts["port"] == str(ports["gcs_port"])
    for key in ("ray_client_server_port", "dashboard_port", "dashboard_agent_listen_port"):
        assert opts[PORT_OPTIONS[key][2:]] == str(ports[key])
    assert opts["min-worker-port"] == opts["max-worker-port"] == "0"
    assert "disable-usage-stats" in opts
    for absent in ("address", "resources", "labels", "redis-password", "object-store-memory", "memory"):
        assert absent not in opts
    assert cmd.env["AUTOSCALER_METRIC_PORT"] == str(ports["autoscaler_metric_port"])
    assert cmd.env["DASHBOARD_METRIC_PORT"] == str(ports["dashboard_metric_port"])
    assert cmd.gcs_address == f"127.0.0.2:{ports['gcs_port']}"
    assert "RAY_gcs_rpc_server_reconnect_timeout_s" not in cmd.env
    assert "RAY_gcs_server_port_wait_time_s" not in cmd.env


def test_head_launcher_settings():
    launcher = RayLauncher(include_dashboard=True, object_store_memory=100_000_000, redis_password="pw",
                           ray_start_args=("--num-cpus=8", "--system-reserved-memory=1000000000"))
    cmd = _cmd("head", launcher=launcher, memory_bytes=2_000_000_000, labels={"elastic-ray.role": "head"})
    opts = _opts(cmd)
    assert opts["include-dashboard"] == "true"
    assert opts["object-store-memory"] == "100000000"
    # Never on a command line (Ray would pass it on to gcs_server's argv).
    assert "redis-password" not in opts and not any("pw" in a for a in cmd.argv)
    assert "pw" not in cmd.env.values()
    assert opts["memory"] == "2000000000"
    assert opts["labels"] == "elastic-ray.role=head"
    # The head advertises no CPU even if the launcher's shared args ask for some...
    assert opts["num-cpus"] == "0" and _count(cmd, "num-cpus") == 1
    # ...while the other shared args reach it.
    assert opts["system-reserved-memory"] == "1000000000"


def test_head_ignores_the_allocations_worker_settings():
    alloc = Alloc(ray_resources={"accelerator:a40": 1}, ray_start_args=("--num-cpus=8",), gpus_per_node=4)
    opts = _opts(_cmd("head", allocation=alloc))
    assert opts["num-cpus"] == "0" and opts["num-gpus"] == "0" and "resources" not in opts


def test_head_with_fixed_ports():
    cmd = _cmd("head", ports=choose_ports("fixed", "1", "head", no_free_port, head_port=6390))
    opts = _opts(cmd)
    assert opts["port"] == "6390"
    for absent in ("dashboard-port", "ray-client-server-port", "min-worker-port", "dashboard-agent-listen-port"):
        assert absent not in opts
    assert "AUTOSCALER_METRIC_PORT" not in cmd.env
    assert cmd.gcs_address == "127.0.0.2:6390"


# ----------------------------------------------------------------- worker

def test_worker_command():
    alloc = Alloc(ray_resources={"accelerator:a40": 1, "vram_48gb": 1}, gpus_per_node=4)
    cmd = _cmd("worker", allocation=alloc, num_cpus=32, memory_bytes=200 * 2**30, job_id="4711")
    assert cmd.argv[:4] == ("/x/bin/ray", "start", "--address=127.0.0.2:6390", "--block")
    opts = _opts(cmd)
    assert opts["num-cpus"] == "32" and opts["num-gpus"] == "4"
    assert json.loads(opts["resources"]) == {"dagster_slurm_worker": 1, "accelerator:a40": 1, "vram_48gb": 1}
    assert opts["labels"] == "slurm.job-id=4711"
    assert opts["memory"] == str(200 * 2**30)
    assert opts["min-worker-port"] == opts["max-worker-port"] == "0"
    for head_only in ("head", "port", "ray-client-server-port", "dashboard-port", "include-dashboard"):
        assert head_only not in opts
    assert cmd.gcs_address is None


def test_worker_resources_without_allocation_and_extra_labels():
    cmd = _cmd("worker", labels={"ray.io/accelerator-type": "A40"}, job_id="9")
    opts = _opts(cmd)
    assert json.loads(opts["resources"]) == {"dagster_slurm_worker": 1}
    assert opts["labels"] == "slurm.job-id=9,ray.io/accelerator-type=A40"
    assert "num-cpus" not in opts            # unknown: Ray counts the host's CPUs


@pytest.mark.parametrize("launcher_gpus,alloc_gpus,explicit,expected", [
    (0, None, None, 0), (3, None, None, 3), (3, 4, None, 4), (3, 0, None, 0), (3, 4, 1, 1),
])
def test_worker_gpus(launcher_gpus, alloc_gpus, explicit, expected):
    launcher = RayLauncher(num_gpus_per_node=launcher_gpus)
    alloc = Alloc(gpus_per_node=alloc_gpus)
    assert _opts(_cmd("worker", launcher=launcher, allocation=alloc, num_gpus=explicit))["num-gpus"] == str(expected)
    if explicit is None:
        assert worker_gpus(launcher, alloc) == expected


# ----------------------------------------------------------------- user args win

USER_WINS = [
    # (launcher args, allocation args, option, expected value, expected count)
    ((), ("--num-cpus=8",), "num-cpus", "8", 1),
    (("--num-cpus=6",), (), "num-cpus", "6", 1),
    (("--num-cpus=6",), ("--num-cpus=8",), "num-cpus", "8", 1),
    (("--object-store-memory=200000000",), (), "object-store-memory", "200000000", 1),
    ((), ("--object-store-memory=300000000",), "object-store-memory", "300000000", 1),
    ((), ("--memory=1000000000",), "memory", "1000000000", 1),
    ((), ("--disable-usage-stats",), "disable-usage-stats", None, 1),
    ((), ("--log-color=true",), "log-color", "true", 1),
]


@pytest.mark.parametrize("launcher_args,alloc_args,option,value,count", USER_WINS)
def test_user_args_win(launcher_args, alloc_args, option, value, count):
    launcher = RayLauncher(ray_start_args=launcher_args, object_store_memory=100_000_000)
    alloc = Alloc(ray_start_args=alloc_args)
    cmd = _cmd("worker", launcher=launcher, allocation=alloc, num_cpus=4, memory_bytes=5_000_000_000)
    assert _opts(cmd)[option] == value
    assert _count(cmd, option) == count
    # The allocation's args are the very last ones.
    if alloc_args:
        assert cmd.argv[-len(alloc_args):] == alloc_args


def test_merge_options():
    assert merge_options(["--a=1", "--b"], ["--a=2"], ["--c=3", "--c=4"]) == ("--b", "--a=2", "--c=3", "--c=4")
    assert merge_options(["--a=1"], [], ["--b=2"]) == ("--a=1", "--b=2")
    assert option_name("--num-cpus=8") == "num-cpus" and option_name("--block") == "block"
    with pytest.raises(ValueError):
        option_name("-v")


# ----------------------------------------------------------------- environment

@pytest.mark.parametrize("role", ["head", "worker"])
@pytest.mark.parametrize("auth", ["disabled", "token"])
def test_environment(role, auth):
    launcher = RayLauncher(auth_mode=auth, env={"OMP_NUM_THREADS": "1"})
    cmd = _cmd(role, launcher=launcher)
    env = cmd.env
    assert env["RAY_AUTH_MODE"] == auth
    assert env["RAY_USAGE_STATS_ENABLED"] == "0"
    assert env["RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S"] == "0"
    assert env["OMP_NUM_THREADS"] == "1"
    # The token file's path travels in the environment (token mode only);
    # an inherited RAY_AUTH_TOKEN is removed, since Ray would prefer it.
    assert env.get("RAY_AUTH_TOKEN_PATH") == (TOKEN if auth == "token" else None)
    assert "RAY_AUTH_TOKEN" not in env and "RAY_AUTH_TOKEN" in cmd.unset_env
    assert not any("ray_token" in a or "auth" in a for a in cmd.argv)
    if role == "worker":
        assert env["RAY_gcs_rpc_server_reconnect_timeout_s"] == "10"
        assert 1 <= int(env["RAY_gcs_server_port_wait_time_s"]) <= 10
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())


@pytest.mark.parametrize("role", ["head", "worker"])
def test_every_node_gets_the_runs_network_keepalive_and_the_users_own_wins(role):
    assert RayLauncher().network_keepalive_ms == 2000      # on by default (issue 24)
    env = _cmd(role, launcher=RayLauncher()).env
    assert env["RAY_grpc_client_keepalive_time_ms"] == env["RAY_grpc_keepalive_time_ms"] == "2000"
    assert env["RAY_grpc_client_keepalive_timeout_ms"] == env["RAY_grpc_keepalive_timeout_ms"] == "3000"
    env = _cmd(role, launcher=RayLauncher(network_keepalive_ms=1000,
                                          env={"RAY_grpc_keepalive_time_ms": "5000"})).env
    assert env["RAY_grpc_client_keepalive_time_ms"] == "1000" and env["RAY_grpc_keepalive_time_ms"] == "5000"
    env = _cmd(role, launcher=RayLauncher(network_keepalive_ms=None)).env
    assert not any("keepalive" in key for key in env)


@pytest.mark.parametrize("value", [0, 499, 600_001, 2000.0, True, "2000"])
def test_a_bad_network_keepalive_is_refused_by_name(value):
    with pytest.raises(ConfigError, match="^network_keepalive_ms="):
        RayLauncher(network_keepalive_ms=value)


# ----------------------------------------------------------------- refusals

@pytest.mark.parametrize("role,kw,match", [
    ("worker", {"node_ip": "127.0.0.1"}, "rewrites"),
    ("worker", {"node_ip": "localhost"}, "rewrites"),
    ("head", {"node_ip": "127.0.0.1"}, "rewrites"),
    ("worker", {"temp_dir": "tmp/rel"}, "absolute"),
    ("worker", {"temp_dir": "/tmp/" + "x" * MAX_TEMP_DIR_LEN}, "107-byte"),
    ("worker", {"head_address": None}, "head's ip:port"),
    ("worker", {"head_address": "127.0.0.2"}, "head's ip:port"),
    ("head", {"head_address": "127.0.0.2:6379"}, "for workers"),
    ("worker", {"num_cpus": -1}, "num_cpus"),
    ("worker", {"num_cpus": True}, "num_cpus"),
    ("worker", {"num_cpus": 2.5}, "num_cpus"),
    ("worker", {"num_gpus": -2}, "num_gpus"),
    ("worker", {"memory_bytes": 0}, "memory_bytes"),
    ("worker", {"object_store_bytes": 0}, "object_store_bytes"),
    ("worker", {"token_path": None}, "token_path"),
    ("head", {"token_path": "relative/ray_token"}, "token_path"),
    ("worker", {"labels": {"a,b": "1"}}, "label key"),
    ("worker", {"labels": {"k": "x=y"}}, "label k"),
    ("worker", {"labels": {"k": "a" * 64}}, "label k"),
    ("driver", {}, "role"),
])
def test_refused(role, kw, match):
    ports = kw.pop("ports", {"min_worker_port": 0, "max_worker_port": 0})
    with pytest.raises(ValueError, match=match):
        _cmd(role, ports=ports, **kw)


@pytest.mark.parametrize("key", sorted(HEAD_ONLY_PORTS))
def test_worker_refuses_head_only_ports(key):
    with pytest.raises(ValueError, match="head-only"):
        _cmd("worker", ports={key: 30000})


def test_unknown_port_key():
    with pytest.raises(ValueError, match="unknown port key"):
        _cmd("worker", ports={"bogus_port": 30000})


def test_temp_dir_limit_leaves_room_for_ray_sockets():
    assert 30 <= MAX_TEMP_DIR_LEN <= 50
    _cmd("worker", temp_dir="/" + "x" * (MAX_TEMP_DIR_LEN - 1))


def test_format_labels():
    assert format_labels({"slurm.job-id": "12", "ray.io/accelerator-type": "A40", "e": ""}) == \
        "slurm.job-id=12,ray.io/accelerator-type=A40,e="


# ----------------------------------------------------------------- Slurm facts and the executable

@pytest.mark.parametrize("environ,cpus,mem", [
    ({}, None, None),
    ({"SLURM_CPUS_ON_NODE": "16"}, 16, None),
    ({"SLURM_CPUS_ON_NODE": "x"}, None, None),
    ({"SLURM_CPUS_ON_NODE": "0"}, None, None),
    ({"SLURM_CPUS_ON_NODE": "4", "SLURM_MEM_PER_NODE": "8000"}, 4, 8000 * 2**20),
    ({"SLURM_CPUS_ON_NODE": "4", "SLURM_MEM_PER_CPU": "1000"}, 4, 4000 * 2**20),
    ({"SLURM_MEM_PER_CPU": "1000"}, None, None),
])
def test_slurm_facts(environ, cpus, mem):
    assert slurm_cpus_on_node(environ) == cpus
    assert slurm_memory_bytes(environ) == mem


def test_ray_executable_is_next_to_this_python():
    assert default_ray_executable() == str(Path(sys.executable).parent / "ray")
    cmd = build_ray_start("worker", job_id="1", node_ip="127.0.0.3", temp_dir=TEMP, launcher=LAUNCHER,
                          head_address="127.0.0.2:1234", ports={}, token_path=TOKEN)
    assert cmd.argv[0] == default_ray_executable()


# ----------------------------------------------------------------- what Ray's own CLI makes of it

@pytest.fixture(scope="module")
def ray_start_cli():
    scripts = pytest.importorskip("ray.scripts.scripts")
    return scripts.start


def _ray_params(cli, cmd: RayStartCommand) -> dict:
    return cli.make_context("start", list(cmd.argv[2:])).params


@pytest.mark.parametrize("strategy,role", list(itertools.product(["random", "hash_jobid", "fixed"],
                                                                 ["head", "worker"])))
def test_ray_cli_accepts_every_command(ray_start_cli, strategy, role):
    ports = choose_ports(strategy, "4711", role, FakeFreePort(), head_port=6390)
    launcher = RayLauncher(object_store_memory=100_000_000, redis_password="pw", include_dashboard=True)
    cmd = _cmd(role, launcher=launcher, ports=ports, memory_bytes=10**9, num_cpus=3,
               allocation=Alloc(ray_resources={"x": 2}))
    params = _ray_params(ray_start_cli, cmd)
    assert params["block"] is True and params["head"] is (role == "head")
    for key, option in PORT_OPTIONS.items():
        if key in ports:
            assert params[option[2:].replace("-", "_")] == ports[key]


def test_ray_cli_sees_the_users_values(ray_start_cli):
    launcher = RayLauncher(ray_start_args=("--num-cpus=6", "--object-store-memory=200000000"),
                           object_store_memory=100_000_000)
    alloc = Alloc(ray_start_args=("--num-cpus=8",), ray_resources={"accelerator:a40": 1})
    cmd = _cmd("worker", launcher=launcher, allocation=alloc, num_cpus=4, num_gpus=2)
    params = _ray_params(ray_start_cli, cmd)
    assert params["num_cpus"] == 8
    assert params["object_store_memory"] == 200_000_000
    assert params["num_gpus"] == 2
    assert json.loads(params["resources"]) == {"dagster_slurm_worker": 1, "accelerator:a40": 1}
    assert params["labels"] == "slurm.job-id=1"


def test_click_itself_lets_the_last_repeat_win(ray_start_cli):
    """Documents the CLI behaviour merge_options does not rely on (but agrees with)."""
    params = ray_start_cli.make_context("start", ["--num-cpus=2", "--num-cpus=8"]).params
    assert params["num_cpus"] == 8
