"""GPU telemetry sampler: one thread per process, NVML through nvidia-ml-py.

Counters (``kind="counter"`` rows, CLOCK_REALTIME ns, the unit in the name):

=========================  ==========================================================
``power_w``                instantaneous board power, field NVML_FI_DEV_POWER_INSTANT
``power_limit_w``          enforced power limit (once at start, and in metadata)
``sm_clock_mhz``           SM clock
``gpu_util_pct``           NVML utilization (a kernel ran in the last sample period)
``pcie_tx_bytes_per_s``    from the 32-bit byte counter fields 197/198, unwrapped
``pcie_rx_bytes_per_s``    modulo 2**32 and divided by the field timestamps' delta
``sm_active_pct``          GPM SM utilization (Hopper+), per GPM window
``tensor_active_pct``      GPM any-tensor utilization (Hopper+)
``nvml_call_latency_us``   the sampler's own NVML time per tick (perturbation)
=========================  ==========================================================

``nvmlDeviceGetPcieThroughput`` (blocks ~20 ms) is never called. GPM PCIe rates
(MiB/s) are used for the PCIe rows when the device supports GPM, since they do
not wrap. Without a driver the sampler says "no telemetry" once and does nothing.

NVML, the handle factory and the clock are injected (design rule 10):
``nvml`` is any object with pynvml's function names; tests pass a fake.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from tracekit import _env

__all__ = ["TelemetrySampler", "link_info", "COUNTER_SRC", "FI_POWER_INSTANT", "FI_PCIE_TX", "FI_PCIE_RX"]

COUNTER_SRC = "tracekit.telemetry"
FI_POWER_INSTANT = 186
FI_PCIE_TX = 197
FI_PCIE_RX = 198
_WRAP = 1 << 32
_GPM_SM = 2
_GPM_TENSOR = 5
_GPM_PCIE_TX = 20
_GPM_PCIE_RX = 21
_MIB = 1 << 20


def _field_value(fv: Any) -> float | None:
    """Numeric value of a ``c_nvmlFieldValue_t`` (None when the field failed)."""
    if getattr(fv, "nvmlReturn", 0) != 0:
        return None
    v = fv.value
    return float(
        {0: v.dVal, 1: v.uiVal, 2: v.ulVal, 3: v.ullVal, 4: v.sllVal, 5: v.siVal, 6: getattr(v, "usVal", 0)}.get(
            int(fv.valueType), v.ullVal
        )
    )


def link_info(nvml: Any, handle: Any) -> dict[str, Any]:
    """PCIe link generation/width/bandwidth, power limit and name, for metadata ``ranks[i]``."""
    out: dict[str, Any] = {}

    def tryget(key: str, fn: Callable[[], Any]) -> None:
        try:
            out[key] = fn()
        except Exception:  # noqa: BLE001 - not supported on this board
            pass

    tryget("device_name", lambda: _s(nvml.nvmlDeviceGetName(handle)))
    tryget("link_gen", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)))
    tryget("link_width", lambda: int(nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)))
    tryget("link_gen_max", lambda: int(nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)))
    tryget("link_speed_mbps_per_lane", lambda: int(nvml.nvmlDeviceGetPcieSpeed(handle)))
    tryget("power_limit_w", lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0)
    if "link_speed_mbps_per_lane" in out and "link_width" in out:
        enc = 0.8 if out.get("link_gen", 3) <= 2 else 128 / 130
        out["link_bw_bytes_per_s"] = out["link_speed_mbps_per_lane"] * 1e6 * out["link_width"] * enc / 8
    return out


def _s(x: Any) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


@dataclass
class TelemetrySampler:
    """Sample one GPU every ``period_s`` (fast tier) and GPM every ``gpm_period_s``.

    Use :meth:`start` / :meth:`stop` (a daemon thread), or call :meth:`tick`
    directly (tests). :meth:`to_rows` gives the counter rows.
    """

    rank: int
    device: int
    nvml: Any = None  # pynvml-like module; None = import pynvml
    handle_factory: Callable[[int], Any] | None = None  # device ordinal -> NVML handle
    clock: Callable[[], int] = time.time_ns
    period_s: float = 0.05
    gpm_period_s: float = 0.2
    log: Callable[[str], None] = print
    ts: list[int] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    available: bool = False
    reason: str = ""

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._prev_pcie: dict[int, tuple[int, int]] = {}  # field -> (raw counter, timestamp us)
        self._gpm: list[Any] | None = None
        self._gpm_last_ns = 0
        self._handle: Any = None

    # -- setup -------------------------------------------------------------
    def open(self) -> bool:
        """Initialise NVML and the handle; False (said once) when there is no driver."""
        try:
            if self.nvml is None:
                import pynvml

                self.nvml = pynvml
            self.nvml.nvmlInit()
            factory = self.handle_factory or self.nvml.nvmlDeviceGetHandleByIndex
            self._handle = factory(self.device)
        except Exception as e:  # noqa: BLE001 - no driver, no library, no device
            self.reason = f"{type(e).__name__}: {e}"
            self.log(f"rank {self.rank}: no telemetry ({self.reason})")
            return False
        self.available = True
        self.info = link_info(self.nvml, self._handle)
        if "power_limit_w" in self.info:
            self._add(self.clock(), "power_limit_w", float(self.info["power_limit_w"]))
        self._gpm = self._gpm_setup()
        self.info["gpm"] = self._gpm is not None
        return True

    def _gpm_setup(self) -> list[Any] | None:
        n = self.nvml
        try:
            if not n.nvmlGpmQueryDeviceSupport(self._handle).isSupportedDevice:
                return None
            s = [n.nvmlGpmSampleAlloc(), n.nvmlGpmSampleAlloc()]
            n.nvmlGpmSampleGet(self._handle, s[0])
            self._gpm_last_ns = self.clock()
            return s
        except Exception:  # noqa: BLE001 - pre-Hopper, old driver, VM
            return None

    # -- sampling ----------------------------------------------------------
    def _add(self, ts: int, name: str, value: float) -> None:
        self.ts.append(ts)
        self.names.append(name)
        self.values.append(value)

    def tick(self) -> None:
        """One fast-tier sample (and a GPM window when due)."""
        n, h = self.nvml, self._handle
        t0 = self.clock()
        use_counters = self._gpm is None
        fields = [FI_POWER_INSTANT, FI_PCIE_TX, FI_PCIE_RX] if use_counters else [FI_POWER_INSTANT]
        try:
            fvs = n.nvmlDeviceGetFieldValues(h, fields)
        except Exception:  # noqa: BLE001
            fvs = []
        for fv in fvs:
            val = _field_value(fv)
            if val is None:
                continue
            fid = int(fv.fieldId)
            if fid == FI_POWER_INSTANT:
                self._add(t0, "power_w", val / 1000.0)
            elif fid in (FI_PCIE_TX, FI_PCIE_RX):
                self._pcie(fid, int(val), int(fv.timestamp))
        try:
            self._add(t0, "sm_clock_mhz", float(n.nvmlDeviceGetClockInfo(h, 1)))
        except Exception:  # noqa: BLE001
            pass
        try:
            self._add(t0, "gpu_util_pct", float(n.nvmlDeviceGetUtilizationRates(h).gpu))
        except Exception:  # noqa: BLE001
            pass
        if self._gpm is not None and t0 - self._gpm_last_ns >= self.gpm_period_s * 1e9:
            self._gpm_window(t0)
        self._add(t0, "nvml_call_latency_us", (self.clock() - t0) / 1e3)

    def _pcie(self, fid: int, raw: int, ts_us: int) -> None:
        prev = self._prev_pcie.get(fid)
        self._prev_pcie[fid] = (raw, ts_us)
        if prev is None or ts_us <= prev[1]:
            return
        delta = (raw - prev[0]) % _WRAP
        rate = delta / ((ts_us - prev[1]) / 1e6)
        name = "pcie_tx_bytes_per_s" if fid == FI_PCIE_TX else "pcie_rx_bytes_per_s"
        self._add(ts_us * 1000, name, rate)

    def _gpm_window(self, now: int) -> None:
        n, s = self.nvml, self._gpm
        assert s is not None
        try:
            n.nvmlGpmSampleGet(self._handle, s[1])
            mg = n.c_nvmlGpmMetricsGet_t()
            mg.version = n.NVML_GPM_METRICS_GET_VERSION
            ids = (_GPM_SM, _GPM_TENSOR, _GPM_PCIE_TX, _GPM_PCIE_RX)
            mg.numMetrics = len(ids)
            mg.sample1, mg.sample2 = s[0], s[1]
            for i, mid in enumerate(ids):
                mg.metrics[i].metricId = mid
            n.nvmlGpmMetricsGet(mg)
        except Exception:  # noqa: BLE001 - GPM went away: fall back to byte counters
            self._gpm = None
            return
        mid_ts = (self._gpm_last_ns + now) // 2
        for i, name, scale in (
            (0, "sm_active_pct", 1.0),
            (1, "tensor_active_pct", 1.0),
            (2, "pcie_tx_bytes_per_s", _MIB),
            (3, "pcie_rx_bytes_per_s", _MIB),
        ):
            m = mg.metrics[i]
            if int(getattr(m, "nvmlReturn", 0)) == 0:
                self._add(mid_ts, name, float(m.value) * scale)
        self._gpm = [s[1], s[0]]  # the newer sample starts the next window
        self._gpm_last_ns = now

    # -- thread --------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            t = time.perf_counter()
            self.tick()
            self._stop.wait(max(0.0, self.period_s - (time.perf_counter() - t)))

    def start(self) -> "TelemetrySampler":
        if self.available or self.open():
            self._thread = threading.Thread(target=self._run, name=f"tk-telemetry-{self.rank}", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2.0)
            self._thread = None

    def to_rows(self) -> dict[str, list[Any]]:
        """Columnar counter rows (picklable): ts_ns, name, value plus constant rank/device."""
        k = len(self.ts)
        return {
            "rank": [self.rank] * k,
            "kind": ["counter"] * k,
            "ts_ns": list(self.ts),
            "dur_ns": [0] * k,
            "device": [self.device] * k,
            "name": list(self.names),
            "value": list(self.values),
            "src": [COUNTER_SRC] * k,
        }


def visible_gpus(nvml: Any, env: dict[str, str] | None = None) -> list[int]:
    """NVML indices of the GPUs a program would see: ``CUDA_VISIBLE_DEVICES`` (integers) or all of them.

    CUDA numbers devices fastest-first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``; NVML by PCI bus.
    On machines of one GPU model the two orders agree. UUID entries are looked up by UUID.
    """
    cvd = env.get(_env.CUDA_VISIBLE_DEVICES) if env is not None else _env.get(_env.CUDA_VISIBLE_DEVICES)
    n = int(nvml.nvmlDeviceGetCount())
    if cvd is None or cvd.strip() == "":
        return list(range(n)) if cvd is None else []
    out: list[int] = []
    for tok in cvd.split(","):
        tok = tok.strip()
        if not tok:
            continue
        if tok.lstrip("-").isdigit():
            i = int(tok)
            if i < 0:
                break  # CUDA stops at the first invalid index
            if i < n:
                out.append(i)
            continue
        for i in range(n):  # GPU-UUID / MIG-UUID
            try:
                if _s(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetHandleByIndex(i))).startswith(tok):
                    out.append(i)
                    break
            except Exception:  # noqa: BLE001
                continue
    return out


@dataclass
class LocalTelemetry:
    """One :class:`TelemetrySampler` per local GPU a program can see, run by the capturing process.

    Used for ``tracekit capture -- PROGRAM`` (also torchrun: every local rank's GPU). Samplers are
    keyed by NVML index (``TelemetrySampler.rank`` holds the CUDA ordinal until the capture maps
    devices to ranks). ``available`` False with ``reason`` when there is no driver, no library or no
    visible GPU.
    """

    nvml: Any = None
    period_s: float = 0.05
    env: dict[str, str] | None = None
    clock: Callable[[], int] = time.time_ns
    samplers: list[TelemetrySampler] = field(default_factory=list)
    available: bool = False
    reason: str = ""

    def open(self) -> bool:
        try:
            if self.nvml is None:
                import pynvml

                self.nvml = pynvml
            self.nvml.nvmlInit()
            gpus = visible_gpus(self.nvml, self.env)
        except Exception as e:  # noqa: BLE001 - no driver or no library
            self.reason = f"NVML unavailable ({type(e).__name__}: {e})"
            return False
        if not gpus:
            self.reason = "no GPU visible to the program"
            return False
        said: list[str] = []
        for ordinal, idx in enumerate(gpus):
            s = TelemetrySampler(rank=ordinal, device=idx, nvml=self.nvml, clock=self.clock, period_s=self.period_s, log=said.append)
            if s.open():
                self.samplers.append(s)
        self.available = bool(self.samplers)
        if not self.available:
            self.reason = said[0] if said else "no GPU could be opened"
        return self.available

    def start(self) -> "LocalTelemetry":
        for s in self.samplers:
            s.start()
        return self

    def stop(self) -> None:
        for s in self.samplers:
            s.stop()

    def info(self) -> dict[str, Any]:
        """Metadata: availability, reason, and per GPU its NVML index, CUDA ordinal and link/power facts."""
        return {
            "available": self.available,
            "reason": self.reason or None,
            "gpus": [{"nvml_index": s.device, "cuda_ordinal": s.rank, **s.info} for s in self.samplers],
        }
