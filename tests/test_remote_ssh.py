"""The SSH mode's transport and its errors, against a real OpenSSH server (no Ray, no Slurm).

Every call goes through the system ``ssh`` client to the test ``sshd`` on
127.0.0.1 and starts the real cluster-side server there.
"""

from __future__ import annotations

import os
import subprocess
import textwrap

import pytest

from elastic_ray.errors import ConfigError, SessionDirError
from elastic_ray.remote import (
    RemoteSession,
    RemoteSetupError,
    RemoteVersionMismatch,
    SshConnection,
    SshError,
    SshTarget,
)
from elastic_ray.remote import client as client_module
from elastic_ray.remote.client import RemoteCall
from tests.remote_helpers import REMOTE_PYTHON, target_of

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def conn(sshd):
    c = SshConnection(target_of(sshd))
    yield c
    c.close()


def call(conn, op, args=None, python=REMOTE_PYTHON):
    return RemoteCall(conn, python, op, args or {}).result(60)


@pytest.mark.parametrize("field, kwargs", [
    ("ssh.host", {"host": ""}),
    ("ssh.host", {"host": "-oProxyCommand=evil"}),
    ("ssh.user", {"host": "login", "user": "-l"}),
    ("ssh.port", {"host": "login", "port": 0}),
    ("ssh.options", {"host": "login", "options": ("-v",)}),
    ("ssh.key_path", {"host": "login", "key_path": "/no/such/key"}),
])
def test_a_bad_target_names_its_field_before_any_connection(field, kwargs):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        SshTarget(**kwargs)


def test_calls_share_one_master_connection_and_close_ends_it(sshd, conn):
    assert call(conn, "hello")["version"]
    assert call(conn, "hello")["python"] == REMOTE_PYTHON
    check = subprocess.run([*conn._base(), "-O", "check", conn.target.host], capture_output=True, text=True)
    assert check.returncode == 0 and "Master running" in check.stderr
    conn.close()
    check = subprocess.run([*conn._base(), "-O", "check", conn.target.host], capture_output=True, text=True)
    assert check.returncode != 0
    assert not conn.control_dir.exists()
    assert call(conn, "hello")["version"], "a closed connection opens again on the next call"
    assert conn.control_dir.stat().st_mode & 0o777 == 0o700


def test_a_refused_key_is_an_ssh_error_naming_host_user_command_and_ssh_s_words(sshd, tmp_path):
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    c = SshConnection(target_of(sshd, key_path=str(other)))
    with pytest.raises(SshError) as caught:
        try:
            call(c, "hello")
        finally:
            c.close()
    err = caught.value
    assert err.host == sshd.host and err.user == sshd.user and err.returncode == 255
    assert "Permission denied" in err.stderr and "Permission denied" in str(err)
    assert f"{sshd.user}@{sshd.host} port {sshd.port}" in str(err)
    assert "elastic_ray.remote.server" in " ".join(err.command)


def test_a_control_dir_too_long_for_a_socket_is_refused_by_name(tmp_path):
    with pytest.raises(ValueError, match="control_dir"):
        SshConnection(SshTarget("login"), control_dir=tmp_path / ("x" * 80))


def test_a_missing_ssh_client_is_an_ssh_error(sshd, tmp_path):
    c = SshConnection(target_of(sshd, ssh_command="/no/such/ssh"))
    with pytest.raises(SshError, match="/no/such/ssh"):
        call(c, "hello")
    c.close()
    assert not c.control_dir.exists()


def test_a_cluster_side_without_elastic_ray_is_a_setup_error_naming_the_interpreter(conn):
    with pytest.raises(RemoteSetupError, match="/opt/none/bin/python"):
        call(conn, "hello", python="/opt/none/bin/python")


def test_a_version_mismatch_is_reported_not_tolerated(conn, monkeypatch):
    monkeypatch.setattr(client_module, "__version__", "0.0.1-other")
    with pytest.raises(RemoteVersionMismatch) as caught:
        call(conn, "hello")
    assert caught.value.client_version == "0.0.1-other"
    assert "install the same version" in str(caught.value)


def test_what_a_login_shell_prints_is_ignored(conn, tmp_path):
    noisy = tmp_path / "noisy-python"
    noisy.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        echo "Welcome to the cluster. Quota: 93% used"
        echo '{{"ev": "result", "value": "forged"}}'
        exec {REMOTE_PYTHON} "$@"
        """))
    noisy.chmod(0o755)
    assert call(conn, "hello", python=str(noisy))["version"]


def test_cluster_side_errors_come_back_as_their_own_types(conn, tmp_path):
    with pytest.raises(SessionDirError):
        RemoteSession.open(str(tmp_path / "no-session"), ssh=conn, remote_python=REMOTE_PYTHON)
    with pytest.raises(ConfigError, match="path"):
        RemoteSession.open("relative/dir", ssh=conn, remote_python=REMOTE_PYTHON)


def test_a_config_error_of_the_cluster_side_names_its_field(conn, tmp_path):
    from elastic_ray import SlurmRunAllocationConfig
    from elastic_ray.config.launcher import RayLauncher

    with pytest.raises(ConfigError) as caught:
        RemoteSession.create(str(tmp_path / "s"), ssh=conn, remote_python=REMOTE_PYTHON, scheduler="local",
                             head=SlurmRunAllocationConfig(partition="cpu", time_limit="10"),
                             launcher=RayLauncher(port_strategy="fixed"), ray_head_only=False)
    assert caught.value.field == "launcher.port_strategy" and caught.value.value == "fixed"
    assert not (tmp_path / "s").exists(), "a refused create changes nothing"
    with pytest.raises(ConfigError, match="head"):   # checked on this side, before any SSH traffic
        RemoteSession.create(str(tmp_path / "s"), ssh=conn, head={"partition": "cpu"})


def test_put_file_writes_atomically_with_its_mode(conn, tmp_path):
    target = tmp_path / "up" / "payload.py"
    written = RemoteCall(conn, REMOTE_PYTHON, "put_file",
                         {"target": str(target), "data": "cHJpbnQoMSkK", "mode": 0o640}).result(60)
    assert written == str(target) and target.read_text() == "print(1)\n"
    assert target.stat().st_mode & 0o777 == 0o640
    assert not [p for p in target.parent.iterdir() if p != target]


def test_a_silent_client_is_taken_for_gone(tmp_path):
    """No keep-alive byte for CLIENT_SILENCE s (a dropped network) ends the
    call on the cluster side, as a closed connection does."""
    from elastic_ray.remote import wire

    script = tmp_path / "silence.py"
    script.write_text(textwrap.dedent("""\
        import threading, time
        from elastic_ray.remote import server, wire
        gone = threading.Event()
        t0 = time.monotonic()
        server._watch_stdin(0, gone, "run", None, silence=1.0)
        print(f"gone after {time.monotonic() - t0:.1f}s", gone.is_set())
        """))
    # stdin stays open but silent: a pipe nobody writes to
    r, w = os.pipe()
    try:
        done = subprocess.run([REMOTE_PYTHON, str(script)], stdin=r, capture_output=True, text=True, timeout=30)
    finally:
        os.close(w)
        os.close(r)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("gone after 1.") and done.stdout.strip().endswith("True")
    assert wire.CLIENT_SILENCE >= 3 * wire.KEEPALIVE, "the client's keep-alives come well inside the silence"


def test_an_unknown_op_is_a_protocol_error(conn):
    from elastic_ray.remote import ProtocolError

    with pytest.raises(ProtocolError, match="unknown op 'format_disk'"):
        call(conn, "format_disk")
