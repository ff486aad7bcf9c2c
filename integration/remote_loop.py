"""An outside client running the seed's failover loop over SSH, as its own process.

``python integration/remote_loop.py SPEC`` where SPEC is a JSON file with the
session path, the SSH target's fields, the payload's commit file and unit
count. It opens the session over SSH (never touching its directory), then
runs the loop: launch on the current head; on ``SlurmAllocationEnded``,
``replace_head()`` and launch again. It prints one JSON line per step, so
the test that kills and restarts it can tell how far it got.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from elastic_ray import SlurmAllocationEnded
from elastic_ray.remote import RemoteSession, SshConnection, SshTarget


def say(**event) -> None:
    print(json.dumps({"t": round(time.time(), 3), **event}), flush=True)


def main(spec_path: str) -> int:
    spec = json.load(open(spec_path))
    target = SshTarget(**{k: tuple(v) if k == "options" else v for k, v in spec["ssh"].items()})
    conn = SshConnection(target, control_dir=Path(spec["control_dir"]))
    with RemoteSession.open(spec["path"], ssh=conn, remote_python=spec["remote_python"]) as session:
        return loop(session, spec)


def loop(session: RemoteSession, spec: dict) -> int:
    say(step="opened", supervisor_pid=session.supervisor_pid)
    argv = [spec["remote_python"], "-m", "elastic_ray.demo.payload", spec["commits"], str(spec["total"])]
    head = session.replace_head(timeout=300)
    while True:
        say(step="launch", head=head.job_id)
        try:
            result = session.run(argv, head=head).wait(timeout=600)
            say(step="done", head=result.head_job, seconds=round(result.seconds, 2))
            return 0
        except SlurmAllocationEnded as ended:
            say(step="ended", type=type(ended).__name__, state=ended.allocation_state, job=ended.job_id)
            head = session.replace_head(timeout=300)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
