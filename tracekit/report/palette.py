"""The one colour palette of every reporter (timeline, diff page, Perfetto categories).

Breakdown buckets keep the same colour everywhere; buckets outside the table take
:data:`EXTRA_COLORS` in order.
"""

from __future__ import annotations

__all__ = ["CATEGORY_COLORS", "EXTRA_COLORS", "FALLBACK_COLOR", "color_of", "contrast_ratio", "text_color_on"]

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


def _luminance(hex_color: str) -> float:
    """WCAG 2 relative luminance of ``#rrggbb``."""
    h = hex_color.lstrip("#")
    chans = [int(h[i:i + 2], 16) / 255 for i in (0, 2, 4)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in chans]
    return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]


def contrast_ratio(a: str, b: str) -> float:
    """WCAG 2 contrast ratio of two ``#rrggbb`` colours (1 .. 21; AA asks 4.5 for small text)."""
    la, lb = sorted((_luminance(a), _luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def text_color_on(bg: str) -> str:
    """Black or white, whichever reads better on ``bg`` (one of them always reaches 4.58:1)."""
    return "#000000" if contrast_ratio("#000000", bg) >= contrast_ratio("#ffffff", bg) else "#ffffff"
