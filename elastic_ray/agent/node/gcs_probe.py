"""One GCS operation in a short-lived process: ``python -m elastic_ray.agent.node.gcs_probe <op> ...``.

Why a separate process: ``import ray`` costs about 75 MB of RSS and the agent
must stay small for days on every node; and a GCS call can block for tens of
seconds when the GCS is gone (the client's constructor alone waits 40 s by
default). A probe imports Ray, does one thing, prints ONE JSON line on stdout
and exits; the agent (:mod:`elastic_ray.agent.node.gcs`) runs it with a timeout
and kills it by PID when that expires.

Ops (all take ``--address HOST:PORT`` and ``--timeout SECONDS``):

``ready``
    The GCS answers. Returns the cluster id and, when cheap, the session name.
``nodes``
    Every node the GCS knows, alive or dead (see :func:`_node_record`).
``own-node --temp-dir T [--session-dir S]``
    The ALIVE node whose raylet socket lives under ``T`` (or exactly under
    the session dir ``S``): how an agent learns its own node id. If a restart
    in the same temp dir left the old incarnation ALIVE for a while, the
    newest one wins. ``node`` is null when there is none.
``drain --node-id H --reason preemption|idle --message M [--deadline-ms D]``
    ``GcsClient.drain_node`` (what ``ray drain-node`` and the autoscaler
    use; private API). A deadline only informs Ray, nothing is killed.
    Returns ``accepted`` and Ray's rejection message.
``alive --node-id H``
    ``GcsClient.check_alive`` for one node.
``mark-dead --node-ids H1,H2 --message M``
    Mark nodes DEAD in the GCS at once, whether or not their raylet still
    answers: ``NodeInfoGcsService.UnregisterNode`` (what a raylet sends for
    itself when it shuts down cleanly; private API), with an
    ``UNEXPECTED_TERMINATION`` death reason and ``M`` as its message. The GCS
    removes the node as its own health check would, only without the
    15-20 s wait. (``drain_nodes``/``DrainNode`` is no substitute: it asks
    the raylet to shut down, which a dead raylet never does.) Only nodes the
    GCS still holds ALIVE are sent (Ray 2.60 never answers an UnregisterNode
    for a node it already removed). Returns ``marked`` (ALIVE before, not
    after), ``already_dead`` (not ALIVE before, unknown ids included) and
    ``still_alive``.

``resource-state``
    What Ray waits for and how busy its nodes are, for the autoscaler
    (``coordinator/scaling/ray_demand``): the GCS's ``ClusterResourceState``
    (``get_cluster_resource_state``, what Ray's own autoscaler reads) as
    ``MessageToDict`` gives it with the proto's field names, under
    ``state``, and the ``request_resources`` bundles Ray's autoscaler v1
    keeps in the GCS key-value store, under ``requested`` (null: none).
    The coordinator reads both with ``autoscale.demand.read_state``.
    With ``--serve`` the probe stays: it answers one line for every line it
    reads on stdin and ends at EOF, so a caller asking every few seconds
    pays the interpreter and ``import ray`` once (the autoscaler's watcher,
    ``coordinator/scaling/ray_demand``). A failed ask is answered like a
    failed op and the probe goes on; ``--timeout`` bounds the connection.

Output: ``{"ok": true, "op": ..., ...}`` and exit 0, or
``{"ok": false, "op": ..., "error": <kind>, "message": ...}`` and exit 1
(exit 2 for a usage error); kinds: ``usage``, ``unreachable``, ``auth``, or
the Python exception's class name. stdout carries nothing else: while the op runs,
file descriptor 1 points at stderr, so even a stray print or a C++ log line
cannot corrupt the answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

OPS = ("ready", "nodes", "own-node", "drain", "alive", "mark-dead", "resource-state")
MAX_MARK_DEAD = 256
DRAIN_REASONS = {
    "preemption": "DRAIN_NODE_REASON_PREEMPTION",
    "idle": "DRAIN_NODE_REASON_IDLE_TERMINATION",
}


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise _UsageError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m elastic_ray.agent.node.gcs_probe", add_help=False)
    parser.add_argument("op", choices=OPS)
    parser.add_argument("--address", required=True)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--temp-dir")
    parser.add_argument("--session-dir")
    parser.add_argument("--node-id")
    parser.add_argument("--reason", choices=sorted(DRAIN_REASONS))
    parser.add_argument("--message", default="")
    parser.add_argument("--deadline-ms", type=int, default=0)
    parser.add_argument("--node-ids", default="")
    parser.add_argument("--serve", action="store_true")
    return parser


def _bound_connect_time(timeout: float) -> None:
    """Bound the GcsClient constructor before Ray is imported (it reads these once).

    Defaults: 5 s to connect, 5 s for pubsub, 30 s for the cluster id -- 40 s
    against an absent GCS. With these (1 + 1 + timeout - 2) the constructor
    gives up after about ``timeout`` s (at least 3 s), so the probe usually
    answers "unreachable" itself before the agent's kill timer fires.
    """
    os.environ["RAY_gcs_rpc_server_connect_timeout_s"] = "1"
    os.environ["RAY_py_gcs_connect_timeout_s"] = str(max(1, int(timeout) - 2))
    # Keep the probe quiet and local.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    os.environ.setdefault("RAY_BACKEND_LOG_LEVEL", "error")


def _enum_name(message: Any, field: str, value: int) -> str:
    """Name of an enum value, found through the message's own descriptor.

    The enums live in different generated modules across Ray versions
    (``NodeDeathInfo`` is not in ``gcs_pb2`` in 2.60); the descriptor always
    knows.
    """
    try:
        enum = message.DESCRIPTOR.fields_by_name[field].enum_type
        return enum.values_by_number[value].name
    except (KeyError, AttributeError):
        return str(value)


def _node_record(node_id: Any, info: Any, draining: dict[str, int] | None) -> dict[str, Any]:
    """The parts of a GcsNodeInfo the agent and the coordinator use."""
    hex_id = node_id.hex() if hasattr(node_id, "hex") else bytes(info.node_id).hex()
    record: dict[str, Any] = {
        "node_id": hex_id,
        "state": _enum_name(info, "state", info.state),
        "node_manager_address": info.node_manager_address,
        "node_manager_port": info.node_manager_port,
        "raylet_socket_name": info.raylet_socket_name,
        "node_name": info.node_name,
        "is_head_node": bool(info.is_head_node),
        "start_time_ms": int(info.start_time_ms),
        "end_time_ms": int(info.end_time_ms),
        "resources_total": dict(info.resources_total),
        "labels": dict(info.labels),
        "death_reason": None,
        "death_reason_name": None,
        "death_message": None,
        "draining": False,
        "drain_deadline_ms": None,
    }
    if info.HasField("death_info"):
        record["death_reason"] = int(info.death_info.reason)
        record["death_reason_name"] = _enum_name(info.death_info, "reason", info.death_info.reason)
        record["death_message"] = info.death_info.reason_message
    snapshot_state = None
    if info.HasField("state_snapshot"):
        snapshot_state = _enum_name(info.state_snapshot, "state", info.state_snapshot.state)
    if draining is not None and hex_id in draining:
        record["draining"] = True
        record["drain_deadline_ms"] = int(draining[hex_id]) or None
    elif snapshot_state == "DRAINING":
        record["draining"] = True
    return record


def _all_nodes(client: Any, timeout: float) -> list[dict[str, Any]]:
    infos = client.get_all_node_info(timeout=timeout)
    try:
        draining = {str(k): int(v) for k, v in client.get_draining_nodes(timeout=timeout).items()}
    except Exception:           # older Ray without the call, or a GCS hiccup: use the snapshot only
        draining = None
    return [_node_record(node_id, info, draining) for node_id, info in infos.items()]


def _check_args(args: argparse.Namespace) -> None:
    """Usage errors are reported before any connection attempt."""
    if args.timeout <= 0:
        raise _UsageError("--timeout must be > 0")
    if args.op == "own-node" and not args.temp_dir and not args.session_dir:
        raise _UsageError("own-node needs --temp-dir or --session-dir")
    if args.op in ("drain", "alive") and not args.node_id:
        raise _UsageError(f"{args.op} needs --node-id")
    if args.op == "drain" and not args.reason:
        raise _UsageError("drain needs --reason")
    if args.serve and args.op != "resource-state":
        raise _UsageError("--serve is for resource-state only")
    if args.op == "mark-dead":
        ids = [i for i in args.node_ids.split(",") if i]
        if not ids or len(ids) > MAX_MARK_DEAD:
            raise _UsageError(f"mark-dead needs --node-ids with 1 to {MAX_MARK_DEAD} comma-separated ids")


def _token_missing() -> bool:
    """Token mode without any token: Ray's C++ client aborts the process
    (no exception, no answer), so the probe checks Ray's lookup order first:
    RAY_AUTH_TOKEN, the file RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token."""
    if os.environ.get("RAY_AUTH_MODE", "").strip().lower() != "token":
        return False
    if os.environ.get("RAY_AUTH_TOKEN", "").strip():
        return False
    for path in (os.environ.get("RAY_AUTH_TOKEN_PATH", ""), os.path.expanduser("~/.ray/auth_token")):
        try:
            if path and open(path, "rb").read().strip():
                return False
        except OSError:
            pass
    return True


class _AuthError(Exception):
    pass


def _run(args: argparse.Namespace) -> dict[str, Any]:
    if _token_missing():
        raise _AuthError("RAY_AUTH_MODE=token but no token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, ~/.ray/auth_token)")
    started = time.monotonic()
    from ray._raylet import GcsClient, NodeID

    node = None
    if args.node_id:
        try:
            node = NodeID.from_hex(args.node_id)
        except Exception as exc:
            raise _UsageError(f"--node-id {args.node_id!r} is not a node id: {exc}") from None
        if node == NodeID.nil():
            raise _UsageError("--node-id is the nil id")

    client = GcsClient(address=args.address)
    left = lambda: max(0.5, args.timeout - (time.monotonic() - started))  # noqa: E731
    if args.op == "ready":
        client.check_alive([], timeout=left())
        out: dict[str, Any] = {"cluster_id": client.cluster_id.hex()}
        try:
            from ray._private import ray_constants
            name = client.internal_kv_get(b"session_name", ray_constants.KV_NAMESPACE_SESSION,
                                          timeout=left())
            out["session_name"] = name.decode() if name else None
        except Exception:
            out["session_name"] = None
        return out
    if args.op == "nodes":
        return {"nodes": _all_nodes(client, left())}
    if args.op == "own-node":
        prefix = (args.session_dir or args.temp_dir).rstrip("/") + "/"
        mine = [n for n in _all_nodes(client, left())
                if n["state"] == "ALIVE" and n["raylet_socket_name"].startswith(prefix)]
        mine.sort(key=lambda n: n["start_time_ms"])
        return {"node": mine[-1] if mine else None, "matches": len(mine)}
    if args.op == "mark-dead":
        return _mark_dead(client, args, left)
    if args.op == "resource-state":
        return _resource_state(client, left)
    if args.op == "alive":
        # check_alive takes NodeID objects (raw bytes crash the 2.60 client).
        return {"node_id": args.node_id, "alive": bool(client.check_alive([node], timeout=left())[0])}
    # drain
    from ray.core.generated import autoscaler_pb2

    reason = autoscaler_pb2.DrainNodeReason.Value(DRAIN_REASONS[args.reason])
    call = (args.node_id, reason, args.message, max(0, args.deadline_ms))
    try:
        accepted, message = client.drain_node(*call, timeout=left())
    except TypeError:           # Ray before 2.60: no timeout keyword
        accepted, message = client.drain_node(*call)
    return {"node_id": args.node_id, "accepted": bool(accepted), "message": message or ""}


def _mark_dead(client: Any, args: argparse.Namespace, left: Any) -> dict[str, Any]:
    """Unregister the ALIVE ones of ``--node-ids`` (see the module docstring)."""
    from ray._private.grpc_utils import init_grpc_channel
    from ray._raylet import NodeID
    from ray.core.generated import common_pb2, gcs_service_pb2, gcs_service_pb2_grpc

    hexes = list(dict.fromkeys(i.strip().lower() for i in args.node_ids.split(",") if i.strip()))
    ids = []
    for text in hexes:
        try:
            ids.append(NodeID.from_hex(text))
        except Exception as exc:
            raise _UsageError(f"--node-ids: {text!r} is not a node id: {exc}") from None
    before = client.check_alive(ids, timeout=left())
    alive = [(h, n) for h, n, a in zip(hexes, ids, before) if a]
    if alive:
        # The channel adds Ray's token (RAY_AUTH_MODE / RAY_AUTH_TOKEN_PATH) and TLS settings itself.
        channel = init_grpc_channel(args.address)
        try:
            stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
            death = common_pb2.NodeDeathInfo(reason=common_pb2.NodeDeathInfo.UNEXPECTED_TERMINATION,
                                             reason_message=args.message[:500] or "reported gone")
            for _hex, node in alive:
                stub.UnregisterNode(gcs_service_pb2.UnregisterNodeRequest(node_id=node.binary(),
                                                                         node_death_info=death),
                                    timeout=left())
        finally:
            channel.close()
    after = client.check_alive([n for _, n in alive], timeout=left()) if alive else []
    return {"marked": [h for (h, _), a in zip(alive, after) if not a],
            "still_alive": [h for (h, _), a in zip(alive, after) if a],
            "already_dead": [h for h, a in zip(hexes, before) if not a]}


def _resource_state(client: Any, left: Any) -> dict[str, Any]:
    from google.protobuf.json_format import MessageToDict
    from ray.autoscaler.v2.sdk import get_cluster_resource_state

    state = MessageToDict(get_cluster_resource_state(client), preserving_proto_field_name=True)
    raw = client.internal_kv_get(b"autoscaler_resource_request", None, timeout=left())
    try:
        requested = json.loads(raw) if raw else None
    except ValueError:
        requested = None     # not ours to judge: the reader sees no request
    return {"state": state, "requested": requested}


def main(argv: list[str] | None = None) -> int:
    # Everything but our answer goes to stderr: fd 1 is pointed there while
    # the op runs, and the answer is written to a saved copy of the real stdout.
    sys.stdout.flush()
    answer_fd = os.dup(1)
    os.dup2(2, 1)
    op = "?"
    try:
        try:
            args = _parser().parse_args(argv)
            op = args.op
            _check_args(args)
        except _UsageError as exc:
            return _answer(answer_fd, {"ok": False, "op": op, "error": "usage", "message": str(exc)}, 2)
        _bound_connect_time(args.timeout)
        if args.serve:
            return _serve(args, answer_fd)
        try:
            result = _run(args)
        except _UsageError as exc:
            return _answer(answer_fd, {"ok": False, "op": op, "error": "usage", "message": str(exc)}, 2)
        except Exception as exc:    # one JSON line whatever went wrong
            kind = _error_kind(exc)
            return _answer(answer_fd, {"ok": False, "op": op, "error": kind, "message": str(exc)[:2000]}, 1)
        return _answer(answer_fd, {"ok": True, "op": op, **result}, 0)
    finally:
        os.close(answer_fd)


def _error_kind(exc: BaseException) -> str:
    """``auth`` (wrong or missing token: retrying will not help), ``unreachable``
    (no GCS answered in time), else the exception's class name."""
    name, text = type(exc).__name__, str(exc)
    if isinstance(exc, _AuthError) or "UNAUTHENTICATED" in text or "Authentication" in name or "InvalidAuthToken" in text or "authentication token" in text.lower():
        return "auth"
    if "Timed out while waiting for GCS" in text or name in ("RpcError", "GetTimeoutError"):
        return "unreachable"
    return name


