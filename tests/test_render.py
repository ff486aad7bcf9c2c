"""The rendered batch scripts: pinned by golden files, checked by bash, and
proven not to execute what they quote.

The hostile-value tests run the rendered script for real under bash, with a
stub ``srun`` on PATH that drops srun's options and runs the node command
here. That is the only thing faked: it lets the test see the node command's
argv, environment and working directory exactly as the script hands them
over, and whether any quoted value was executed on the way.

Set UPDATE_GOLDEN=1 to rewrite tests/golden/*.sbatch after a deliberate
change to the templates or the renderer; review the diff before committing.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_ray.config import (
    SlurmRunAllocationConfig as Run,
    SlurmWorkerAllocationConfig as Worker,
    resolve_head_config,
)
from elastic_ray.errors import ConfigError
from elastic_ray.scheduler.base import JobSpec
from elastic_ray.scheduler.render import (
    fill_template,
    load_template,
    render_batch_script,
    sbatch_directives,
    template_placeholders,
)

GOLDEN = Path(__file__).parent / "golden"


def head_spec(**overrides) -> JobSpec:
    base = dict(
        job_name="er-3f9c2a1b", role="head",
        allocation=resolve_head_config(Run(partition="cpu", time_limit="1-00:00:00",
                                           signal_before_timeout="USR1@300")),
        node_argv=("/opt/er/.venv/bin/elastic-agent", "run", "--session", "/shared/sessions/3f9c2a1b",
                   "--role", "head"),
        workdir=Path("/shared/sessions/3f9c2a1b"),
        output="/shared/sessions/3f9c2a1b/logs/head-%j.out",
        env={"RAY_USAGE_STATS_ENABLED": "0", "ELASTIC_RAY_SESSION": "/shared/sessions/3f9c2a1b"},
        pre_start_commands=("module load python/3.11", "source /opt/er/.venv/bin/activate"),
    )
    base.update(overrides)
    return JobSpec(**base)


def full_worker_spec(**overrides) -> JobSpec:
    base = dict(
        job_name="er-3f9c2a1b", role="worker",
        allocation=Worker(partition="gpu-a", num_nodes=2, gpus_per_node=4, cpus_per_task=16,
                          mem_per_cpu="4G", time_limit="08:00:00", time_min="02:00:00",
                          signal_before_timeout="TERM@600", nodelist="gpua-[1-2]", exclude="gpua-3",
                          qos="normal", account="proj-1", reservation="maint", constraint="a40&ib",
                          extra_sbatch_directives=["--requeue", "--comment=elastic"],
                          ray_resources={"accelerator:a40": 1}),
        node_argv=("elastic-agent", "run", "--session", "/shared/sessions/3f9c2a1b", "--role", "worker"),
        workdir=Path("/shared/sessions/3f9c2a1b"),
        output="logs/worker-%j.out",
        env={"RAY_redis_password": "p'ss $word", "HTTPS_PROXY": "http://proxy:3128"},
        pre_start_commands=('export RAY_AUTH_TOKEN="$(cat "$HOME/.ray-token")"',),
    )
    base.update(overrides)
    return JobSpec(**base)


def minimal_worker_spec(**overrides) -> JobSpec:
    base = dict(
        job_name="er-min", role="worker", allocation=Worker(partition="cpu"),
        node_argv=("elastic-agent", "run"), workdir=Path("/home/a user/my runs"),
        output="/home/a_user/er-%j.out",
    )
    base.update(overrides)
    return JobSpec(**base)


SPECS = {"head-basic": head_spec, "worker-full": full_worker_spec, "worker-minimal": minimal_worker_spec}


# ----------------------------------------------------------------- golden files

@pytest.mark.parametrize("name", sorted(SPECS))
def test_rendered_script_matches_golden_file(name):
    rendered = render_batch_script(SPECS[name]())
    path = GOLDEN / f"{name}.sbatch"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(exist_ok=True)
        path.write_text(rendered, encoding="utf-8")
    assert path.exists(), f"{path} is missing; run with UPDATE_GOLDEN=1 to create it"
    assert rendered == path.read_text(encoding="utf-8"), \
        f"{name} differs from {path}; if the change is deliberate, rerun with UPDATE_GOLDEN=1"


@pytest.mark.parametrize("name", sorted(SPECS))
def test_rendered_script_passes_bash_syntax_check(name, tmp_path):
    script = tmp_path / "job.sbatch"
    script.write_text(render_batch_script(SPECS[name]()))
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_sbatch_line_precedes_the_first_command(name):
    # sbatch stops reading #SBATCH lines at the first line that is not a
    # comment: a directive after it would be silently ignored.
    lines = render_batch_script(SPECS[name]()).splitlines()
    first_command = next(i for i, line in enumerate(lines) if line.strip() and not line.startswith("#"))
    directive_lines = [i for i, line in enumerate(lines) if line.startswith("#SBATCH")]
    assert directive_lines and max(directive_lines) < first_command


def test_directives_map_every_config_field():
    assert sbatch_directives(full_worker_spec()) == [
        "#SBATCH --job-name=er-3f9c2a1b",
        "#SBATCH --partition=gpu-a",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=1",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --cpus-per-task=16",
        "#SBATCH --mem-per-cpu=4G",
        "#SBATCH --time=08:00:00",
        "#SBATCH --time-min=02:00:00",
        "#SBATCH --signal=TERM@600",
        "#SBATCH --nodelist=gpua-[1-2]",
        "#SBATCH --exclude=gpua-3",
        "#SBATCH --qos=normal",
        "#SBATCH --account=proj-1",
        "#SBATCH --reservation=maint",
        "#SBATCH --constraint=a40&ib",
        "#SBATCH --output=logs/worker-%j.out",
        "#SBATCH --open-mode=append",
        "#SBATCH --requeue",
        "#SBATCH --comment=elastic",
    ]


def test_unset_fields_and_zero_gpus_write_no_directive():
    lines = sbatch_directives(minimal_worker_spec(allocation=Worker(partition="cpu", gpus_per_node=0)))
    assert lines == ["#SBATCH --job-name=er-min", "#SBATCH --partition=cpu", "#SBATCH --ntasks-per-node=1",
                     "#SBATCH --output=/home/a_user/er-%j.out", "#SBATCH --open-mode=append"]


def test_mem_is_written_as_mem():
    lines = sbatch_directives(head_spec())
    assert "#SBATCH --mem=8G" in lines and not any("mem-per-cpu" in line for line in lines)


# ----------------------------------------------------------------- templates

def test_head_and_worker_templates_differ_only_in_comments():
    def code(text: str) -> list[str]:
        return [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    assert code(load_template("head")) == code(load_template("worker"))


def test_templates_use_exactly_the_renderer_placeholders():
    expected = {"sbatch_directives", "workdir", "env_exports", "pre_start_commands", "node_argv"}
    assert template_placeholders(load_template("head")) == expected
    assert template_placeholders(load_template("worker")) == expected


def test_unknown_role_is_refused():
    with pytest.raises(ValueError, match="role"):
        load_template("driver")


def test_template_placeholder_without_value_is_refused():
    with pytest.raises(ValueError, match="without a value: colour"):
        fill_template("a {{name}} {{colour}}", {"name": "x"})


def test_value_without_placeholder_is_refused():
    with pytest.raises(ValueError, match="no placeholder for: node_argv"):
        fill_template("a {{name}}", {"name": "x", "node_argv": "y"})


@pytest.mark.parametrize("template", ["{{ name}}", "{{Name}}", "{{name}", "x }} y", "{{name-x}}"])
def test_malformed_placeholder_is_refused(template):
    with pytest.raises(ValueError):
        fill_template(template + " {{ok}}", {"ok": "1"})


def test_inserted_values_are_not_scanned_again():
    assert fill_template("[{{a}}] [{{b}}]", {"a": "{{b}}", "b": "$x"}) == "[{{b}}] [$x]"


def test_render_with_a_template_that_lacks_the_node_command_fails():
    template = load_template("worker").replace("{{node_argv}}", "true")
    with pytest.raises(ValueError, match="node_argv"):
        render_batch_script(full_worker_spec(), template=template)


# ----------------------------------------------------------------- hostile values

HOSTILE = [
    "plain",
    "two words",
    "it's",
    'say "hi"',
    "$(touch {marker})",
    "`touch {marker}`",
    "${{IFS}}touch${{IFS}}{marker}",
    "; touch {marker}; ",
    "' ; touch {marker} ; '",
    "line one\ntouch {marker}",
    "back\\slash\\",
    "*",
    "--option-looking",
    "",
    "tab\there",
    "ünïcödé ✓",
    "{{workdir}}",
]

SRUN_STUB = """#!/bin/bash
# Test stub: drop srun's options, run the node command here.
while [ $# -gt 0 ]; do
  case "$1" in --*) shift ;; *) break ;; esac
