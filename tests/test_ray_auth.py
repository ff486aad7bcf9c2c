"""Ray token auth settings: the token, the file, the environment every process gets; no Ray."""

from __future__ import annotations

import json
import os
import stat
import sys
import types

import pytest

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.coordinator.drivers import PayloadRun
from elastic_ray.errors import ConfigError
from elastic_ray.protocol.disk.records import SessionInfo
from elastic_ray.protocol.disk.session_dir import SessionDir
from elastic_ray.ray_auth import (
    DISABLED_WARNING,
    REDIS_PASSWORD_WARNING,
    apply_auth_env,
    derive_ray_token,
    launcher_warnings,
    ray_auth_env,
)


def _session(tmp_path, launcher: RayLauncher | None = None) -> SessionDir:
    info = SessionInfo(session_id="s-1", job_name="er-test", created_at=1.0, scheduler={"kind": "local"},
                       head={"partition": "cpu", "time_limit": "60"},
                       launcher=(launcher or RayLauncher()).to_dict())
    return SessionDir.create(tmp_path / "sess", info)


def test_token_is_64_hex_derived_from_the_secret():
    a, b = derive_ray_token(b"k" * 32), derive_ray_token(b"j" * 32)
    assert len(a) == 64 and int(a, 16) >= 0 and a == derive_ray_token(b"k" * 32) and a != b
    with pytest.raises(ValueError, match="secret"):
        derive_ray_token(b"short")


def test_launcher_defaults_to_token_auth_and_owns_the_token_variables():
    assert RayLauncher().auth_mode == "token"
    assert RayLauncher.from_dict({}).auth_mode == "token"
    for name in ("RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE"):
        with pytest.raises(ConfigError, match=name):
            RayLauncher(env={name: "x"})
    with pytest.raises(ConfigError, match="auth_mode"):
        RayLauncher(auth_mode="password")


def test_auth_env():
    assert ray_auth_env("disabled", None) == {"RAY_AUTH_MODE": "disabled"}
    assert ray_auth_env("token", "/s/ray_token") == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/s/ray_token"}
    for mode, path in (("token", None), ("token", "rel/tok"), ("on", "/s/t")):
        with pytest.raises(ValueError):
            ray_auth_env(mode, path)
    env = {"RAY_AUTH_TOKEN": "stale", "RAY_AUTH_MODE": "disabled", "OTHER": "1"}
    assert apply_auth_env(env, ray_auth_env("token", "/t")) is env
    assert env == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": "/t", "OTHER": "1"}


def test_warnings():
    assert launcher_warnings("token", None) == []
    assert launcher_warnings("disabled", "pw") == [("ray_auth_disabled", DISABLED_WARNING),
                                                   ("redis_password_ignored", REDIS_PASSWORD_WARNING)]
    assert "pw" not in REDIS_PASSWORD_WARNING


def test_session_writes_the_token_file_0600(tmp_path):
    session = _session(tmp_path)
    path = session.ray_token_file
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(session.path).st_mode) == 0o700
    assert path.read_bytes() == derive_ray_token(session.secret()).encode()
    assert session.ray_auth_env("token") == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(path)}
    assert session.ray_auth_env("disabled") == {"RAY_AUTH_MODE": "disabled"}


@pytest.mark.parametrize("damage", ["missing", "wrong", "mode"])
def test_token_file_is_repaired(tmp_path, damage):
    """A session made before the file existed, or a damaged file, gets the right one back."""
    session = _session(tmp_path)
    path = session.ray_token_file
    if damage == "missing":
        path.unlink()
    elif damage == "wrong":
        path.write_bytes(b"0" * 64)
    else:
        os.chmod(path, 0o644)
    assert session.ensure_ray_token() == path
    assert path.read_bytes() == derive_ray_token(session.secret()).encode()
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


@pytest.mark.parametrize("mode", ["token", "disabled"])
def test_driver_gets_the_sessions_auth_not_the_callers(tmp_path, monkeypatch, mode):
    """Session.run's drivers: RAY_AUTH_MODE always; the token file's path, never the token."""
    directory = _session(tmp_path, RayLauncher(auth_mode=mode))
    monkeypatch.setenv("RAY_AUTH_TOKEN", "stale-user-token")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled" if mode == "token" else "token")
    fake = types.SimpleNamespace(path=directory.path, info=directory.info(), job_name="er-test",
                                 launcher=RayLauncher(auth_mode=mode),
                                 ray_client_env=lambda: directory.ray_auth_env(mode),
                                 record=directory.read_allocation)
    dump = "import json, os; print(json.dumps({k: v for k, v in os.environ.items() if k.startswith('RAY_')}))"
    head = types.SimpleNamespace(job_id="7", address="127.0.0.2:6379")
    run = PayloadRun(fake, head, [sys.executable, "-c", dump],
                     env={"RAY_AUTH_TOKEN": "from-caller"}, stdout=open(tmp_path / "out", "w"))
    assert run.proc.wait(30) == 0
    env = json.loads((tmp_path / "out").read_text())
    assert env["RAY_AUTH_MODE"] == mode and env["RAY_ADDRESS"] == "127.0.0.2:6379"
    assert "RAY_AUTH_TOKEN" not in env
    assert env.get("RAY_AUTH_TOKEN_PATH") == (str(directory.ray_token_file) if mode == "token" else None)
    token = derive_ray_token(directory.secret())
    assert token not in json.dumps(env) and not any(token in a for a in run.proc.args)
