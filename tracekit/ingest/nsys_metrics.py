"""Nsight Systems ``GPU_METRICS`` → tracekit counter names (unit in the name).

nsys metric names carry the unit in brackets (``PCIe RX Throughput [Throughput %]``,
``GPC Clock Frequency [MHz]``); metric ids are not stable, so rows are matched on
``metricName``. :data:`METRIC_NAMES` maps the names seen on Hopper/Ampere GPUs
to short snake_case counter names ending in their unit; any other name goes
through :func:`counter_name` (snake_case of the name + a unit suffix), so no
metric is dropped.

Units: ``*_pct`` = percent of peak (0..100); ``*_mhz`` = MHz (nsys stores clock
samples in Hz although the name says MHz — :func:`value_scale` converts);
``*_avg`` / ``*_per_cycle`` are raw nsys averages.
"""

from __future__ import annotations

import re

__all__ = ["METRIC_NAMES", "counter_name", "value_scale"]

#: nsys metricName -> tracekit counter name. Keep in sync with docs (schemas/trace_v1.md "counter names").
METRIC_NAMES: dict[str, str] = {
    "GPC Clock Frequency [MHz]": "gpc_clock_mhz",
    "SYS Clock Frequency [MHz]": "sys_clock_mhz",
    "GR Active [Throughput %]": "gr_active_pct",
    "SMs Active [Throughput %]": "sm_active_pct",
    "SM Active [Throughput %]": "sm_active_pct",
    "SM Issue [Throughput %]": "sm_issue_pct",
    "Tensor Active [Throughput %]": "tensor_active_pct",
    "Tensor Active / FP16 Active [Throughput %]": "tensor_active_pct",
    "Compute Warps in Flight [Throughput %]": "compute_warps_in_flight_pct",
    "Compute Warps in Flight [Avg]": "compute_warps_in_flight_avg",
    "Compute Warps in Flight [Avg Warps per Cycle]": "compute_warps_in_flight_per_cycle",
    "Unallocated Warps in Active SMs [Throughput %]": "unallocated_warps_pct",
    "Unallocated Warps in Active SMs [Avg]": "unallocated_warps_avg",
    "Unallocated Warps in Active SMs [Avg Warps per Cycle]": "unallocated_warps_per_cycle",
    "DRAM Read Bandwidth [Throughput %]": "dram_read_pct",
    "DRAM Write Bandwidth [Throughput %]": "dram_write_pct",
    "PCIe RX Throughput [Throughput %]": "pcie_rx_pct",
    "PCIe TX Throughput [Throughput %]": "pcie_tx_pct",
    "PCIe Read Requests to BAR1 [Requests]": "pcie_bar1_read_requests",
    "PCIe Write Requests to BAR1 [Requests]": "pcie_bar1_write_requests",
    "NVLink RX Throughput [Throughput %]": "nvlink_rx_pct",
    "NVLink TX Throughput [Throughput %]": "nvlink_tx_pct",
    "NVLink RX Requests User Data [Throughput %]": "nvlink_rx_req_user_pct",
    "NVLink RX Requests Protocol Data [Throughput %]": "nvlink_rx_req_proto_pct",
    "NVLink RX Responses User Data [Throughput %]": "nvlink_rx_resp_user_pct",
    "NVLink RX Responses Protocol Data [Throughput %]": "nvlink_rx_resp_proto_pct",
    "NVLink TX Requests User Data [Throughput %]": "nvlink_tx_req_user_pct",
    "NVLink TX Requests Protocol Data [Throughput %]": "nvlink_tx_req_proto_pct",
    "NVLink TX Responses User Data [Throughput %]": "nvlink_tx_resp_user_pct",
    "NVLink TX Responses Protocol Data [Throughput %]": "nvlink_tx_resp_proto_pct",
    "Vertex/Tess/Geometry Warps in Flight [Throughput %]": "vtg_warps_in_flight_pct",
    "Vertex/Tess/Geometry Warps in Flight [Avg]": "vtg_warps_in_flight_avg",
    "Vertex/Tess/Geometry Warps in Flight [Avg Warps per Cycle]": "vtg_warps_in_flight_per_cycle",
    "Pixel Warps in Flight [Throughput %]": "pixel_warps_in_flight_pct",
    "Pixel Warps in Flight [Avg]": "pixel_warps_in_flight_avg",
    "Pixel Warps in Flight [Avg Warps per Cycle]": "pixel_warps_in_flight_per_cycle",
}

_UNITS = {
    "throughput %": "pct",
    "%": "pct",
    "mhz": "mhz",
    "avg": "avg",
    "avg warps per cycle": "per_cycle",
    "requests": "requests",
    "bytes": "bytes",
    "bytes/s": "bytes_per_s",
    "w": "w",
}


def counter_name(metric_name: str) -> str:
    """tracekit counter name of an nsys ``metricName`` (table first, generic rule otherwise)."""
    known = METRIC_NAMES.get(metric_name)
    if known:
        return known
    m = re.match(r"^(.*?)\s*\[(.+)\]\s*$", metric_name)
    base, unit = (m.group(1), m.group(2)) if m else (metric_name, "")
    snake = re.sub(r"[^0-9a-z]+", "_", base.lower()).strip("_") or "metric"
    suffix = _UNITS.get(unit.strip().lower(), re.sub(r"[^0-9a-z]+", "_", unit.lower()).strip("_"))
    return f"{snake}_{suffix}" if suffix else snake


def value_scale(counter: str, max_raw: float) -> float:
    """Factor applied to raw values: clock samples stored in Hz become MHz."""
    if counter.endswith("_mhz") and max_raw > 1e5:
        return 1e-6
    return 1.0
