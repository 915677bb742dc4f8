"""Interconnect verdict: is the collectives' transfer limited by the path the data takes?

For each collective group (``collectives.groups``), the measured bus bandwidth at the median message size is
compared with what each path allows *at that size*, with a latency + bandwidth model per path
``busbw(S) = S / (α + S / B)`` (S = bytes × the nccl-tests bus factor):

========== ============================================ =======
path       B (per direction)                            α
========== ============================================ =======
NVLink     the GPU table's NVLink bandwidth              8 µs
PCIe P2P   87 % of the PCIe link (payload; metadata)     10 µs
host mem.  half of that (two PCIe crossings + a copy)    15 µs
========== ============================================ =======

α = 8 µs is what the 2×H200 NVLink fixture measures for NCCL ``RING_LL`` at 467 KB (49.6 GB/s); the 87 % payload
share is the measured 55.0 of 63.0 GB/s on H200 Gen5 (docs/telemetry.md §5). The path is NVLink when the device has
NVLink (metadata ``nvlink`` / GPU table) and the measured bus bandwidth reaches ≥ 50 % of the NVLink model; otherwise
the slower path whose model is closest (log ratio) to the measurement. The saving of a faster path = transfer time
× (1 − measured / NVLink model); of allreduce fusion = (calls per step − 1) × α of the path, per step.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import polars as pl

from tracekit.analysis.findings import Finding
from tracekit.core.gpus import GpuPeaks, gpu_peaks, rank_gpu_info
from tracekit.analysis.registry import Analysis, FinishContext, Finished, register
from tracekit.schema import TraceMeta

__all__ = ["interconnect_verdict", "path_models", "ALPHA_NS"]

ALPHA_NS = {"NVLink": 8_000, "PCIe P2P": 10_000, "host memory": 15_000}
PCIE_PAYLOAD = 0.87
#: transfer share of the window below which the verdict is only stated when the path is slow
VISIBLE_SHARE = 0.01


def _busbw(size_bytes: float, b: float, alpha_ns: float) -> float:
    return size_bytes / (alpha_ns * 1e-9 + size_bytes / b)


def _device(meta: TraceMeta | None) -> tuple[float, float, str | None]:
    """(NVLink B, PCIe link B, device) of rank 0: the capture's metadata (topology/telemetry) first, then the GPU table."""
    ranks = [r for r in ((meta or {}).get("ranks") or []) if isinstance(r, Mapping)]
    r0 = ranks[0] if ranks else {}
    info: dict[str, Any] = (rank_gpu_info(meta, int(r0.get("rank", 0))) if r0
                            else {"peaks": gpu_peaks((meta or {}).get("device_name"))})
    p: GpuPeaks | None = info.get("peaks")
    nv = float(p.nvlink_bytes_per_s) if p else 0.0
    for key in ("nvlink_bytes_per_s", "nvlink_bw_bytes_per_s"):
        if r0.get(key) is not None:
            nv = float(r0[key])
    if info.get("has_nvlink") is False or r0.get("nvlink_active") is False:
        nv = 0.0
    link = float(info.get("pcie_bw_bytes_per_s") or 0.0)
    name = p.name if p else info.get("device_name")
    return nv, link, str(name) if name else None


def path_models(size_bytes: float, meta: TraceMeta | None) -> dict[str, float]:
    """Bus bandwidth (bytes/s) each available path allows at ``size_bytes`` (bus bytes)."""
    nv, link, _ = _device(meta)
    out: dict[str, float] = {}
    if nv > 0:
        out["NVLink"] = _busbw(size_bytes, nv, ALPHA_NS["NVLink"])
    if link > 0:
        out["PCIe P2P"] = _busbw(size_bytes, PCIE_PAYLOAD * link, ALPHA_NS["PCIe P2P"])
        out["host memory"] = _busbw(size_bytes, PCIE_PAYLOAD * link / 2, ALPHA_NS["host memory"])
    return out


def _gb(x: float) -> str:
    return f"{x / 1e9:.1f} GB/s"


def _kb(x: float) -> str:
    return f"{x / 1e3:.0f} KB" if x < 1e6 else f"{x / 1e6:.1f} MB"


