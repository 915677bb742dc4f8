"""Collective transfer-time model: ``t = latency + bytes · f(n) / busBW`` (nccl-tests convention).

``f(n)`` is the bus-bandwidth factor of the collective: 2(n−1)/n for allreduce,
(n−1)/n for reduce-scatter / all-to-all, (n−1) × input for allgather (whose
input is one rank's share), 1 for broadcast / reduce / send / recv.

Presets are order-of-magnitude defaults (achievable NCCL bus bandwidth and
small-message latency); fit ``bw``/``lat`` on the target fabric at the message
sizes of the workload for predictions that matter (replay_model.md §3).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from tracekit._errors import UsageError

__all__ = ["Fabric", "PRESETS", "parse_fabric", "bus_factor"]


@dataclass(frozen=True)
class Fabric:
    """Bus bandwidth in bytes/s and per-call latency in ns."""

    bus_bw_bytes_per_s: float
    latency_ns: float
    name: str = ""

    def transfer_ns(self, nbytes: float, coll_name: str | None, n_ranks: int) -> float:
        return self.latency_ns + nbytes * bus_factor(coll_name, n_ranks) / self.bus_bw_bytes_per_s * 1e9


#: name → Fabric. NVLink 4 (H100/H200 SXM, 900 GB/s aggregate): NCCL allreduce busBW ~360 GB/s;
#: PCIe Gen4/Gen5 x16 (32/64 GB/s per direction raw): ~20/40 GB/s busBW through host bridges.
PRESETS: dict[str, Fabric] = {
    "nvlink-h100": Fabric(360e9, 8_000, "nvlink-h100"),
    "nvlink-h200": Fabric(360e9, 8_000, "nvlink-h200"),
    "pcie-gen4-x16": Fabric(20e9, 15_000, "pcie-gen4-x16"),
    "pcie-gen5-x16": Fabric(40e9, 12_000, "pcie-gen5-x16"),
}

_BW_UNITS = {"b/s": 1.0, "kb/s": 1e3, "mb/s": 1e6, "gb/s": 1e9, "tb/s": 1e12, "kib/s": 1024.0, "mib/s": 1024.0**2,
             "gib/s": 1024.0**3, "gbps": 1e9 / 8}
_T_UNITS = {"ns": 1.0, "us": 1e3, "µs": 1e3, "ms": 1e6, "s": 1e9}


def bus_factor(coll_name: str | None, n: int) -> float:
    c = (coll_name or "allreduce").lower().replace("_", "").replace("-", "")
    n = max(int(n), 1)
    if n == 1:
        return 0.0
    if "allreduce" in c:
        return 2.0 * (n - 1) / n
    if "allgather" in c:
        return float(n - 1)
    if "reducescatter" in c or "alltoall" in c:
        return (n - 1) / n
    return 1.0


def _num_unit(text: str, units: dict[str, float], what: str, spec: str) -> float:
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?\d+)?)\s*([a-zA-Zµ/]*)\s*", text)
    if not m:
        raise UsageError(f"what-if {spec!r}: cannot read {what} {text!r}; e.g. bw:400GB/s,lat:5us")
    u = m.group(2).lower() or ("gb/s" if what == "bandwidth" else "us")
    if u not in units:
        raise UsageError(f"what-if {spec!r}: unknown {what} unit {m.group(2)!r}; use one of {', '.join(units)}")
    v = float(m.group(1)) * units[u]
    if not math.isfinite(v):
        raise UsageError(f"what-if {spec!r}: {what} {text!r} is not a finite number")
    return v


def parse_fabric(text: str, spec: str = "") -> Fabric:
    """``bw:400GB/s,lat:5us`` or a preset name (optionally ``preset,lat:3us`` to override a field)."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    bw: float | None = None
    lat: float | None = None
    name = ""
    for p in parts:
        if p.lower() in PRESETS:
            f = PRESETS[p.lower()]
            bw, lat, name = bw or f.bus_bw_bytes_per_s, lat if lat is not None else f.latency_ns, f.name
        elif p.lower().startswith(("bw:", "bw=")):
            bw = _num_unit(p[3:], _BW_UNITS, "bandwidth", spec)
        elif p.lower().startswith(("lat:", "lat=")):
            lat = _num_unit(p[4:], _T_UNITS, "latency", spec)
        else:
            raise UsageError(f"what-if {spec!r}: unknown fabric field {p!r}; use bw:<GB/s>,lat:<us> or a preset "
                             f"({', '.join(PRESETS)})")
    if not bw or bw <= 0:
        raise UsageError(f"what-if {spec!r}: fabric needs a positive bandwidth (bw:400GB/s) or a preset")
    if not 1e6 <= bw <= 1e15 or lat is not None and not 0 <= lat <= 1e9:  # 1 MB/s..1 PB/s, 0..1 s: int64 ns hold them
        raise UsageError(f"what-if {spec!r}: bandwidth must be in 0.001GB/s..1000000GB/s and latency in 0..1s")
    return Fabric(bw, lat if lat is not None else 0.0, name or f"bw:{bw / 1e9:g}GB/s,lat:{(lat or 0) / 1e3:g}us")
