"""Every shell command in the docs is checked; the site builds with --strict.

The convention (also in docs/conventions.md):

* Commands live in fenced ```console blocks, on lines starting with ``$ ``
  (other lines are output), or in ```bash blocks, where every line is a
  command. A trailing backslash continues a command on the next line.
* An ``elastic-ray``/``elastic-agent`` invocation that asks only for
  ``--help``/``-h`` or ``--version`` is RUN and must exit 0; so is
  ``python -c ...``.
* Every other ``elastic-ray``/``elastic-agent`` invocation is RESOLVED
  against the real click command tree (``make_context`` level by level): an
  unknown command, an unknown option or a surplus argument fails. Values are
  not judged where they depend on the machine (a path that must exist).
* Anything else must parse with ``bash -n``.
* A block preceded by ``<!-- docs-test: pending-cli -->`` documents commands
  being added on another branch: what does not resolve yet is tolerated,
  and once everything in it resolves the test fails so the marker goes.

Why resolve rather than run: most commands need a cluster, but a renamed
option or command is the way docs rot, and the click tree catches that.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from elastic_ray.agent.cli import main as agent_main
from elastic_ray.cli.main import main as cli_main

from doc_blocks import fenced_blocks

REPO = Path(__file__).resolve().parent.parent
DOC_FILES = sorted((REPO / "docs").rglob("*.md")) + [REPO / "README.md"]
PENDING_MARK = "<!-- docs-test: pending-cli -->"
PROGRAMS = {"elastic-ray": (cli_main, "elastic_ray.cli"), "elastic-agent": (agent_main, "elastic_ray.agent")}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


@dataclass(frozen=True)
class DocCommand:
    path: Path
    line: int
    text: str
    pending: bool

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}: {self.text}"


def _join_continuations(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:
    out: list[tuple[int, str]] = []
    current: tuple[int, str] | None = None
    for number, text in lines:
        if current is None:
            current = (number, text)
        else:
            current = (current[0], current[1] + " " + text.strip())
        if current[1].rstrip().endswith("\\"):
            current = (current[0], current[1].rstrip()[:-1].rstrip())
            continue
        out.append(current)
        current = None
    if current is not None:
        out.append(current)
    return out


def commands_in(path: Path) -> list[DocCommand]:
    """The shell commands of one Markdown file, by the convention above."""
    found: list[DocCommand] = []
    for block in fenced_blocks(path):
        pending = block.marker == PENDING_MARK
        if block.lang == "console":
            picked: list[tuple[int, str]] = []
            continuing = False
            for number, text in block.lines:
                stripped = text.strip()
                if stripped.startswith("$ "):
                    picked.append((number, stripped[2:]))
                elif continuing:
                    picked.append((number, stripped))
                continuing = bool(picked) and (stripped.startswith("$ ") or continuing) and stripped.endswith("\\")
        elif block.lang == "bash":
            picked = [(n, t) for n, t in block.lines if t.strip() and not t.strip().startswith("#")]
        else:
            continue
        for number, text in _join_continuations(picked):
            found.append(DocCommand(path, number, text.strip(), pending))
    return found


ALL_COMMANDS = [command for path in DOC_FILES for command in commands_in(path)]


def simple_commands(text: str) -> list[list[str]]:
    """Split one line into simple commands (``|``, ``&&``, ``||``, ``;``),
    words as the shell would see them, leading assignments and redirections
    (``> file``, ``< file``) removed."""
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split = True
    lexer.commenters = "#"
    parts: list[list[str]] = [[]]
    redirect = False
    for token in lexer:
        if token and set(token) <= set("<>"):
            redirect = True
        elif redirect:
            redirect = False
        elif token and set(token) <= set(";&|"):
            parts.append([])
        else:
            parts[-1].append(token)
    result = []
    for words in parts:
        while words and _ASSIGNMENT.match(words[0]):
            words = words[1:]
        if words:
            result.append(words)
    return result


def program_of(words: list[str]) -> str | None:
    name = os.path.basename(words[0])
    return name if name in PROGRAMS else None


def wants_help_only(args: list[str]) -> bool:
    return bool(args) and args[-1] in ("--help", "-h", "--version") and all(not a.startswith("-") or a in
                                                                           ("--help", "-h", "--version")
                                                                           for a in args)


class Unresolved(Exception):
    """The command line names a command or option the click tree lacks."""


def resolve(command: click.Command, prog: str, args: list[str]) -> list[str]:
    """Walk the click tree as click would, without invoking anything.

    Returns the command path. Raises ``Unresolved`` for an unknown command,
    unknown option or extra argument; a value that depends on this machine
    (a ``click.Path`` that must exist) is not judged.
    """
    path = [prog]
    parent = None
    while True:
        try:
            ctx = command.make_context(path[-1], list(args), parent=parent)
        except click.exceptions.Exit:
            return path                      # --help/--version: eager, fine
        except (click.NoSuchOption, click.BadOptionUsage) as exc:
            raise Unresolved(f"{' '.join(path)}: {exc.format_message()}") from None
        except click.BadParameter as exc:
            if isinstance(getattr(exc.param, "type", None), click.Path):
                return path                  # a path that does not exist here
            raise Unresolved(f"{' '.join(path)}: {exc.format_message()}") from None
        except click.UsageError as exc:
            raise Unresolved(f"{' '.join(path)}: {exc.format_message()}") from None
        if not isinstance(command, click.Group):
            return path
        rest = list(getattr(ctx, "_protected_args", [])) + list(ctx.args)
        if not rest:
            return path
        try:
            name, sub, rest = command.resolve_command(ctx, rest)
        except click.UsageError as exc:
            raise Unresolved(f"{' '.join(path)}: {exc.format_message()}") from None
        assert sub is not None and name is not None
        command, args, parent = sub, rest, ctx
        path.append(name)


def check(command: DocCommand) -> None:
    """One documented command line, by the rules of the module docstring."""
    try:
        parts = simple_commands(command.text)
    except ValueError as exc:
        pytest.fail(f"{command}: cannot split ({exc})")
    bash = subprocess.run(["bash", "-n", "-c", command.text], capture_output=True, text=True)
    assert bash.returncode == 0, f"{command}: bash -n: {bash.stderr.strip()}"
    unresolved = []
    for words in parts:
        program = program_of(words)
        if program is not None:
            group, module = PROGRAMS[program]
            if wants_help_only(words[1:]):
                run = subprocess.run([sys.executable, "-m", module, *words[1:]], capture_output=True,
                                     text=True, timeout=120, env=_env())
                assert run.returncode == 0, f"{command}: exit {run.returncode}: {run.stderr.strip()}"
                continue
            try:
                resolve(group, program, words[1:])
            except Unresolved as exc:
                unresolved.append(str(exc))
        elif os.path.basename(words[0]) in ("python", "python3") and words[1:2] == ["-c"]:
            run = subprocess.run([sys.executable, *words[1:]], capture_output=True, text=True, timeout=120,
                                 env=_env())
            assert run.returncode == 0, f"{command}: exit {run.returncode}: {run.stderr.strip()}"
    if command.pending:
        assert unresolved, (f"{command}: every command of this pending block resolves now; "
                            f"remove the '{PENDING_MARK}' marker above it")
    else:
        assert not unresolved, f"{command}: " + "; ".join(unresolved)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    return env


def test_the_docs_have_commands_to_check() -> None:
    # A parser that silently finds nothing would pass every check below.
    assert len(ALL_COMMANDS) >= 40, [str(c) for c in ALL_COMMANDS]
    programs = {program_of(w) for c in ALL_COMMANDS for w in simple_commands(c.text)}
    assert {"elastic-ray", "elastic-agent"} <= programs
    words = [w for c in ALL_COMMANDS for w in simple_commands(c.text)]
    assert any(program_of(w) and wants_help_only(w[1:]) for w in words), "no command is run"
    assert any(os.path.basename(w[0]).startswith("python") and w[1:2] == ["-c"] for w in words)


@pytest.mark.parametrize("command", ALL_COMMANDS, ids=lambda c: f"{c.path.name}:{c.line}")
def test_documented_command(command: DocCommand) -> None:
    check(command)


# --- the checker itself: a wrong command must fail -------------------------

def _doc(text: str, pending: bool = False) -> DocCommand:
    return DocCommand(REPO / "docs" / "x.md", 1, text, pending)


@pytest.mark.parametrize("text", [
    "elastic-ray session stauts /tmp/x",                       # unknown command
    "elastic-ray session status /tmp/x --no-such-option",     # unknown option
    "elastic-ray session remove-worker /tmp/x 12 13",         # surplus argument
    "elastic-agent status --jobs 4",                          # misspelt option
    "JOB=1 elastic-ray session teardown /tmp/x --wait && echo done",
    "elastic-ray --help-me",
    "if then fi",                                             # not shell
    "python -c 'raise SystemExit(3)'",
])
def test_checker_refuses(text: str) -> None:
    with pytest.raises(AssertionError):
        check(_doc(text))


@pytest.mark.parametrize("text", [
    "elastic-ray session status /tmp/x --json",
    "elastic-ray session add-worker /tmp/x --partition gpu --ray-resource accelerator:a40=1 --no-wait",
    "elastic-agent run --session /does/not/exist --job 1 --role worker",   # path not judged
    "elastic-agent --version",
    "JOB=$(elastic-ray session status /tmp/x --json) ; echo \"$JOB\" | head -1",
    "module load cuda/12.4",
])
def test_checker_accepts(text: str) -> None:
    check(_doc(text))


def test_pending_block_fails_once_it_resolves() -> None:
    with pytest.raises(AssertionError, match="remove the"):
        check(_doc("elastic-ray session status /tmp/x", pending=True))
    check(_doc("elastic-ray session no-such-command /tmp/x", pending=True))


def test_console_blocks_take_prompts_and_continuations(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n```console\n$ elastic-ray session status \\\n    /tmp/x --json\n"
                    "output line\n$ echo hi\nhi\n```\n\n```text\n$ not checked\n```\n\n"
                    f"{PENDING_MARK}\n```bash\n# comment\nsbatch job.sh\n```\n")
    found = commands_in(page)
    assert [(c.text, c.pending) for c in found] == [
        ("elastic-ray session status /tmp/x --json", False), ("echo hi", False), ("sbatch job.sh", True)]


# --- the site ----------------------------------------------------------------

def _mkdocs() -> str | None:
    beside = Path(sys.executable).parent / "mkdocs"
    return str(beside) if beside.exists() else shutil.which("mkdocs")


@pytest.mark.skipif(_mkdocs() is None and os.environ.get("CI") != "true",
                    reason="mkdocs is not installed (pip install -e '.[docs]'; scripts/bootstrap installs it, "
                           "so CI runs this, and fails it there if mkdocs is missing)")
def test_site_builds_strict(tmp_path: Path) -> None:
    """The one build of the site in a test run (scripts/test no longer builds
    it a second time): no warning, no broken link, the API pages there."""
    assert _mkdocs() is not None, "mkdocs is not installed: scripts/bootstrap installs the docs extra"
    env = _env() | {"NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run([_mkdocs(), "build", "--strict", "--site-dir", str(tmp_path / "site")],
                         cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stdout + run.stderr
    assert (tmp_path / "site" / "api" / "session" / "index.html").exists()


def test_redirections_are_not_arguments():
    assert simple_commands("elastic-ray render --config s.toml > scripts.txt") == [
        ["elastic-ray", "render", "--config", "s.toml"]]
    assert simple_commands("X=1 elastic-ray session status >> log && cat < in | wc") == [
        ["elastic-ray", "session", "status"], ["cat"], ["wc"]]