def _serve(args: argparse.Namespace, fd: int) -> int:
    """``resource-state --serve``: one answer a request line, until stdin ends."""
    client = None
    for _line in iter(sys.stdin.buffer.readline, b""):
        started = time.monotonic()
        left = lambda: max(0.5, args.timeout - (time.monotonic() - started))  # noqa: E731
        try:
            if _token_missing():
                raise _AuthError("RAY_AUTH_MODE=token but no token (RAY_AUTH_TOKEN, RAY_AUTH_TOKEN_PATH, "
                                 "~/.ray/auth_token)")
            if client is None:
                from ray._raylet import GcsClient
                client = GcsClient(address=args.address)
            _answer(fd, {"ok": True, "op": args.op, **_resource_state(client, left)}, 0)
        except Exception as exc:    # one JSON line whatever went wrong; the next ask tries again
            _answer(fd, {"ok": False, "op": args.op, "error": _error_kind(exc), "message": str(exc)[:2000]}, 1)
    return 0


def _answer(fd: int, payload: dict[str, Any], code: int) -> int:
    data = (json.dumps(payload, separators=(",", ":"), sort_keys=True) + "\n").encode()
    while data:
        data = data[os.write(fd, data):]
    return code


if __name__ == "__main__":
    # os._exit: skip Ray's atexit hooks and gRPC teardown, which can take
    # seconds or hang after a failed connection; the answer is already out.
    code = main()
    sys.stderr.flush()
    os._exit(code)
