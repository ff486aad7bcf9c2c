"""The test sshd (tests/sshd_server.py) behaves like the OpenSSH server the SSH mode meets.

Real sshd and ssh processes on 127.0.0.1, no mocks: key authentication (and
refusal), host key checking against our known_hosts, connection sharing over a
ControlMaster, SetEnv reaching remote commands, and a stop() that leaves no
process of ours behind. No Ray and no Slurm, so these run with the unit tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.sshd_server import SshServer, connection_pids, render_sshd_config

pytestmark = pytest.mark.timeout(60)


def run(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)


def test_a_remote_command_gives_its_stdout_and_exit_code(sshd):
    cp = run(sshd.ssh_argv("echo hello from $(id -un); echo to-stderr >&2; exit 7"))
    assert cp.returncode == 7, f"{cp}\n{sshd.log_text()}"
    assert cp.stdout == f"hello from {sshd.user}\n"
    assert cp.stderr == "to-stderr\n"


def test_a_key_missing_from_authorized_keys_is_refused(sshd, tmp_path):
    other = tmp_path / "other_key"
    run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)]).check_returncode()
    argv = ["ssh", "-F", "/dev/null", "-p", str(sshd.port), "-i", str(other),
            *sshd.ssh_options(), f"{sshd.user}@{sshd.host}", "echo should-not-run"]
    cp = run(argv)
    assert cp.returncode == 255, cp
    assert "Permission denied" in cp.stderr
    assert cp.stdout == ""


def test_a_host_key_missing_from_known_hosts_is_refused(sshd, tmp_path):
    """The client checks the host key against our known_hosts, so an impostor would be caught."""
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    argv = [a.replace(str(sshd.known_hosts), str(empty)) for a in sshd.ssh_argv("echo should-not-run")]
    assert argv != sshd.ssh_argv("echo should-not-run")
    cp = run(argv)
    assert cp.returncode == 255, cp
    assert "Host key verification failed" in cp.stderr


def test_a_second_client_reuses_the_control_master(sshd):
    # A short directory: a ControlPath must fit a unix socket address (108 bytes) with the
    # random suffix ssh adds while creating it, which pytest's tmp_path may not leave room for.
    cm_dir = tempfile.mkdtemp(prefix="cm", dir="/tmp")
    shared = ["-o", "ControlMaster=auto", "-o", f"ControlPath={cm_dir}/cm-%C", "-o", "ControlPersist=30"]
    where = 'echo "$SSH_CONNECTION"'
    try:
        first = run(sshd.ssh_argv(where, extra_options=shared))
        assert first.returncode == 0, f"{first}\n{sshd.log_text()}"
        check = run(sshd.ssh_argv(extra_options=[*shared, "-O", "check"]))
        assert check.returncode == 0 and "Master running" in check.stderr, check

        second = run(sshd.ssh_argv(where, extra_options=shared))
        alone = run(sshd.ssh_argv(where))
        assert second.returncode == 0 and alone.returncode == 0, (second, alone)
        # Same TCP connection (same client port) for the shared client, a new one without it.
        assert second.stdout == first.stdout
        assert alone.stdout != first.stdout

        ended = run(sshd.ssh_argv(extra_options=[*shared, "-O", "exit"]))
        assert ended.returncode == 0, ended
        gone = run(sshd.ssh_argv(extra_options=[*shared, "-O", "check"]))
        assert gone.returncode == 255, gone
    finally:
        run(sshd.ssh_argv(extra_options=[*shared, "-O", "exit"]))  # no-op when already ended
        shutil.rmtree(cm_dir, ignore_errors=True)


def test_set_env_reaches_the_remote_command(tmp_path):
    env = {"SLURM_CONF": "/etc/slurm lab/slurm.conf", "ELASTIC_RAY_QUOTED": 'a "b" \\c $HOME #d'}
    with SshServer(tmp_path / "sshd", env=env) as server:
        cp = run(server.ssh_argv('printf "%s\\n" "$SLURM_CONF" "$ELASTIC_RAY_QUOTED"'))
    assert cp.returncode == 0, f"{cp}\n{server.log_text()}"
    assert cp.stdout.splitlines() == [env["SLURM_CONF"], env["ELASTIC_RAY_QUOTED"]]


def test_stop_ends_the_daemon_and_its_connections(tmp_path):
    server = SshServer(tmp_path / "sshd").start()
    pid, port = server.pid, server.port
    # The remote cat reads our open stdin: it ends when its connection does, not on its own.
    client = subprocess.Popen(server.ssh_argv("echo started; exec cat"), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline() == "started\n", server.log_text()
        assert connection_pids(port), "the open connection has sshd processes"
        server.stop()
        assert not Path(f"/proc/{pid}").exists()
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert connection_pids(port) == []
        # The open connection went with it: the client sees its server gone.
        assert client.wait(timeout=10) == 255
        refused = run(server.ssh_argv("true"))
        assert refused.returncode == 255 and "refused" in refused.stderr, refused
        server.stop()  # idempotent
    finally:
        if client.poll() is None:
            client.kill()
        client.communicate()
        server.stop()


def test_stop_before_start_does_nothing(tmp_path):
    server = SshServer(tmp_path / "never-started")
    server.stop()
    assert server.pid is None


def test_the_config_refuses_what_sshd_config_cannot_say(tmp_path):
    common = dict(address="127.0.0.1", port=2222, host_key=tmp_path / "k", pid_file=tmp_path / "p",
                  authorized_keys=tmp_path / "a")
    with pytest.raises(ValueError, match="env: '1BAD'"):
        render_sshd_config(**common, env={"1BAD": "x"})
    with pytest.raises(ValueError, match=r"env\['X'\]"):
        render_sshd_config(**common, env={"X": "two\nlines"})
    text = render_sshd_config(**common, env={"A": "1", "B": "2"})
    assert [line for line in text.splitlines() if line.startswith("SetEnv")] == ['SetEnv "A=1" "B=2"']
