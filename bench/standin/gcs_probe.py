"""Stand-in for ``python -m elastic_ray.agent.node.gcs_probe``, for simulations only.

Named by ``ELASTIC_RAY_GCS_PROBE`` (see ``elastic_ray/agent/node/simulation.py``)
next to the stand-in ``ray`` of this folder, where no GCS runs. It answers
every op the way a healthy GCS would (one JSON line, exit 0) without
importing Ray: ``ready`` answers, ``mark-dead`` marks every id it is given,
``drain`` is accepted, ``alive`` is true, ``nodes`` is empty and
``own-node`` finds none (the stand-in raylet's log already names the node).
Every call appends one line to ``$ELASTIC_RAY_STANDIN_PROBE_LOG`` when set,
so a simulation can count how often the agents would have asked a GCS.
"""

import json
import os
import sys
import time


def main(argv: list[str]) -> int:
    if not argv:
        print(json.dumps({"ok": False, "op": "", "error": "usage", "message": "no op"}))
        return 2
    op = argv[0]
    opts = dict(a[2:].split("=", 1) for a in argv[1:] if a.startswith("--") and "=" in a)
    log = os.environ.get("ELASTIC_RAY_STANDIN_PROBE_LOG")
    if log:
        with open(log, "a") as fh:
            fh.write(f"{time.time():.3f} {os.getppid()} {op} {opts.get('address', '-')}\n")
    answer: dict = {"ok": True, "op": op}
    if op == "ready":
        answer.update(cluster_id="standin", session_name="standin")
    elif op == "nodes":
        answer["nodes"] = []
    elif op == "own-node":
        answer["node"] = None
    elif op == "drain":
        answer.update(accepted=True, message="")
    elif op == "alive":
        answer["alive"] = True
    elif op == "mark-dead":
        ids = [i for i in opts.get("node-ids", "").split(",") if i]
        answer.update(marked=ids, already_dead=[], still_alive=[])
    else:
        print(json.dumps({"ok": False, "op": op, "error": "usage", "message": f"unknown op {op!r}"}))
        return 2
    print(json.dumps(answer))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
