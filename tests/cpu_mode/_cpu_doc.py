"""Tiny gloo CPU Kineto documents with known answers (shaped like real torch 2.x CPU captures).

Per rank: the forward thread (tid 1) runs ``tk.fwd[...]`` steps with ``attn``,
``router``, ``moe.experts`` ranges and top-level ``aten::*`` ops (nested children
inside); each collective is a ``c10d::allreduce_`` op on the forward thread that
issues one ``gloo:all_reduce`` range on gloo's worker thread (tid 50), which ends
when the last rank arrived + ``TRANSFER_US``. ``delays[rank][step]`` µs of host time
(a sleep: no op) are inserted at the start of that rank's step, before its first op.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "golden"))
from kineto_doc import annotation, cpu_op, doc, write_doc  # noqa: E402

__all__ = ["BASE_NS", "TRANSFER_US", "STEP_US", "cpu_docs", "write_cpu_docs", "EXPECT"]

BASE_NS = 1_700_000_000_000_000_000
TRANSFER_US = 20
STEP_US = 2_000
MAIN, WORKER = 1, 50

#: per step and rank, without delays: µs of each category (top-level ops only, exclusive)
EXPECT = {"attention": 30, "dense_gemm": 50, "moe_routing": 40 + 20, "moe_gemm": 180, "other_compute": 10}


def _gloo(name: str, ts: float, dur: float) -> dict[str, Any]:
    return annotation(name, ts, dur, tid=WORKER)


def _issue(ts: float, rank: int, world: int, rpc: str | None) -> list[dict[str, Any]]:
    ev = [cpu_op("c10d::allreduce_", ts, 5)]
    if rpc:  # torch versions that record collective metadata: record_param_comms inside (gloo) or around the c10d op
        a, d = (ts + 1, 3) if rpc == "inner" else (ts - 1, 7)
        ev.append(cpu_op("record_param_comms", a, d, **{
            "Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": world,
            "dtype": "Float", "Process Group Name": "0", "Process Group Description": "default_pg",
            "Process Group Ranks": str(list(range(world)))}))
    return ev


def _rank_events(rank: int, n_steps: int, delays: dict[int, dict[int, float]], ends: dict[tuple[int, int], float],
                 arrivals: dict[tuple[int, int], dict[int, float]], world: int = 2, rpc: str | None = None) -> list[dict[str, Any]]:
    ev: list[dict[str, Any]] = []
    seq = 0
    for s in range(n_steps):
        t0 = s * STEP_US
        t = t0 + delays.get(rank, {}).get(s, 0.0)
        # attention: matmul (dense GEMM, with its nested aten::mm) + SDPA
        ev += [annotation("attn", t, 100, tid=MAIN), cpu_op("aten::matmul", t + 10, 50), cpu_op("aten::mm", t + 15, 40),
               cpu_op("aten::scaled_dot_product_attention", t + 65, 30), cpu_op("aten::_softmax", t + 70, 10)]
        # collective 1
        issue = t + 100
        ev += [annotation("allreduce", issue, 1, tid=MAIN), *_issue(issue, rank, world, rpc)]
        start = issue + 10
        arrivals.setdefault((s, 0), {})[rank] = start
        end = ends[(s, 0)]
        ev.append(_gloo("gloo:all_reduce", start, end - start))
        seq += 1
        # router (matmul + topk) and a top-level host readback
        r0 = end + 10
        ev += [annotation("router", r0, 60, tid=MAIN), cpu_op("aten::matmul", r0 + 5, 40), cpu_op("aten::mm", r0 + 6, 38),
               cpu_op("aten::topk", r0 + 45, 10), cpu_op("aten::linear", r0 + 56, 10)]
        ev += [cpu_op("aten::item", r0 + 80, 2), cpu_op("aten::_local_scalar_dense", r0 + 80.5, 1)]
        # experts: one grouped GEMM with nested per-expert mm and a nested readback
        e0 = r0 + 100
        ev += [annotation("moe.experts", e0, 200, tid=MAIN), cpu_op("aten::_grouped_mm", e0 + 10, 180),
               cpu_op("aten::mm", e0 + 20, 80), cpu_op("aten::item", e0 + 101, 1), cpu_op("aten::mm", e0 + 105, 80)]
        ev += [cpu_op("aten::add", e0 + 200, 10)]
        # collective 2
        issue2 = e0 + 220
        ev += _issue(issue2, rank, world, rpc)
        start2 = issue2 + 10
        arrivals.setdefault((s, 1), {})[rank] = start2
        ev.append(_gloo("gloo:all_reduce", start2, ends[(s, 1)] - start2))
        ev.append(annotation("tk.fwd[DECODE bs=4 tok=4]", t0, ends[(s, 1)] + 5 - t0, tid=MAIN))
    return ev


def cpu_docs(n_ranks: int = 2, n_steps: int = 3, delays: dict[int, dict[int, float]] | None = None,
             rpc: str | None = None) -> list[dict[str, Any]]:
    """One Kineto document per rank (gloo, CPU only); ``rpc``: add record_param_comms metadata
    ``"inner"`` (inside the c10d op, as gloo records it) or ``"outer"`` (around it)."""
    delays = delays or {}
    # collective ends = last arrival + TRANSFER_US; arrivals depend on previous ends: iterate to a fixed point
    ends: dict[tuple[int, int], float] = {(s, c): 0.0 for s in range(n_steps) for c in (0, 1)}
    for _ in range(4):
        arrivals: dict[tuple[int, int], dict[int, float]] = {}
        for r in range(n_ranks):
            _rank_events(r, n_steps, delays, ends, arrivals, n_ranks, rpc)
        ends = {k: max(v.values()) + TRANSFER_US for k, v in arrivals.items()}
    out = []
    for r in range(n_ranks):
        evs = _rank_events(r, n_steps, delays, ends, {}, n_ranks, rpc)
        d = doc(evs, rank=r, world_size=n_ranks, base_ns=BASE_NS)
        d["distributedInfo"]["backend"] = "gloo"
        out.append(d)
    return out


def write_cpu_docs(dirpath: Path, **kw: Any) -> list[Path]:
    dirpath.mkdir(parents=True, exist_ok=True)
    return [write_doc(dirpath / f"rank{r}.trace.json", d) for r, d in enumerate(cpu_docs(**kw))]
