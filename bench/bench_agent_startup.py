"""The agent's start-up on the way to `ray start`, before vs after (prints figures, asserts nothing).

Two figures per run, for a base commit's code (BEFORE) and this tree's
(AFTER), alternating run by run so load on the box hits both alike:

- import time: ``python -X importtime`` of the agent's entry module and its
  runner (the sum of their cumulative times);
- wall time from exec of ``python -m elastic_ray.agent run --role head`` to
  the agent's ``event=ray_memory`` log line, which it writes right before it
  spawns ``ray start`` (the same line in both trees).

No real Ray is started: the agent runs from a copy of the venv whose ``ray``
script only sleeps, so the figures are the agent's own. Both trees are copied
to a temp dir and byte-compiled (as an installed package would be; this box
sets PYTHONDONTWRITEBYTECODE). Run it alone on the box:

    flock /tmp/elastic-heavy.lock /work/main/.venv/bin/python bench/bench_agent_startup.py
"""

from __future__ import annotations

import argparse
import compileall
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
IMPORT = "import elastic_ray.agent.cli, elastic_ray.agent.runner"
MARKER = "event=ray_memory"
NODE_IP = "127.0.0.2"


def shadow_venv(tmp: Path) -> Path:
    """A venv that is this one except for its ``ray`` script (``sleep``)."""
    venv = Path(sys.prefix)
    shadow = tmp / "venv"
    (shadow / "bin").mkdir(parents=True)
    shutil.copy(venv / "pyvenv.cfg", shadow / "pyvenv.cfg")
    (shadow / "lib").symlink_to(venv / "lib")
    (shadow / "bin" / "python").symlink_to(os.path.realpath(sys.executable))
    ray = shadow / "bin" / "ray"
    ray.write_text("#!/bin/sh\nexec sleep 300\n")
    ray.chmod(0o755)
    return shadow / "bin" / "python"


def trees(tmp: Path, base: str) -> dict[str, Path]:
    before, after = tmp / "before", tmp / "after"
    before.mkdir()
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", base, "elastic_ray"], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(before)], input=archive, check=True)
    shutil.copytree(ROOT / "elastic_ray", after / "elastic_ray", ignore=shutil.ignore_patterns("__pycache__"))
    for tree in (before, after):
        compileall.compile_dir(str(tree), quiet=1)
    return {"before": before, "after": after}


def session(tmp: Path) -> Path:
    from elastic_ray.config.launcher import RayLauncher
    from elastic_ray.protocol.disk.records import SessionInfo
    from elastic_ray.protocol.disk.session_dir import SessionDir

    info = SessionInfo(session_id="s-bench-startup", job_name="er-bench", created_at=time.time(),
                       scheduler={"kind": "local"}, head={"partition": "cpu"}, worker_allocation=None,
                       launcher=RayLauncher().to_dict())
    directory = SessionDir.create(tmp / "session", info)
    directory.ensure_ray_token()
    return directory.path


def env_for(tree: Path) -> dict[str, str]:
    """Run from ``tree`` (also the cwd: ``-m`` and ``-c`` put the cwd first on sys.path)."""
    env = dict(os.environ, PYTHONPATH=str(tree), ELASTIC_RAY_NODE_IP=NODE_IP)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def import_times(python: Path, tree: Path) -> tuple[float, dict[str, float]]:
    """(seconds for the two top-level imports, cumulative seconds per module)."""
    out = subprocess.run([str(python), "-X", "importtime", "-c", IMPORT], env=env_for(tree), cwd=tree,
                         capture_output=True, text=True, check=True).stderr
    per: dict[str, float] = {}
    total = 0.0
    for line in out.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \|( *)(\S+)", line)
        if not m:
            continue
        cumulative, depth, name = int(m.group(1)) / 1e6, len(m.group(2)), m.group(3)
        per[name] = max(per.get(name, 0.0), cumulative)
        if depth == 1 and name.startswith("elastic_ray.agent."):
            total += cumulative
    return total, per


def to_spawn(python: Path, tree: Path, sess: Path, job: str) -> float | None:
    """Seconds from exec of the agent to its log line before `ray start`."""
    from elastic_ray.protocol.disk import paths

    node = f"bench{job}"
    log = paths.agent_log(sess, job, node)
    argv = [str(python), "-m", "elastic_ray.agent", "run", "--session", str(sess), "--job", job,
            "--role", "head", "--node", node]
    t0 = time.time()
    proc = subprocess.Popen(argv, env=env_for(tree), cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    at = None
    try:
        deadline = t0 + 60
        while time.time() < deadline and proc.poll() is None:
            text = log.read_text() if log.exists() else ""
            line = next((ln for ln in text.splitlines() if MARKER in ln), None)
            if line:
                stamp = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
                at = stamp.timestamp() - t0
                break
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGTERM)   # the agent stops its (fake) Ray node and exits
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return at


def summary(name: str, values: list[float]) -> str:
    if not values:
        return f"{name}: no figures"
    return (f"{name}: median {statistics.median(values) * 1000:7.1f} ms  range "
            f"{min(values) * 1000:7.1f}-{max(values) * 1000:7.1f} ms  (n={len(values)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--base", default="e3ece8e", help="the BEFORE commit")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-agent-startup-"))
    try:
        python = shadow_venv(tmp)
        code = trees(tmp, args.base)
        sess = session(tmp)
        from elastic_ray.agent.status import runtime_dir
        files = len(list(runtime_dir().glob("*.json"))) if runtime_dir().is_dir() else 0
        print(f"agent status files on this node (each agent reads them all when it prunes): {files}")
        for which, tree in code.items():
            where = subprocess.run([str(python), "-c", "import elastic_ray.agent.runner as r; print(r.__file__)"],
                                   env=env_for(tree), cwd=tree, capture_output=True, text=True).stdout.strip()
            print(f"{which}: the agent runs {where}")
        imports: dict[str, list[float]] = {"before": [], "after": []}
        walls: dict[str, list[float]] = {"before": [], "after": []}
        modules: dict[str, dict[str, list[float]]] = {"before": {}, "after": {}}
        for i in range(args.runs):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for k, which in enumerate(order):
                total, per = import_times(python, code[which])
                imports[which].append(total)
                for name, seconds in per.items():
                    modules[which].setdefault(name, []).append(seconds)
                wall = to_spawn(python, code[which], sess, str(91000 + 2 * i + k))
                if wall is not None:
                    walls[which].append(wall)
                print(f"run {i + 1} {which:6}: imports {total * 1000:6.1f} ms, exec to ray start "
                      f"{'-' if wall is None else f'{wall * 1000:.0f} ms'}", flush=True)
        print()
        for which in ("before", "after"):
            print(summary(f"{which:6} imports (agent.cli + agent.runner)", imports[which]))
        for which in ("before", "after"):
            print(summary(f"{which:6} exec -> spawning ray start     ", walls[which]))
        for which in ("before", "after"):
            print(f"\n{which}: top 15 imports by cumulative time (median over runs)")
            ranked = sorted(((statistics.median(v), n) for n, v in modules[which].items()), reverse=True)
            for seconds, name in ranked[:15]:
                print(f"  {seconds * 1000:7.1f} ms  {name}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