done
exec "$@"
"""

NODE_PROGRAM = """
import json, os, sys
print(json.dumps({"argv": sys.argv[1:], "cwd": os.getcwd(),
                  "env": {k: v for k, v in os.environ.items() if k.startswith("ER_T_")}}))
"""


def run_rendered(spec: JobSpec, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "srun").write_text(SRUN_STUB)
    (bin_dir / "srun").chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render_batch_script(spec))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "2",
           "HOME": str(tmp_path)}
    return subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=30)


def test_hostile_values_are_passed_through_exactly_and_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    values = [v.format(marker=marker) for v in HOSTILE]
    workdir = tmp_path / "work dir 'q' \"dq\" $(touch pwned-wd) `touch pwned-wd` ;touch pwned-wd\nnext"
    workdir.mkdir()
    spec = minimal_worker_spec(
        workdir=workdir,
        node_argv=(sys.executable, "-c", NODE_PROGRAM, *values),
        env={f"ER_T_{i}": v for i, v in enumerate(values)},
    )
    proc = run_rendered(spec, tmp_path)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout)
    assert seen["argv"] == values
    assert seen["env"] == {f"ER_T_{i}": v for i, v in enumerate(values)}
    assert seen["cwd"] == str(workdir)
    assert not marker.exists()
    assert not list(tmp_path.rglob("pwned*")), "a quoted value was executed"


def test_pre_start_commands_run_as_shell_and_see_the_env(tmp_path):
    spec = minimal_worker_spec(
        workdir=tmp_path,
        node_argv=(sys.executable, "-c", NODE_PROGRAM),
        env={"ER_T_BASE": "a b"},
        pre_start_commands=('export ER_T_DERIVED="$ER_T_BASE-$(echo c)"', "export ER_T_UNSET=${NOT_SET_ANYWHERE}x"),
    )
    proc = run_rendered(spec, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["env"] == {"ER_T_BASE": "a b", "ER_T_DERIVED": "a b-c", "ER_T_UNSET": "x"}


def test_a_failing_pre_start_command_stops_the_script(tmp_path):
    spec = minimal_worker_spec(workdir=tmp_path, node_argv=(sys.executable, "-c", NODE_PROGRAM),
                               pre_start_commands=("false",))
    proc = run_rendered(spec, tmp_path)
    assert proc.returncode != 0 and proc.stdout == ""


def test_a_missing_workdir_stops_the_script(tmp_path):
    spec = minimal_worker_spec(workdir=tmp_path / "absent", node_argv=(sys.executable, "-c", NODE_PROGRAM))
    proc = run_rendered(spec, tmp_path)
    assert proc.returncode != 0 and proc.stdout == ""


def test_srun_gets_one_task_per_node_and_the_cpus(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    (bin_dir / "srun").chmod(0o755)
    script = tmp_path / "job.sbatch"
    script.write_text(render_batch_script(minimal_worker_spec(workdir=tmp_path)))
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "SLURM_JOB_NUM_NODES": "3", "SLURM_CPUS_PER_TASK": "8"}
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True).stdout
    assert out.splitlines() == ["--nodes=3", "--ntasks=3", "--ntasks-per-node=1", "--cpus-per-task=8",
                                "--kill-on-bad-exit=0", "--wait=0", "elastic-agent", "run"]
    env.pop("SLURM_CPUS_PER_TASK")
    out = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True).stdout
    assert "--cpus-per-task" not in out


# ----------------------------------------------------------------- refused values

@pytest.mark.parametrize("name", ["er\nx", "er x", "er'x", 'er"x', "er,other", "", "er#x", "er$x", "er\tx",
                                  "x" * 201, "x" * 129, "er\n", "er:x", "er@x", "er=x", "er+x", "er-\u0661",
                                  None])
def test_bad_job_name_is_refused_naming_the_field(name):
    with pytest.raises(ConfigError, match="^job_name="):
        render_batch_script(full_worker_spec(job_name=name))


@pytest.mark.parametrize("name", ["1ABC", "A-B", "A B", "", "A=B", "A\nB", "ÄB", "AB\n", "\nAB", "AB\u0661"])
def test_bad_env_name_is_refused_naming_the_variable(name):
    with pytest.raises(ConfigError) as info:
        render_batch_script(full_worker_spec(env={name: "v"}))
    assert info.value.field == f"env[{name!r}]"


def test_nul_in_env_value_is_refused():
    with pytest.raises(ConfigError, match=r"env\['X'\]"):
        render_batch_script(full_worker_spec(env={"X": "a\x00b"}))


@pytest.mark.parametrize("command,reason", [("echo a\necho b", "single line"), ("echo a\r", "single line"),
                                            ("echo \x00", "NUL"), ("echo a \\", "backslash")])
def test_bad_pre_start_command_is_refused_naming_its_index(command, reason):
    with pytest.raises(ConfigError, match=reason) as info:
        render_batch_script(full_worker_spec(pre_start_commands=("true", command)))
    assert info.value.field == "pre_start_commands[1]"


@pytest.mark.parametrize("output", ["logs/a\nb.out", "logs/a b.out", "logs/'a'.out", "logs/#a.out",
                                    "logs\\a.out", ""])
def test_bad_output_path_is_refused(output):
    with pytest.raises(ConfigError, match="^output="):
        render_batch_script(full_worker_spec(output=output))


def test_relative_workdir_is_refused():
    with pytest.raises(ConfigError, match="^workdir="):
        render_batch_script(full_worker_spec(workdir=Path("runs/here")))


def test_nul_in_node_argv_is_refused_naming_the_item():
    with pytest.raises(ConfigError, match=re.escape("node_argv[1]")):
        render_batch_script(full_worker_spec(node_argv=("agent", "a\x00b")))


@pytest.mark.parametrize("program", ["--help", "-v", ""])
def test_node_program_that_srun_would_read_as_an_option_is_refused(program):
    with pytest.raises(ConfigError, match=re.escape("node_argv[0]")):
        render_batch_script(full_worker_spec(node_argv=(program, "run")))
