"""The node address an agent binds Ray to: the launcher's network_interface or
node_ip_address_command, resolved on the node (agent/node/node_address.py), and
the launcher's checks of those fields and of python_executable."""

from __future__ import annotations

import socket
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from elastic_ray.agent import cli as agent_cli
from elastic_ray.agent.node.node_address import (
    NodeAddressError,
    command_address,
    interface_address,
    resolve_node_address,
)
from elastic_ray.config.launcher import RayLauncher
from elastic_ray.errors import ConfigError
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir


def _addr(family, address):
    return SimpleNamespace(family=family, address=address)


FAKE_TABLE = {
    "lo": [_addr(socket.AF_INET, "127.0.0.1")],
    "ib0": [_addr(socket.AF_INET6, "fe80::1"), _addr(socket.AF_INET, "10.20.0.7")],
    "eth9": [_addr(socket.AF_INET6, "fe80::2")],
}


# ---------------------------------------------------------------- network_interface

def test_the_real_loopback_interface_gives_127_0_0_1_which_ray_refuses():
    with pytest.raises(NodeAddressError) as caught:
        interface_address("lo", "node-a")
    message = str(caught.value)
    assert "node node-a" in message and "network_interface 'lo'" in message and "127.0.0.1" in message
    assert "\n" not in message


def test_an_unknown_interface_names_the_ones_this_node_has():
    with pytest.raises(NodeAddressError) as caught:
        interface_address("nosuch0", "node-a")
    message = str(caught.value)
    assert "'nosuch0' does not exist" in message and "available:" in message
    assert "lo" in message.split("available:")[1]   # the real table, read through psutil


def test_the_first_ipv4_address_of_the_interface_is_taken():
    assert interface_address("ib0", "n", interfaces=lambda: FAKE_TABLE) == "10.20.0.7"


def test_an_interface_without_ipv4_names_those_that_have_one():
    with pytest.raises(NodeAddressError, match=r"'eth9' has no IPv4 address \(interfaces with one: ib0, lo\)"):
        interface_address("eth9", "n", interfaces=lambda: FAKE_TABLE)


# ---------------------------------------------------------------- node_ip_address_command

def test_a_command_gives_the_first_line_it_prints():
    assert command_address("echo 127.0.0.5", "n") == "127.0.0.5"
    assert command_address("printf '10.1.2.3\\nnoise\\n'", "n") == "10.1.2.3"


def test_the_command_sees_the_agent_environment():
    assert command_address('echo "127.0.0.$((40 + SLURM_NODEID))"', "n",
                           env={"PATH": "/usr/bin:/bin", "SLURM_NODEID": "2"}) == "127.0.0.42"


def test_a_failing_command_names_itself_its_status_and_its_stderr():
    with pytest.raises(NodeAddressError) as caught:
        command_address("echo no route >&2; echo more >&2; exit 3", "node-b")
    message = str(caught.value)
    assert message == ("node node-b: node_ip_address_command 'echo no route >&2; echo more >&2; exit 3' "
                       "exited with status 3: no route | more")


def test_a_command_that_hangs_is_stopped_with_a_clear_error():
    with pytest.raises(NodeAddressError, match=r"node n: node_ip_address_command 'sleep 30' did not finish within 0.3s"):
        command_address("sleep 30", "n", timeout=0.3)


@pytest.mark.parametrize("command, words", [
    ("echo hello", "printed 'hello' as its first line, not an IP address"),
    ("true", "printed nothing"),
    ("echo 127.0.0.1", "gives 127.0.0.1, which Ray cannot bind to"),
])
def test_what_a_command_prints_must_be_an_address_ray_can_bind(command, words):
    with pytest.raises(NodeAddressError) as caught:
        command_address(command, "n")
    assert words in str(caught.value) and f"node_ip_address_command {command!r}" in str(caught.value)


# ---------------------------------------------------------------- order

def test_the_launcher_setting_wins_over_the_environment_which_wins_over_the_host_name():
    env = {"ELASTIC_RAY_NODE_IP": "127.0.0.9", "PATH": "/usr/bin:/bin"}
    assert resolve_node_address("n", node_ip_address_command="echo 127.0.0.5", environ=env) == "127.0.0.5"
    assert resolve_node_address("n", environ=env) == "127.0.0.9"
    with pytest.raises(NodeAddressError, match="network_interface 'lo'"):
        resolve_node_address("n", network_interface="lo", environ=env)


