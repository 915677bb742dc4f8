"""A checker for the Chrome JSON trace format as Perfetto ingests it (used when Perfetto's own
trace_processor cannot run: its Python package downloads a binary on first use, which fails offline).

Rules from the Trace Event Format document (docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU)
and Perfetto's JSON importer notes (perfetto.dev/docs/getting-started/other-formats): ``X`` complete events need
``ts`` and ``dur``; ``C`` counter events carry numeric ``args`` (one series per key); ``M`` metadata names
processes and threads; flow events ``s`` / ``f`` pair by (``cat``, ``name``, ``id``) and bind to the slice that
encloses them on their own thread (``bp: "e"`` on ``f``: the enclosing slice, not the next one); slices on one
track must nest perfectly (Perfetto drops partial overlaps).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from typing import Any

PHASES = {"X", "B", "E", "i", "I", "C", "M", "s", "t", "f", "b", "e", "n"}
META = {"process_name", "process_sort_index", "thread_name", "thread_sort_index", "process_labels"}


def check_chrome_json(doc: dict[str, Any]) -> dict[str, int]:
    """Assert the document is well-formed; returns counts (slices, flows, cross_pid_flows, counters, counter_tracks)."""
    assert isinstance(doc.get("traceEvents"), list), "traceEvents must be a list"
    assert doc.get("displayTimeUnit", "ms") in ("ms", "ns")
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    flows: dict[tuple[str, str, Any], dict[str, dict]] = defaultdict(dict)
    counters: set[tuple[int, str, str]] = set()
    n_c = 0
    for e in doc["traceEvents"]:
        ph = e.get("ph")
        assert ph in PHASES, f"unknown ph {ph!r}: {e}"
        assert isinstance(e.get("pid"), int), f"pid must be an int: {e}"
        if ph == "M":
            assert e["name"] in META and isinstance(e.get("args"), dict), e
            continue
        assert isinstance(e.get("ts"), (int, float)), f"ts must be a number: {e}"
        assert isinstance(e.get("name"), str), e
        if ph == "X":
            assert isinstance(e.get("tid"), int) and isinstance(e.get("dur"), (int, float)) and e["dur"] >= 0, e
            slices[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"]))
        elif ph == "C":
            args = e.get("args")
            assert isinstance(args, dict) and args, e
            for k, v in args.items():
                assert isinstance(v, (int, float)) and v == v, f"counter value must be a finite number: {e}"
                counters.add((e["pid"], e["name"], k))
            n_c += 1
        elif ph in ("s", "f", "t"):
            assert "id" in e and isinstance(e.get("tid"), int) and isinstance(e.get("cat"), str), e
            key = (e["cat"], e["name"], e["id"])
            assert ph not in flows[key], f"flow {key} has two {ph!r} events"
            if ph == "f":
                assert e.get("bp") == "e", f"flow end must bind to its enclosing slice (bp: e): {e}"
            flows[key][ph] = e
        elif ph in ("i", "I"):
            assert e.get("s", "t") in ("t", "p", "g"), e
    starts: dict[tuple[int, int], list[float]] = {}
    for k, v in slices.items():
        v.sort()
        starts[k] = [a for a, _ in v]

    def enclosed(ev: dict) -> bool:
        tr = (ev["pid"], ev["tid"])
        if tr not in slices:
            return False
        i = bisect.bisect_right(starts[tr], ev["ts"])
        return any(a <= ev["ts"] <= b for a, b in slices[tr][max(0, i - 64):i])

    cross = 0
    for key, ends in flows.items():
        assert set(ends) >= {"s", "f"}, f"flow {key} lacks a start or an end: {sorted(ends)}"
        assert ends["s"]["ts"] <= ends["f"]["ts"] + 1e-3, f"flow {key} ends before it starts"
        for ph in ("s", "f"):
            assert enclosed(ends[ph]), f"flow {key} {ph!r} is not inside a slice on its track: {ends[ph]}"
        cross += ends["s"]["pid"] != ends["f"]["pid"]
    return {"slices": sum(len(v) for v in slices.values()), "flows": len(flows), "cross_pid_flows": cross,
            "counters": n_c, "counter_tracks": len(counters)}
