"""The summary of ``bench_scale.py``: figures (median and range) and the paper section (f)."""

from __future__ import annotations

import statistics

from scale_records import percentile, record_count_check, spread

STANDIN = ("SIMULATION: no Ray runs. `ray start` and the GCS probe are stand-ins (bench/standin/); "
           "agents, session directory, ZeroMQ and the local scheduler are real.")


def _med(values: list[float]) -> float:
    return statistics.median(values)


def _rng(values: list[float], scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    return (f"{fmt.format(_med(values) * scale)} (range {fmt.format(min(values) * scale)}-"
            f"{fmt.format(max(values) * scale)})")


def report(args, r: dict) -> None:
    if not all(k in r for k in "abcde"):
        print(f"\nincomplete run: parts {sorted(k for k in 'abcde' if k in r)} measured")
        for part in ("d", "e"):
            if part in r:
                print(f"({part}) raw: " + str({k: v for k, v in r[part].items() if k != "per_write"})[:2000])
        if "e" in r:
            w = r["e"]["per_write"]
            print(f"(e) per write median {_med(w) * 1e3:.0f} ms, p95 {percentile(w, 0.95) * 1e3:.0f} ms, "
                  f"max {max(w) * 1e3:.0f} ms")
        return
    n = args.nodes
    a, b, c, d, e = r["a"], r["b"], r["c"], r["d"], r["e"]
    rows = a["rows"]
    cpu = [x["cpu"] for x in rows]
    beats = [x["beats"] for x in rows]
    beat_bytes = _med([x["beat_bytes"] for x in rows])
    subs = a["followers"] + 1                      # the workers, plus the bench's own subscriber
    fanout_msgs = _med(beats) * subs
    fanout_bytes = fanout_msgs * beat_bytes
    fds = max(x["fds"] for x in rows)
    conns = max(x["conns"] for x in rows)
    print()
    print("=" * 100)
    print(f"SUMMARY -- {n} worker agents, one head agent. {STANDIN}")
    print("=" * 100)
    su = r["startup"]
    print(f"start-up: head ready {su['head']:.1f} s; all {n} JOINED {su['all']:.1f} s after submission; "
          f"worker agents {su['rss'] / n / 2**20:.1f} MiB RSS each")
    print(f"a) head agent CPU, {len(rows)} windows ({sum(x['wall'] for x in rows):.0f} s): "
          f"{_rng(cpu, 100, '{:.2f}')} % of one core; RSS {rows[-1]['rss'] / 2**20:.0f} MiB, "
          f"{rows[-1]['threads']} threads")
    print(f"   fan-out: {_rng(beats)} beats/s x {subs} subscribers = {fanout_msgs:.0f} messages/s; "
          f"{beat_bytes:.0f} B per beat (payload after CURVE) -> {fanout_bytes / 1024:.1f} KiB/s sent by the head")
    print(f"   head agent holds {fds} file descriptors and {conns} established TCP connections")
    print(f"   all {a['followers']} worker agents together: {_rng([x['workers_cpu'] for x in rows], 100, '{:.1f}')} "
          f"% of one core; loopback traffic of the whole machine "
          f"{_rng([x['lo_bytes'] for x in rows], 1 / 1024, '{:.0f}')} KiB/s, "
          f"{_rng([x['lo_packets'] for x in rows], 1, '{:.0f}')} packets/s")
    print(f"b) `elastic-ray session status` ({b['lines']} lines of output), {len(b['cli'])} runs:")
    print(f"   the CLI in a subprocess: {spread(b['cli'])} ms (target <= 1000 ms); of which the interpreter "
          f"and imports alone: {spread(b['floor'])} ms")
    print(f"   in process: Session.open {spread(b['open'])} ms; collect_status {spread(b['collect'])} ms "
          f"(includes up to 0.5 s heartbeat listening); render {spread(b['render'])} ms; "
          f"reading every node file once {spread(b['nodes_read'])} ms")
    follow = [x["follow"] for x in c if x["follow"] is not None]
    joined = [x["joined"] for x in c if x["joined"] is not None]
    nudge = [x["nudge"] for x in c if x["nudge"] is not None]
    switch = [x["switch"] for x in c]
    print(f"c) moving the head, {len(c)} moves: switch_head (record, pointer, nudges) {_rng(switch)} s, of which "
          f"nudging {n} agents (16 at once) {_rng(nudge) if nudge else 'n/a'} s;")
    print(f"   all {n} published that they follow the new head after "
          f"{_rng(follow) if follow else 'n/a'} s; all JOINED on it after {_rng(joined) if joined else 'n/a'} s"
          f" ({len(follow)}/{len(c)} and {len(joined)}/{len(c)} moves completed)")
    ph = d["phases"]
    print(f"d) election at {d['allocations']} allocations (allocation.json {d['bytes'] / 1024:.0f} KiB), "
          f"{d['runs']} runs: read to chosen head {spread(ph['decided'])} ms (target <= 100 ms)")
    print(f"   read {spread(ph['read'])} ms, assess {spread(ph['assess'], 1e3, '{:.2f}')} ms, take claim "
          f"(locked write) {spread(ph['claim'])} ms, choose_head {spread(ph['choose'], 1e3, '{:.2f}')} ms; "
          f"giving the claim back {spread(ph['release'])} ms more")
    print(f"   chosen: {type(d['choice']).__name__} {d['choice'].job_id}")
    writes = e["per_write"]
    print(f"e) {e['writers']} concurrent writers of allocation.json, {e['rounds']} rounds: all done after "
          f"{spread(e['totals'])} ms; per write median {_med(writes) * 1e3:.0f} ms, p95 "
          f"{percentile(writes, 0.95) * 1e3:.0f} ms, max {max(writes) * 1e3:.0f} ms; "
          f"{len(e['errors'])} errors; {record_count_check(e)}")
    if e["errors"]:
        print("   first errors: " + "; ".join(e["errors"][:3]))
    files = r["files"]
    crowded = sorted(files.items(), key=lambda kv: -kv[1])[:4]
    print("   session directory after the run: " + ", ".join(f"{k}/ {v} entries" for k, v in crowded)
          + f"; {r['probes']} GCS probes run (stand-in)")
    paper(n, r, fanout_msgs, fanout_bytes, fds, conns, crowded, cpu)


def paper(n: int, r: dict, fanout_msgs: float, fanout_bytes: float, fds: int, conns: int,
          crowded: list, cpu: list[float]) -> None:
    d, e, c, b = r["d"], r["e"], r["c"], r["b"]
    per_node_fd = fds / n
    scale = 2000 / n
    follow = [x["follow"] for x in c if x["follow"] is not None]
    nudge = [x["nudge"] for x in c if x["nudge"] is not None]
    logs = dict(crowded).get("logs", 0)
    per_write = _med(e["per_write"])
    total_e = _med(e["totals"])
    print()
    print("f) What grows with the number of nodes, and where the next limit is (figures above; "
          f"2,000-node estimates are x{scale:g} of the linear terms, not measured)")
    soft, hard = __import__("resource").getrlimit(7)
    print(f"   - Head agent descriptors: {fds} at {n} followers, about {per_node_fd:.2f} per follower (one TCP "
          f"connection each to the heartbeat PUB socket; nudges and control requests add short-lived ones). "
          f"At 2,000: about {per_node_fd * 2000:.0f}. The agent raises its soft RLIMIT_NOFILE to the hard limit "
          f"at start (agent/limits.py), so the wall is the site's hard limit: fine at 4096 or more, but a node "
          f"with a hard limit of 1024 stops the head agent near 1,000 followers (this machine: {soft}/{hard}).")
    print(f"   - Heartbeat fan-out: PUB sends one copy per subscriber: {fanout_msgs:.0f} msg/s, "
          f"{fanout_bytes / 1024:.0f} KiB/s at {n}; at 2,000 about {fanout_msgs * scale:.0f} msg/s, "
          f"{fanout_bytes * scale / 2**20:.1f} MiB/s plus CURVE and TCP framing: small for a NIC, "
          f"but all of it is encrypted by the head agent's one ZeroMQ I/O thread.")
    print(f"   - Head agent CPU: {_med(cpu) * 100:.2f} % of one core at {n}; the part that grows is the "
          f"per-subscriber send and encryption in ZeroMQ's I/O thread, so roughly x{scale:g} at 2,000.")
    nudge_med = _med(nudge) if nudge else float("nan")
    print(f"   - Moving the head: the nudges (coordinator/head/nudges.py) go out from a background thread, 16 at a "
          f"time, each a new socket and CURVE handshake, and are dropped after 3 s ({nudge_med:.2f} s for {n}, "
          f"about {nudge_med * scale:.0f} s at 2,000, so past the deadline: the rest follow by their own pointer "
          f"read within a second); the agents also read the pointer on their own (all followed after "
          f"{_med(follow) if follow else float('nan'):.1f} s here), and on 2 cores their restarts, not the "
          f"nudges, set the pace.")
    print(f"   - Session directory: one node file per node in jobs/<job>/nodes/ and two logs per node in "
          f"logs/ ({logs} entries now); 2,000 nodes put about {logs * scale:.0f} files in logs/: fine for "
          f"ext4/xfs, slow to list on Lustre/GPFS, and every `session status` reads every node file "
          f"({_med(b['nodes_read']) * 1e3:.0f} ms for {n} here, about {_med(b['nodes_read']) * scale:.1f} s at 2,000).")
    print(f"   - allocation.json grows with allocations, not nodes: the election path at {d['allocations']} "
          f"allocations decides in {_med(d['phases']['decided']) * 1e3:.0f} ms, most of it the locked write of "
          f"a {d['bytes'] / 1024:.0f} KiB record (about half of a write is json.dumps(indent=2), which cannot use "
          f"the C encoder); writes serialise on one lock ({per_write * 1e3:.0f} ms median wait+write each "
          f"under contention, {total_e:.1f} s for {e['writers']} at once), so bursts of submissions queue "
          f"linearly.")
    print("   - slurmctld: the session asks the scheduler once per poll for all its jobs "
          "(bench_scheduler_load.py); the number of nodes does not add queries, the number of jobs adds rows.")
