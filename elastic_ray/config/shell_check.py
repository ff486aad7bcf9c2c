"""Check ``pre_start_commands`` with bash's own parser when the config is made.

The lines run on every node inside the batch script, between the launcher's
exports and the line that starts the agent. A mistake there shows up late
and badly: ``echo 'oops`` fails on the node after the job waited in the
queue, and a here-document (``cat <<EOF``) swallows every line after it, the
agent's launch line included, so the job ends COMPLETED and no agent ever
ran. So at config time we run ``bash -n`` (parse, never execute) on the
lines, and refuse any here-document: a single line cannot hold one's body.

The lines go to bash in a file of a private temporary directory, never on
its command line (they may carry a token, and argv is visible to every user
of the host). Without bash on this host the check is skipped with a warning;
the node still runs the lines with bash.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import tempfile

from ..errors import ConfigError

log = logging.getLogger(__name__)

FIELD = "pre_start_commands"
_LINE = re.compile(rf"^{FIELD}: line (\d+): ", re.MULTILINE)
_HEREDOC = re.compile(r"here-document at line (\d+)")
# Parsed as code, this is a syntax error; inside a here-document's body it is
# text. A script that still parses with it appended had its end swallowed.
_SENTINEL = "\n(\n"


def _bash_n(bash: str, directory: str, script: str, name: str = FIELD) -> tuple[int, str]:
    """``bash -n`` on ``script`` (in a file called ``name``, which bash's
    messages start with): its exit code and its messages."""
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(script)
    # A bare environment: no BASH_ENV to source, English messages to match.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"}
    proc = subprocess.run([bash, "-n", name], cwd=directory, env=env, capture_output=True, text=True,
                          timeout=30, stdin=subprocess.DEVNULL)
    return proc.returncode, proc.stderr.strip()


def _field_of(message: str, count: int, pattern: re.Pattern[str] = _LINE) -> str:
    match = pattern.search(message)
    if match:
        index = int(match.group(1)) - 1
        if 0 <= index < count:
            return f"{FIELD}[{index}]"
    return FIELD


@functools.lru_cache(maxsize=256)
def check_pre_start_commands(commands: tuple[str, ...]) -> None:
    """Raise ConfigError naming the entry when bash cannot parse the lines or
    one of them opens a here-document. ``commands`` are single lines (the
    launcher checked that)."""
    if not commands:
        return
    bash = shutil.which("bash")
    if bash is None:
        log.warning("event=pre_start_unchecked reason='no bash on this host' count=%d", len(commands))
        return
    with tempfile.TemporaryDirectory(prefix="er-shcheck-") as directory:
        script = "\n".join(commands) + "\n"
        code, message = _bash_n(bash, directory, script)
        if code != 0:
            field = _field_of(message, len(commands))
            index = None if field == FIELD else int(field[len(FIELD) + 1:-1])
            raise ConfigError(field, commands[index] if index is not None else list(commands),
                              f"bash cannot parse it: {message}")
        for index, command in enumerate(commands):
            code, message = (0, "") if "<<" not in command else _bash_n(bash, directory, command + "\n")
            if _HEREDOC.search(message):
                raise ConfigError(f"{FIELD}[{index}]", command,
                                  "opens a here-document, which would swallow the batch script's next lines "
                                  "(the agent's launch line included); write the text with printf or echo, "
                                  f"or keep it in a file (bash: {message})")
        # Independent of bash's wording: had anything swallowed the script's
        # end, the sentinel would be swallowed too and the script still parse.
        code, message = _bash_n(bash, directory, script + _SENTINEL)
        if code == 0:
            raise ConfigError(FIELD, list(commands),
                              "swallows the lines that follow it (a here-document?), the agent's launch line "
                              f"included{f' (bash: {message})' if message else ''}")


@functools.lru_cache(maxsize=64)
def check_shell_command(field: str, command: str) -> None:
    """Raise ConfigError naming ``field`` when bash cannot parse ``command``.

    For a single command the agent runs itself on every node (e.g.
    ``node_ip_address_command``, run with ``bash -c``): a typo should fail
    when the config is made, not on a node after the job left the queue.
    ``field`` is a plain identifier (it names the file bash reads).
    """
    bash = shutil.which("bash")
    if bash is None:
        log.warning("event=shell_command_unchecked field=%s reason='no bash on this host'", field)
        return
    with tempfile.TemporaryDirectory(prefix="er-shcheck-") as directory:
        code, message = _bash_n(bash, directory, command + "\n", name=field)
    if code != 0:
        raise ConfigError(field, command, f"bash cannot parse it: {message}")
