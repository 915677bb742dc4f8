"""The one colour palette of every reporter (timeline, diff page, Perfetto categories).

Breakdown buckets keep the same colour everywhere; buckets outside the table take
:data:`EXTRA_COLORS` in order.
"""

from __future__ import annotations

__all__ = ["CATEGORY_COLORS", "EXTRA_COLORS", "FALLBACK_COLOR", "color_of"]

CATEGORY_COLORS: dict[str, str] = {
    "moe_gemm": "#1f77b4",
    "moe_routing": "#17becf",
    "attention": "#2ca02c",
    "communication": "#d62728",
    "comm_transfer": "#d62728",
    "comm_wait": "#ff9896",
    "dense_gemm": "#9467bd",
    "other_compute": "#8c8c8c",
    "memory": "#ff7f0e",
    "idle": "#d0d0d0",
}
EXTRA_COLORS = ("#bcbd22", "#e377c2", "#8c564b", "#393b79", "#637939")
FALLBACK_COLOR = "#9c755f"


def color_of(bucket: str, k: int | None = None) -> str:
    """Colour of ``bucket``; the ``k``-th extra colour (or the fallback) for an unknown one."""
    if bucket in CATEGORY_COLORS:
        return CATEGORY_COLORS[bucket]
    return EXTRA_COLORS[k % len(EXTRA_COLORS)] if k is not None else FALLBACK_COLOR
