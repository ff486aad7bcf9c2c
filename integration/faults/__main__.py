"""Run the fault matrix on the lab and print (and optionally publish) its table.

    python -m integration.faults                 # every scenario (< 30 min on 2 cores)
    python -m integration.faults --ci            # one scenario of each family
    python -m integration.faults --only head-cancel,worker-network-cut
    python -m integration.faults --write-status  # also replace the table in docs/status.md

Needs root and the lab (started here if it is down, and then stopped again).
Writes every scenario's events and figures to ``.lab/faults/<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path

from integration.faults import lab_ops
from integration.faults.harness import Result, run_scenario
from integration.faults.scenarios import BY_NAME, SCENARIOS
from integration.faults.table import render_table, replace_block

REPO = Path(__file__).resolve().parents[2]

STATUS_DOC = REPO / "docs" / "status.md"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m integration.faults", description=__doc__.splitlines()[0])
    ap.add_argument("--ci", action="store_true", help="only the scenarios marked for CI (one per family)")
    ap.add_argument("--only", default="", help="comma-separated scenario names")
    ap.add_argument("--write-status", action="store_true", help=f"replace the fault table in {STATUS_DOC}")
    ap.add_argument("--list", action="store_true", help="list the scenarios and exit")
    args = ap.parse_args(argv)

    if args.list:
        for sc in SCENARIOS:
            print(f"{sc.name:26} {sc.family:12} {'ci ' if sc.ci else '   '}{sc.title}")
        return 0
    chosen = SCENARIOS
    if args.only:
        names = [n.strip() for n in args.only.split(",") if n.strip()]
        unknown = [n for n in names if n not in BY_NAME]
        if unknown:
            ap.error(f"--only: unknown scenario(s) {', '.join(unknown)}; --list shows them")
        chosen = [BY_NAME[n] for n in names]
    elif args.ci:
        chosen = [s for s in SCENARIOS if s.ci]

    labctl = lab_ops.labctl
    started = False
    if not labctl.is_up():
        labctl.up(4)
        started = True
    os.environ["SLURM_CONF"] = str(labctl.settings_from_env().conf)
    base = labctl.settings_from_env().shared_dir / "faults"
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    results: list[Result] = []
    try:
        for sc in chosen:
            results.append(run_scenario(sc, base))
    finally:
        if started:
            labctl.down()
    minutes = (time.time() - t0) / 60
    command = "python -m integration.faults" + (" --ci" if args.ci and not args.only else "") + (
        f" --only {args.only}" if args.only else "")
    table = render_table(results, command=command, minutes=minutes)
    print("\n" + table)
    out_dir = REPO / ".lab" / "faults"
    out_dir.mkdir(parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    (out_dir / f"{stamp}.json").write_text(json.dumps([asdict(r) for r in results], indent=1, default=str))
    print(f"details: {out_dir / (stamp + '.json')}")
    if args.write_status:
        STATUS_DOC.write_text(replace_block(STATUS_DOC.read_text(), table))
        print(f"updated {STATUS_DOC}")
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
