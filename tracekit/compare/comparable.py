"""Whether two traces can be compared as "the same workload, changed": one small pure function.

:func:`comparability_notes` looks at the footer metadata of both runs and at the
kernel mix of their summaries, and returns warnings (``code, message``) when the
runs differ in device, source format or workload shape. Each message says what
the comparison still means. ``tracekit diff`` adds them to its quality notes; it
still prints the comparison (it may be exactly what the user wants: the same
model on two GPUs), but no longer as if one change explained the difference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import polars as pl

__all__ = ["comparability_notes", "KERNEL_OVERLAP_MIN"]

#: below this share of GPU kernel time spent in kernels both runs have, the workloads differ
KERNEL_OVERLAP_MIN = 0.5
#: capture options that define the workload's shape (a change of these is a different program)
_SHAPE_KEYS = ("layers", "hidden", "experts", "max_batch", "prompt_len", "world", "moe_impl")


def _per_rank(meta: Mapping[str, Any] | None, key: str) -> list[str]:
    ranks = (meta or {}).get("ranks") or []
    return sorted({str(r.get(key)) for r in ranks if isinstance(r, Mapping) and r.get(key)})


def _shape(meta: Mapping[str, Any] | None) -> dict[str, Any]:
    cap = (meta or {}).get("capture")
    opts = ((cap or {}).get("workload") or {}).get("options") if isinstance(cap, Mapping) else None
    return {k: opts[k] for k in _SHAPE_KEYS if isinstance(opts, Mapping) and k in opts}


def _overlap(kb: pl.DataFrame | None, ka: pl.DataFrame | None) -> float | None:
    """Share of both runs' kernel time spent in kernel names that both runs have (None without kernels)."""
    if kb is None or ka is None or kb.height == 0 or ka.height == 0 or "name" not in kb.columns or "name" not in ka.columns:
        return None
    common = set(kb["name"].cast(pl.String).to_list()) & set(ka["name"].cast(pl.String).to_list())
    tot = float(kb["total_ns"].sum() or 0) + float(ka["total_ns"].sum() or 0)
    if tot <= 0:
        return None
    both = sum(float(k.filter(pl.col("name").cast(pl.String).is_in(list(common)))["total_ns"].sum() or 0) for k in (kb, ka))
    return both / tot


def comparability_notes(
    before_meta: Mapping[str, Any] | None,
    after_meta: Mapping[str, Any] | None,
    *,
    before_kernels: pl.DataFrame | None = None,
    after_kernels: pl.DataFrame | None = None,
    labels: tuple[str, str] = ("before", "after"),
) -> list[tuple[str, str]]:
    """Warnings ``(code, message)`` when the two runs differ in device, source format or workload shape."""
    out: list[tuple[str, str]] = []
    lb, la = labels
    db, da = _per_rank(before_meta, "device_name"), _per_rank(after_meta, "device_name")
    if db and da and db != da:
        out.append(("diff_devices_differ", f"the runs used different devices ({lb}: {', '.join(db)}; {la}: {', '.join(da)}); "
                    "the figures compare the two machines as well as any change: they say how the runs differ, not what a "
                    "change did on one device"))
    fb, fa = _per_rank(before_meta, "format"), _per_rank(after_meta, "format")
    if fb and fa and fb != fa:
        out.append(("diff_formats_differ", f"the traces come from different sources ({lb}: {', '.join(fb)}; {la}: {', '.join(fa)}); "
                    "the tools record events differently (launch overhead, ranges, copies), so small differences in "
                    "category times may be the tools', not the runs'"))
    sb, sa = _shape(before_meta), _shape(after_meta)
    changed = {k: (sb[k], sa[k]) for k in sb.keys() & sa.keys() if sb[k] != sa[k]}
    ov = _overlap(before_kernels, after_kernels)
    if changed or (ov is not None and ov < KERNEL_OVERLAP_MIN):
        why = ", ".join(f"{k} {b} vs {a}" for k, (b, a) in sorted(changed.items()))
        share = f"only {ov:.0%} of the kernel time is in kernels both runs have" if ov is not None else ""
        out.append(("diff_workloads_differ", "the runs look like different workloads ("
                    + "; ".join(x for x in (why, share) if x)
                    + "); per-step and per-category figures compare two programs, not one program before and after a change"))
    return out
