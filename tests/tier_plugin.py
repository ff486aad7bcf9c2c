"""A pytest plugin for ``tests/test_tiers.py``: after collection, write what
each collected test is (node id, markers, fixtures) as JSON to the file named
by ``$ELASTIC_RAY_TIER_DUMP``. Loaded with ``-p tests.tier_plugin`` in a
``--collect-only`` run; it changes nothing of the run itself."""

from __future__ import annotations

import json
import os


def pytest_collection_finish(session) -> None:
    target = os.environ.get("ELASTIC_RAY_TIER_DUMP")
    if not target:
        return
    rows = [{"nodeid": item.nodeid,
             "markers": sorted({m.name for m in item.iter_markers()}),
             "fixtures": sorted(getattr(item, "fixturenames", ()))}
            for item in session.items]
    with open(target, "w") as handle:
        json.dump(rows, handle)
