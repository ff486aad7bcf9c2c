"""`pre_start_commands` are parsed by bash when the launcher is made: a
syntax error or a here-document is refused then, not found on the node.

Real bash (``bash -n``), and for the here-document the failure it prevents:
a rendered script whose here-document swallows the line after it.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from elastic_ray.config.launcher import RayLauncher
from elastic_ray.config.shell_check import check_pre_start_commands
from elastic_ray.errors import ConfigError

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="the check runs bash -n")

ACCEPTED = [
    ("export X=1",),
    ("module load python/3.11", "source /opt/er/.venv/bin/activate"),
    ('export RAY_AUTH_TOKEN="$(cat "$HOME/.ray-token")"',),
    ("if [ -d /scratch ]; then", "  export TMP=/scratch", "fi"),     # one construct over several entries
    ("cat <<<'a here-string is one line'",),
    ('echo "<<EOF is only text here"',),
    ("echo '<<EOF'  # nor here",),
    ("",),
    ("echo a; echo b && true || false",),
]

REFUSED = [
    # (commands, field named, words the message must carry)
    (("echo 'oops",), "pre_start_commands[0]", "unexpected EOF while looking for matching"),
    (("true", "echo ok)"), "pre_start_commands[1]", "syntax error near unexpected token `)'"),
    (("export A=1", "if true; then"), "pre_start_commands", "unexpected end of file"),
    (("cat <<EOF",), "pre_start_commands[0]", "here-document"),
    (("true", "cat <<'EOF' > /tmp/x"), "pre_start_commands[1]", "here-document"),
    (("cat <<-END",), "pre_start_commands[0]", "here-document"),
    (("cat <<EOF", "hello", "EOF"), "pre_start_commands[0]", "here-document"),     # closed, still refused
    (("f() { cat; } <<EOF",), "pre_start_commands[0]", "here-document"),
    (("echo $((1 +",), "pre_start_commands[0]", "bash cannot parse it"),
]


@pytest.mark.parametrize("commands", ACCEPTED)
def test_lines_bash_parses_are_accepted(commands):
    assert RayLauncher(pre_start_commands=commands).pre_start_commands == commands


@pytest.mark.parametrize("commands, field, words", REFUSED)
def test_lines_bash_refuses_or_here_documents_are_refused_naming_the_entry(commands, field, words):
    with pytest.raises(ConfigError) as info:
        RayLauncher(pre_start_commands=commands)
    assert info.value.field == field
    assert words in str(info.value)


def test_the_refusal_quotes_bash(tmp_path):
    with pytest.raises(ConfigError) as info:
        check_pre_start_commands(("echo 'oops",))
    script = tmp_path / "s.sh"
    script.write_text("echo 'oops\n")
    bash = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, env={"LC_ALL": "C"})
    quoted = bash.stderr.strip().split(": ", 2)[-1]            # without bash's own file and line prefix
    assert quoted in str(info.value)


def test_a_launcher_read_back_from_session_json_is_checked_too():
    data = RayLauncher(pre_start_commands=("export X=1",)).to_dict()
    data["pre_start_commands"] = ["cat <<EOF"]
    with pytest.raises(ConfigError, match="here-document"):
        RayLauncher.from_dict(data)


def test_what_a_here_document_would_do_in_the_batch_script(tmp_path):
    """Why it is refused: the line after it (there, the agent's launch) is
    swallowed and the script still ends 0, so the job ends COMPLETED."""
    script = tmp_path / "job.sh"
    script.write_text("set -e\ncat <<EOF >/dev/null\necho LAUNCHED\n")
    out = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    assert out.returncode == 0 and "LAUNCHED" not in out.stdout


def test_the_lines_never_reach_bash_argv(monkeypatch):
    seen = []
    real = subprocess.run

    def spy(argv, *args, **kwargs):
        seen.append(list(argv))
        return real(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "run", spy)
    check_pre_start_commands.cache_clear()
    check_pre_start_commands(("export TOKEN=s3cret-value",))
    assert seen and not any("s3cret-value" in arg for argv in seen for arg in argv)
