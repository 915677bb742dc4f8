"""Table of GPU peaks (dense tensor FLOP/s, memory bandwidth, power, links).

Numbers are vendor datasheet peaks for **dense** math (no 2:4 sparsity), per GPU.
They are used as roofline ceilings and as fallbacks when the trace metadata lacks
a power limit or link bandwidth; the trace's own device properties win when
present. Lookup is by substring of the device name (``NVIDIA H200`` →
``H200``); the most specific (longest) key wins.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping
from tracekit.schema import TraceMeta

__all__ = ["GpuPeaks", "GPU_TABLE", "gpu_peaks", "pcie_link_bw_bytes_per_s", "rank_gpu_info", "peak_flops_per_s"]

_T = 1e12
_G = 1e9


@dataclass(frozen=True)
class GpuPeaks:
    """Peaks of one GPU model. FLOP/s are dense; bandwidths are bytes/s."""

    name: str
    bf16_flops: float  # dense BF16/FP16 tensor FLOP/s
    fp8_flops: float  # dense FP8 tensor FLOP/s (0 when unsupported)
    fp32_flops: float  # FP32 (non-tensor) FLOP/s; TF32 tensor is ~bf16/2
    hbm_bytes_per_s: float
    power_limit_w: float
    pcie_gen: int
    pcie_width: int = 16
    nvlink_bytes_per_s: float = 0.0  # per GPU, per direction; 0 = no NVLink (PCIe-only)

    @property
    def has_nvlink(self) -> bool:
        return self.nvlink_bytes_per_s > 0

    @property
    def pcie_bytes_per_s(self) -> float:
        return pcie_link_bw_bytes_per_s(self.pcie_gen, self.pcie_width) or 0.0


GPU_TABLE: dict[str, GpuPeaks] = {
    p.name: p
    for p in [
        GpuPeaks("B200", 2250 * _T, 4500 * _T, 80 * _T, 8000 * _G, 1000, 5, 16, 900 * _G),
        GpuPeaks("B300", 2250 * _T, 4500 * _T, 75 * _T, 8000 * _G, 1100, 6, 16, 900 * _G),
        GpuPeaks("H200", 989 * _T, 1979 * _T, 67 * _T, 4800 * _G, 700, 5, 16, 450 * _G),
        GpuPeaks("H100 SXM", 989 * _T, 1979 * _T, 67 * _T, 3350 * _G, 700, 5, 16, 450 * _G),
        GpuPeaks("H100 NVL", 835 * _T, 1671 * _T, 60 * _T, 3900 * _G, 400, 5, 16, 300 * _G),
        GpuPeaks("H100 PCIe", 756 * _T, 1513 * _T, 51 * _T, 2000 * _G, 350, 5, 16, 0.0),
        GpuPeaks("H100", 989 * _T, 1979 * _T, 67 * _T, 3350 * _G, 700, 5, 16, 450 * _G),
        GpuPeaks("H20", 148 * _T, 296 * _T, 44 * _T, 4000 * _G, 400, 5, 16, 450 * _G),
        GpuPeaks("H800", 989 * _T, 1979 * _T, 67 * _T, 3350 * _G, 700, 5, 16, 200 * _G),
        GpuPeaks("A100-SXM4-80GB", 312 * _T, 0.0, 19.5 * _T, 2039 * _G, 400, 4, 16, 300 * _G),
        GpuPeaks("A100-SXM4-40GB", 312 * _T, 0.0, 19.5 * _T, 1555 * _G, 400, 4, 16, 300 * _G),
        GpuPeaks("A100-PCIE", 312 * _T, 0.0, 19.5 * _T, 1935 * _G, 300, 4, 16, 0.0),
        GpuPeaks("A100", 312 * _T, 0.0, 19.5 * _T, 2039 * _G, 400, 4, 16, 300 * _G),
        GpuPeaks("A10G", 70 * _T, 0.0, 31.2 * _T, 600 * _G, 300, 4, 16, 0.0),
        GpuPeaks("L40S", 362 * _T, 733 * _T, 91.6 * _T, 864 * _G, 350, 4, 16, 0.0),
        GpuPeaks("L4", 121 * _T, 242 * _T, 30.3 * _T, 300 * _G, 72, 4, 16, 0.0),
        GpuPeaks("RTX PRO 6000", 503 * _T, 1007 * _T, 126 * _T, 1792 * _G, 600, 5, 16, 0.0),
        GpuPeaks("RTX 6000 Ada", 364 * _T, 728 * _T, 91 * _T, 960 * _G, 300, 4, 16, 0.0),
        GpuPeaks("RTX 5090", 419 * _T, 838 * _T, 105 * _T, 1792 * _G, 575, 5, 16, 0.0),
        GpuPeaks("RTX 4090", 330 * _T, 660 * _T, 82.6 * _T, 1008 * _G, 450, 4, 16, 0.0),
        GpuPeaks("V100", 125 * _T, 0.0, 15.7 * _T, 900 * _G, 300, 3, 16, 150 * _G),
        GpuPeaks("MI300X", 1307 * _T, 2615 * _T, 163 * _T, 5300 * _G, 750, 5, 16, 448 * _G),
        GpuPeaks("MI250", 362 * _T, 0.0, 47.9 * _T, 3277 * _G, 560, 4, 16, 400 * _G),
    ]
}


def gpu_peaks(device_name: str | None) -> GpuPeaks | None:
    """Peaks for a device name (case-insensitive substring match, longest key first)."""
    if not device_name:
        return None
    up = device_name.upper().replace("_", " ")
    for key in sorted(GPU_TABLE, key=len, reverse=True):
        if key.upper() in up or key.upper().replace("-", " ") in up:
            return GPU_TABLE[key]
    return None


_GEN_GTS = {1: (2.5, 0.8), 2: (5.0, 0.8), 3: (8.0, 128 / 130), 4: (16.0, 128 / 130), 5: (32.0, 128 / 130)}


def pcie_link_bw_bytes_per_s(gen: int | None, width: int | None = 16) -> float | None:
    """Per-direction PCIe capacity ``GT/s × lanes × encoding / 8`` (telemetry.md §5); None if unknown.

    Gen 6 (PAM4 + FLIT) is not assumed: returns None so callers use a measured value.
    """
    if gen is None or gen not in _GEN_GTS:
        return None
    gts, enc = _GEN_GTS[int(gen)]
    return gts * 1e9 * int(width or 16) * enc / 8


def rank_gpu_info(meta: TraceMeta | None, rank: int) -> dict[str, Any]:
    """Merge of the trace metadata for ``rank`` and the GPU table.

    Keys: ``device_name``, ``peaks`` (GpuPeaks|None), ``power_limit_w``,
    ``pcie_bw_bytes_per_s``, ``has_nvlink`` (None if unknown), and ``source`` of each
    (``meta`` or ``table``).
    """
    entry: Mapping[str, Any] = {}
    for r in (meta or {}).get("ranks", []) or []:
        if isinstance(r, Mapping) and r.get("rank") == rank:
            entry = r
            break
    name = entry.get("device_name")
    peaks = gpu_peaks(name)
    power = entry.get("power_limit_w")
    bw = entry.get("link_bw_bytes_per_s")
    if bw is None:
        bw = pcie_link_bw_bytes_per_s(entry.get("link_gen"), entry.get("link_width"))
    out: dict[str, Any] = {
        "device_name": name,
        "peaks": peaks,
        "power_limit_w": float(power) if power else (peaks.power_limit_w if peaks else None),
        "power_limit_source": "meta" if power else ("table" if peaks else None),
        "pcie_bw_bytes_per_s": float(bw) if bw else (peaks.pcie_bytes_per_s if peaks else None),
        "pcie_bw_source": "meta" if bw else ("table" if peaks else None),
        "has_nvlink": entry.get("nvlink") if entry.get("nvlink") is not None else (peaks.has_nvlink if peaks else None),
    }
    return out


def peak_flops_per_s(peaks: GpuPeaks, dtype: str | None) -> float:
    """Dense peak for an operand dtype name (``BFloat16``, ``c10::Half``, ``float``, ``Float8_e4m3fn`` ...)."""
    d = (dtype or "").lower()
    if "float8" in d or "fp8" in d or "e4m3" in d or "e5m2" in d:
        return peaks.fp8_flops or peaks.bf16_flops
    if d in ("float", "float32", "fp32", "c10::float") or d.endswith("float32"):
        return peaks.fp32_flops
    return peaks.bf16_flops