# ---------------------------------------------------------------- the launcher's checks

@pytest.mark.parametrize("kwargs, field", [
    ({"python_executable": "python3"}, "python_executable"),
    ({"python_executable": "./venv/bin/python"}, "python_executable"),
    ({"python_executable": ""}, "python_executable"),
    ({"network_interface": "ib 0"}, "network_interface"),
    ({"network_interface": "a/b"}, "network_interface"),
    ({"network_interface": ""}, "network_interface"),
    ({"node_ip_address_command": "echo 'unclosed"}, "node_ip_address_command"),
    ({"node_ip_address_command": "echo a\necho b"}, "node_ip_address_command"),
    ({"node_ip_address_command": "  "}, "node_ip_address_command"),
    ({"network_interface": "ib0", "node_ip_address_command": "echo 10.0.0.1"}, "node_ip_address_command"),
])
def test_the_launcher_refuses_bad_node_settings_naming_the_field(kwargs, field):
    with pytest.raises(ConfigError) as caught:
        RayLauncher(**kwargs)
    assert caught.value.field == field


def test_both_address_settings_at_once_say_to_choose_one():
    with pytest.raises(ConfigError, match="cannot be set together with network_interface='ib0'; choose one"):
        RayLauncher(network_interface="ib0", node_ip_address_command="echo 10.0.0.1")


def test_the_node_settings_survive_session_json():
    launcher = RayLauncher(python_executable="/opt/venv/bin/python", network_interface="ib0")
    assert RayLauncher.from_dict(launcher.to_dict()) == launcher
    other = RayLauncher(node_ip_address_command="hostname -I | cut -d' ' -f1")
    assert RayLauncher.from_dict(other.to_dict()) == other
    # An older session.json: today's defaults, except what its nodes were started without (no
    # standby, Ray's own keepalive).
    assert RayLauncher.from_dict({}) == RayLauncher(standby_head=False, network_keepalive_ms=None)


def test_the_agent_runs_under_the_launcher_interpreter(tmp_path):
    from elastic_ray.config import SlurmRunAllocationConfig, SlurmWorkerAllocationConfig
    from elastic_ray.coordinator.allocations import submit

    directory = _session_dir(tmp_path, RayLauncher())
    head = SlurmRunAllocationConfig(partition="cpu", time_limit="60")
    launcher = RayLauncher(python_executable="/opt/site/venv/bin/python")
    assert submit.head_spec(directory, "er-x", head, launcher).node_argv[:3] == (
        "/opt/site/venv/bin/python", "-m", "elastic_ray.agent")
    worker = submit.worker_spec(directory, "er-x", SlurmWorkerAllocationConfig(partition="cpu"), launcher,
                                tmp_path / "spec.json")
    assert worker.node_argv[0] == "/opt/site/venv/bin/python"
    import sys
    assert submit.head_spec(directory, "er-x", head, RayLauncher()).node_argv[0] == sys.executable


# ---------------------------------------------------------------- the agent's command line

def _session_dir(tmp_path, launcher: RayLauncher) -> SessionDir:
    info = SessionInfo(session_id="s-addr", job_name="er-addr", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu"}, worker_allocation=None, launcher=launcher.to_dict())
    return SessionDir.create(tmp_path / "session", info)


@pytest.mark.parametrize("launcher, words", [
    (RayLauncher(network_interface="lo"), "node probe: network_interface 'lo' gives 127.0.0.1"),
    (RayLauncher(network_interface="nosuch0"), "node probe: network_interface 'nosuch0' does not exist here"),
    (RayLauncher(node_ip_address_command="exit 4"), "node probe: node_ip_address_command 'exit 4' exited "
                                                    "with status 4"),
])
def test_an_agent_that_cannot_resolve_its_address_exits_with_one_line(tmp_path, monkeypatch, launcher, words):
    directory = _session_dir(tmp_path, launcher)
    monkeypatch.setenv("ELASTIC_RAY_NODE_IP", "127.0.0.9")   # the launcher's setting wins over it
    result = CliRunner().invoke(agent_cli.main, ["run", "--session", str(directory.path), "--job", "4242",
                                                 "--role", "head", "--node", "probe"])
    assert result.exit_code == 1
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot start the agent: ") and words in lines[0], \
        result.output
