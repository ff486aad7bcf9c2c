"""The agent's answers to control requests, by kind.

Kept apart from the event loop (``agent.runner``), which hands each
authenticated request here: what a request *does* is decided by the
machines (``agent.machine`` for the node, ``agent.head.hosted`` for a hosted or
standby head); this table only says which of them is asked. Runs on the
event loop, like every handler it calls.

Kinds: ``status``; ``drain`` and ``shutdown`` (the node's machine);
``follow`` (read the head pointer now); ``host_head``, ``standby_head`` and
``drop_standby`` (the hosted head's machine); ``mark_dead``
(``agent.head.node_gone``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .machine import DrainRequested, Event, ShutdownRequested

log = logging.getLogger("elastic_ray.agent")

#: A handler takes the request's body and the time it came; it returns the reply body.
Handler = Callable[[Mapping[str, Any], float], dict[str, Any]]


class HostedRequests(Protocol):
    def request(self, now: float) -> dict: ...
    def standby(self, now: float) -> dict: ...
    def drop(self, now: float) -> dict: ...


class MarkDead(Protocol):
    def request(self, body: Any) -> dict[str, Any]: ...


def handlers(*, status: Callable[[], dict[str, Any]], feed: Callable[[Event], None], state: Callable[[], str],
             read_pointer_now: Callable[[], None], hosted: HostedRequests, mark_dead: MarkDead
             ) -> dict[str, Handler]:
    """The table of request kinds, bound to one agent's parts."""

    def drain(body: Mapping[str, Any], now: float) -> dict[str, Any]:
        feed(DrainRequested(now, float(body["deadline"]), str(body.get("reason") or "drain request")))
        return {"ok": True, "state": state()}

    def shutdown(body: Mapping[str, Any], now: float) -> dict[str, Any]:
        feed(ShutdownRequested(now, str(body.get("reason") or "shutdown request")))
        return {"ok": True, "state": state()}

    def follow(body: Mapping[str, Any], now: float) -> dict[str, Any]:
        read_pointer_now()
        return {"ok": True, "state": state()}

    return {
        "status": lambda body, now: {"ok": True, "status": status()},
        "drain": drain,
        "follow": follow,
        "shutdown": shutdown,
        "host_head": lambda body, now: hosted.request(now),
        "standby_head": lambda body, now: hosted.standby(now),
        "drop_standby": lambda body, now: hosted.drop(now),
        "mark_dead": lambda body, now: mark_dead.request(body),
    }


def answer(kind: str, body: Mapping[str, Any], now: float, table: Mapping[str, Handler],
           log_request: Callable[[str], None]) -> dict[str, Any]:
    """The reply to one request; an unknown kind is refused by name, never raised.
    ``status`` requests come often and change nothing: logged at debug level only."""
    if kind == "status":
        log.debug("event=request kind=status")
    else:
        log_request(kind)
    handler = table.get(kind)
    if handler is None:
        return {"ok": False, "error": f"unsupported request {kind}"}
    return handler(body, now)
