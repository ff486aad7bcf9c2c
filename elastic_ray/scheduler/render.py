"""Render a :class:`JobSpec` into the batch script that ``sbatch`` receives.

Pure functions: the only input besides the spec is the template text, read
from the package data (``sbatch_templates/``). The script has two parts with
different rules:

* ``#SBATCH`` lines. sbatch reads them with its own small tokenizer (blanks
  separate arguments, ``#`` starts a comment, quotes and backslashes are
  interpreted), so a value that contains any of those would be cut short or
  reinterpreted. Values are therefore *checked*, not quoted: the configs
  already refuse such values, and the two fields that do not come from a
  config (``job_name``, ``output``) are checked here.
* The shell part. Every value that comes from the program (workdir, the node
  command's argv, environment values) is quoted with :func:`shlex.quote`, so
  it reaches the program byte for byte and is never executed. The only user
  text that *is* shell on purpose is ``pre_start_commands``, inserted as
  lines.

The working directory is set by ``cd -- <quoted workdir>`` in the script, not
by ``#SBATCH --chdir``: a path with a blank could not be written safely as a
directive, while the quoted ``cd`` takes any path and fails loudly (``set -e``)
when a node cannot see it. ``SlurmScheduler.submit`` also runs sbatch inside
the workdir, so Slurm's own notion of it (and a relative ``output``) agrees.

Templates use ``{{name}}`` placeholders: they cannot be confused with bash's
``$name`` and ``${name}``, and :func:`fill_template` fails on a placeholder it
does not know as well as on a value the template has no place for, so a
template and the renderer cannot drift apart silently.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping
from importlib import resources

from ..config import SlurmRunAllocationConfig
from ..config.slurm_values import check_job_name
from ..errors import ConfigError
from .base import JobSpec

TEMPLATE_PACKAGE = "elastic_ray.sbatch_templates"
ROLES = ("head", "worker")

_PLACEHOLDER = re.compile(r"\{\{([a-z_]+)\}\}")
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Characters that sbatch's #SBATCH tokenizer treats specially.
_DIRECTIVE_UNSAFE = re.compile(r"[\s\"'\\#]")


# --------------------------------------------------------------------------
# Templates.

def load_template(role: str) -> str:
    """The template text for ``role`` ("head" or "worker") from the package data."""
    if role not in ROLES:
        raise ValueError(f"role={role!r}: must be one of {', '.join(ROLES)}")
    return resources.files(TEMPLATE_PACKAGE).joinpath(f"{role}.sbatch").read_text(encoding="utf-8")


def template_placeholders(template: str) -> set[str]:
    """The placeholder names a template uses."""
    return set(_PLACEHOLDER.findall(template))


def fill_template(template: str, values: Mapping[str, str]) -> str:
    """Replace every ``{{name}}`` in one pass.

    Raises ``ValueError`` when the template names a placeholder that has no
    value, when a value has no placeholder, or when ``{{`` appears in any
    other form (a typo such as ``{{ workdir}}`` would otherwise reach bash).
    Inserted values are never scanned again, so a value that itself contains
    ``{{x}}`` (a user's pre-start line, say) is left alone.
    """
    used = template_placeholders(template)
    unknown = sorted(used - set(values))
    if unknown:
        raise ValueError(f"template placeholder(s) without a value: {', '.join(unknown)}")
    unused = sorted(set(values) - used)
    if unused:
        raise ValueError(f"value(s) the template has no placeholder for: {', '.join(unused)}")
    stray = _PLACEHOLDER.sub("", template)
    if "{{" in stray or "}}" in stray:
        line = next(line for line in template.splitlines()
                    if "{{" in _PLACEHOLDER.sub("", line) or "}}" in _PLACEHOLDER.sub("", line))
        raise ValueError(f"malformed placeholder in template line: {line.strip()!r}")
    return _PLACEHOLDER.sub(lambda match: values[match.group(1)], template)


# --------------------------------------------------------------------------
# Checks of the values that do not come from a validated config. The job name
# has its own rule in config.slurm_values (check_job_name), shared with the
# records and the scheduler.

def check_output_path(path: object, field: str = "output") -> str:
    """An output path that sbatch's #SBATCH tokenizer passes on unchanged."""
    if not isinstance(path, str) or not path:
        raise ConfigError(field, path, "must be a non-empty path")
    if "\x00" in path or "\n" in path or "\r" in path:
        raise ConfigError(field, path, "must not contain a newline or NUL")
    if _DIRECTIVE_UNSAFE.search(path):
        raise ConfigError(field, path, "must not contain blanks, quotes, '#' or '\\': sbatch would "
                                       "split or cut the #SBATCH line")
    return path


def _check_directive_value(field: str, value: str) -> str:
    """Defence in depth for values that configs validate already."""
    if not value or _DIRECTIVE_UNSAFE.search(value) or "\x00" in value:
        raise ConfigError(field, value, "is not safe in an #SBATCH line")
    return value


def _check_no_nul(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise ConfigError(field, value, "must be a string")
    if "\x00" in value:
        raise ConfigError(field, value, "must not contain NUL (no process can receive it)")
    return value


# --------------------------------------------------------------------------
# The parts of the script.

def sbatch_directives(spec: JobSpec) -> list[str]:
    """The ``#SBATCH`` lines for ``spec``, in a fixed order."""
    config: SlurmRunAllocationConfig = spec.allocation
    options: list[tuple[str, str, object]] = [
        # (sbatch option, field that supplied it, value)
        ("job-name", "job_name", check_job_name(spec.job_name)),
        ("partition", "partition", config.partition),
        ("nodes", "num_nodes", config.num_nodes),
        # One agent per node; the step in the script asks for the same.
        ("ntasks-per-node", "", 1),
        ("gpus-per-node", "gpus_per_node", config.gpus_per_node or None),
        ("cpus-per-task", "cpus_per_task", config.cpus_per_task),
        ("mem", "mem", config.mem),
        ("mem-per-cpu", "mem_per_cpu", config.mem_per_cpu),
        ("time", "time_limit", config.time_limit),
        ("time-min", "time_min", config.time_min),
        ("signal", "signal_before_timeout", config.signal_before_timeout),
        ("nodelist", "nodelist", config.nodelist),
        ("exclude", "exclude", config.exclude),
        ("qos", "qos", config.qos),
        ("account", "account", config.account),
        ("reservation", "reservation", config.reservation),
        ("constraint", "constraint", config.constraint),
        ("output", "output", check_output_path(spec.output)),
        # A requeued allocation (node failure) appends to its log instead of
        # wiping the first attempt's lines, which explain the requeue.
        ("open-mode", "", "append"),
    ]
    lines = []
    for option, field, value in options:
        if value is None:
            continue
        lines.append(f"#SBATCH --{option}={_check_directive_value(field or option, str(value))}")
    for index, directive in enumerate(config.extra_sbatch_directives):
        lines.append(f"#SBATCH {_check_directive_value(f'extra_sbatch_directives[{index}]', directive)}")
    if spec.comment:
        # Last, so that it wins over a --comment among the extra directives:
        # the marker is how an unrecorded submission is found again.
        lines.append(f"#SBATCH --comment={_check_directive_value('comment', spec.comment)}")
    return lines


def env_exports(env: Mapping[str, str]) -> list[str]:
    """``export NAME=value`` lines; names must be shell identifiers, values are quoted."""
    lines = []
    for name in sorted(env):
        value = env[name]
        if not isinstance(name, str) or not _SHELL_NAME.fullmatch(name):
            raise ConfigError(f"env[{name!r}]", name, "is not a valid environment variable name "
                                                      "(letters, digits and _, not starting with a digit)")
        _check_no_nul(f"env[{name!r}]", value)
        lines.append(f"export {name}={shlex.quote(value)}")
    return lines


def pre_start_lines(commands: Iterable[str]) -> list[str]:
    """The user's pre-start commands, one line each.

    A command must be a single line: a newline would let one entry smuggle in
    more lines than the config shows, and a trailing backslash would glue the
    template's next line onto the user's command.
    """
    lines = []
    for index, command in enumerate(commands):
        field = f"pre_start_commands[{index}]"
        _check_no_nul(field, command)
        if "\n" in command or "\r" in command:
            raise ConfigError(field, command, "must be a single line (no newline)")
        if command.rstrip().endswith("\\"):
            raise ConfigError(field, command, "must not end with a backslash (it would continue onto "
                                              "the script's next line)")
        if command.strip():
            lines.append(command)
    return lines


def quoted_argv(argv: Iterable[str], field: str = "node_argv") -> str:
    """The node command as one shell-quoted line.

    The program name may not start with '-': it follows srun's own options,
    and srun would take it for one of them.
    """
    items = [_check_no_nul(f"{field}[{i}]", arg) for i, arg in enumerate(argv)]
    if not items or not items[0] or items[0].startswith("-"):
        raise ConfigError(f"{field}[0]", items[0] if items else None,
                          "must name a program (not empty, not starting with '-')")
    return " ".join(shlex.quote(arg) for arg in items)


def _block(lines: list[str], empty: str) -> str:
    return "\n".join(lines) if lines else empty


def render_batch_script(spec: JobSpec, template: str | None = None) -> str:
    """The complete batch script for ``spec``.

    ``template`` defaults to the packaged template of ``spec.role``; tests
    pass their own to exercise :func:`fill_template`'s checks.
    """
    workdir = str(spec.workdir)
    _check_no_nul("workdir", workdir)
    if not spec.workdir.is_absolute():
        raise ConfigError("workdir", workdir, "must be an absolute path (nodes start elsewhere)")
    values = {
        "sbatch_directives": "\n".join(sbatch_directives(spec)),
        "workdir": shlex.quote(workdir),
        "env_exports": _block(env_exports(spec.env), "# (none)"),
        "pre_start_commands": _block(pre_start_lines(spec.pre_start_commands), "# (none)"),
        "node_argv": quoted_argv(spec.node_argv),
    }
    return fill_template(load_template(spec.role) if template is None else template, values)