def interconnect_verdict(groups: list[Mapping[str, Any]], meta: TraceMeta | None, *, window_ns: int,
                         steps: int, ranks: int) -> tuple[list[dict[str, Any]], list[tuple[str, float, str]]]:
    """Per collective group: measured vs modelled bus bandwidth, likely path, savings; and (subject, weight ns,
    sentence) findings. ``window_ns``: Σ over ranks of the analysed window; ``steps``: profiled steps in it."""
    rows: list[dict[str, Any]] = []
    found: list[tuple[str, float, str]] = []
    for g in groups:
        bw, size, tr = g.get("bus_bw_p50_bytes_per_s"), g.get("bytes_p50"), int(g.get("transfer_ns") or 0)
        if tr <= 0 or g.get("coll_name") not in ("allreduce", "allgather", "reduce_scatter", "alltoall", "broadcast"):
            continue
        subj = f"{g.get('coll_name')}:{g.get('pg')}"
        ws = g.get("wait_share")
        wait = f"{ws:.0%} of its kernel time is waiting for the last rank, " if ws is not None else ""
        if not bw or not size:  # no message sizes (e.g. nsys without NCCL payload): only the share bounds the saving
            share = tr / window_ns if window_ns else 0.0
            rows.append({"pg": g.get("pg"), "coll_name": g.get("coll_name"), "path": None, "transfer_ns": tr,
                         "transfer_share": share, "saving_ns_max": tr, "needs": "message sizes (record_param_comms / NCCL payload)"})
            if share < 0.05:
                found.append((subj, float(g.get("wait_ns") or tr), (
                    f"{g['coll_name']} ({g['pg']}): interconnect is not the limit — {wait}transfer is {share:.1%} of the window, "
                    "the most any faster path could save (bus bandwidth unknown: the trace has no message sizes).")))
            else:
                found.append((subj, float(tr), (
                    f"{g['coll_name']} ({g['pg']}): transfer is {share:.1%} of the window, but the trace has no message sizes, so "
                    "the path cannot be named: capture with the PyTorch profiler (record_param_comms) for bus bandwidth.")))
            continue
        count = max(int(g.get("count") or 1), 1)
        n = max(ranks, 2)
        factor = 2 * (n - 1) / n if g["coll_name"] == "allreduce" else (1.0 if g["coll_name"] == "broadcast" else (n - 1) / n)
        models = path_models(float(size) * factor, meta)  # the paths' bus bandwidth at the median message's bus bytes
        share = tr / window_ns if window_ns else 0.0
        if not models or share < 0.001:  # not a visible share of the window: nothing to say
            continue
        nv = models.get("NVLink")
        if nv and bw >= 0.5 * nv:
            path = "NVLink"
        else:
            slow = {k: v for k, v in models.items() if k != "NVLink"}
            path = min(slow, key=lambda k: abs(math.log(bw / slow[k]))) if slow else "unknown"
        best_name = "NVLink" if nv else "PCIe P2P"
        best = models.get(best_name, bw)
        frac = min(bw / best, 1.0) if best else 1.0
        save_ns = int(tr * (1 - frac)) if path != "NVLink" else 0
        calls_per_step = count / steps if steps else None
        alpha = ALPHA_NS.get(path, ALPHA_NS["PCIe P2P"])
        fusion_ns_per_step = int((calls_per_step - 1) * alpha) if calls_per_step and calls_per_step > 1 else 0
        row = {"pg": g.get("pg"), "coll_name": g.get("coll_name"), "bytes_p50": size, "bus_bw_p50_bytes_per_s": bw,
               "model_bus_bw_bytes_per_s": models, "path": path, "fraction_of_best": frac, "best_path": best_name,
               "transfer_ns": tr, "transfer_share": share, "saving_ns": save_ns, "calls_per_step": calls_per_step,
               "fusion_saving_ns_per_step": fusion_ns_per_step}
        rows.append(row)
        fuse = (f" Fusing its {calls_per_step:.0f} calls per step would save ~{fusion_ns_per_step / 1e3:.0f} µs per step."
                if fusion_ns_per_step >= 20_000 else "")
        if path == "NVLink":
            if share < VISIBLE_SHARE or frac >= 0.7:
                found.append((subj, float(g.get("wait_ns") or tr), (
                    f"{g['coll_name']} ({g['pg']}): interconnect is not the limit — {_kb(size)} messages move at {_gb(bw)} bus "
                    f"bandwidth, {frac:.0%} of what NVLink gives at that size ({_gb(best)}); {wait}transfer is "
                    f"{share:.1%} of the window.{fuse}")))
            continue
        per_step = f" (~{save_ns / max(ranks, 1) / steps / 1e6:.2f} ms per step)" if steps else ""
        if share < VISIBLE_SHARE / 4:
            continue
        found.append((subj, float(save_ns) + 1.0, (
            f"{g['coll_name']} ({g['pg']}): slow interconnect path — {_kb(size)} messages move at {_gb(bw)} bus bandwidth, "
            f"{frac:.0%} of what {best_name} gives at that size ({_gb(best)}): likely through {path}"
            f"{' (NVLink P2P disabled or unavailable, e.g. NCCL_P2P_DISABLE=1)' if nv and path == 'host memory' else ''}. "
            f"Transfer is {tr / 1e6:.1f} ms ({share:.1%} of the window); at {best_name} speed it would save {save_ns / 1e6:.1f} ms"
            f"{per_step}.{fuse}")))
    return rows, found


# --- the ``interconnect`` analysis (tracekit.analysis.registry): from the collective groups, steps and extents --------

def _finish(parts: list[Any], ctx: FinishContext) -> Finished:
    ext = ctx.results["extents"].value
    if ext.cpu:  # CPU mode: gloo over host memory on one host, no link to judge
        return Finished({"interconnect": []}, [])
    st = ctx.results["steps"].value.steps
    n_steps = int(st.filter(~pl.col("no_gpu"))["step_id"].n_unique()) if st.height else 0
    rows, found = interconnect_verdict(ctx.results["collectives"].sections["collectives"]["groups"], ctx.meta,
                                       window_ns=sum(ext.seen.values()), steps=n_steps,
                                       ranks=len(ext.wmap) or int(ctx.meta.get("world_size") or 2))
    return Finished({"interconnect": rows}, found)


ANALYSIS = register(Analysis(
    "interconnect", ("interconnect",), (), None, _finish,
    lambda ctx: [Finding("interconnect", t, w, subject=subj) for subj, w, t in ctx.result.value],
    needs=("extents", "collectives", "steps"), order=90, findings_first=True))
