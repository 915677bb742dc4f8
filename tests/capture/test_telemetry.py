"""Telemetry sampler on a fake NVML (no driver needed): power, clocks, PCIe counter wrap, GPM, no-driver path."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tracekit.capture.telemetry import FI_PCIE_RX, FI_PCIE_TX, FI_POWER_INSTANT, TelemetrySampler


class _Val(SimpleNamespace):
    pass


def _fv(fid: int, value: int, ts_us: int, vtype: int = 1) -> SimpleNamespace:
    v = _Val(dVal=float(value), uiVal=value, ulVal=value, ullVal=value, sllVal=value, siVal=value, usVal=value)
    return SimpleNamespace(fieldId=fid, nvmlReturn=0, valueType=vtype, value=v, timestamp=ts_us, latencyUsec=5)


class FakeNVML:
    """Scripted NVML: each tick returns the next PCIe counter readings (32-bit, wrapping)."""

    def __init__(self, tx: list[int], rx: list[int], ts_us: list[int], gpm: bool = False) -> None:
        self.tx, self.rx, self.ts_us, self.i = tx, rx, ts_us, 0
        self.gpm = gpm
        self.calls: list[str] = []
        self.NVML_GPM_METRICS_GET_VERSION = 1

    def nvmlInit(self) -> None:
        self.calls.append("init")

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return f"h{i}"

    def nvmlDeviceGetName(self, h: str) -> bytes:
        return b"Fake H200"

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: str) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: str) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h: str) -> int:
        return 5

    def nvmlDeviceGetPcieSpeed(self, h: str) -> int:
        return 32000

    def nvmlDeviceGetEnforcedPowerLimit(self, h: str) -> int:
        return 700_000

    def nvmlDeviceGetPcieThroughput(self, *a: object) -> int:  # must never be called
        raise AssertionError("GetPcieThroughput blocks 20 ms; the sampler must not call it")

    def nvmlDeviceGetFieldValues(self, h: str, fields: list[int]) -> list[SimpleNamespace]:
        i = self.i
        self.i += 1
        out = []
        for f in fields:
            if f == FI_POWER_INSTANT:
                out.append(_fv(f, 350_000 + 1000 * i, self.ts_us[i]))
            elif f == FI_PCIE_TX:
                out.append(_fv(f, self.tx[i], self.ts_us[i]))
            elif f == FI_PCIE_RX:
                out.append(_fv(f, self.rx[i], self.ts_us[i]))
        return out

    def nvmlDeviceGetClockInfo(self, h: str, which: int) -> int:
        return 1980

    def nvmlDeviceGetUtilizationRates(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(gpu=87, memory=10)

    def nvmlGpmQueryDeviceSupport(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=1 if self.gpm else 0)

    def nvmlGpmSampleAlloc(self) -> object:
        return object()

    def nvmlGpmSampleGet(self, h: str, s: object) -> object:
        return s

    def c_nvmlGpmMetricsGet_t(self) -> SimpleNamespace:
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)])

    def nvmlGpmMetricsGet(self, mg: SimpleNamespace) -> SimpleNamespace:
        vals = {2: 55.0, 5: 40.0, 20: 100.0, 21: 2000.0}
        for m in mg.metrics[: mg.numMetrics]:
            m.value = vals[m.metricId]
        return mg


class Clock:
    def __init__(self, start: int = 1_700_000_000_000_000_000, step: int = 50_000_000) -> None:
        self.t, self.step = start, step

    def __call__(self) -> int:
        self.t += self.step
        return self.t


def _rows(s: TelemetrySampler, name: str) -> list[tuple[int, float]]:
    return [(t, v) for t, n, v in zip(s.ts, s.names, s.values) if n == name]


def test_pcie_counters_unwrap_32bit():
    wrap = 1 << 32
    # tx: +1 GiB, then wraps (+3 GiB across the 2**32 boundary), then +0
    tx = [wrap - 1024, (wrap - 1024 + (1 << 30)) % wrap, (wrap - 1024 + (1 << 30) + 3 * (1 << 30)) % wrap, 3 * (1 << 30) - 1024 + (1 << 30) - wrap + wrap]
    tx[3] = tx[2]
    rx = [0, 500, 1500, 1500]
    ts = [1_000_000, 1_100_000, 1_200_000, 1_300_000]  # 100 ms apart (us)
    nv = FakeNVML(tx, rx, ts)
    s = TelemetrySampler(rank=3, device=0, nvml=nv, clock=Clock(), log=lambda m: None)
    assert s.open()
    for _ in range(4):
        s.tick()
    txr = [v for _t, v in _rows(s, "pcie_tx_bytes_per_s")]
    assert txr == pytest.approx([(1 << 30) / 0.1, 3 * (1 << 30) / 0.1, 0.0])
    rxr = _rows(s, "pcie_rx_bytes_per_s")
    assert [v for _t, v in rxr] == pytest.approx([5000.0, 10000.0, 0.0])
    assert rxr[0][0] == 1_100_000 * 1000  # on the field's own timestamp, in ns
    assert all(v >= 0 for v in txr)


def test_power_clock_util_latency_and_metadata():
    nv = FakeNVML([0] * 3, [0] * 3, [1, 2, 3])
    s = TelemetrySampler(rank=1, device=0, nvml=nv, clock=Clock(), log=lambda m: None)
    assert s.open()
    s.tick()
    s.tick()
    assert [v for _t, v in _rows(s, "power_w")] == [350.0, 351.0]
    assert [v for _t, v in _rows(s, "sm_clock_mhz")] == [1980.0, 1980.0]
    assert [v for _t, v in _rows(s, "gpu_util_pct")] == [87.0, 87.0]
    assert _rows(s, "power_limit_w")[0][1] == 700.0
    lat = _rows(s, "nvml_call_latency_us")
    assert len(lat) == 2 and all(v > 0 for _t, v in lat)
    assert s.info["link_gen"] == 5 and s.info["link_width"] == 16
    assert s.info["link_bw_bytes_per_s"] == pytest.approx(32000e6 * 16 * 128 / 130 / 8)
    rows = s.to_rows()
    assert set(rows["kind"]) == {"counter"} and set(rows["rank"]) == {1}
    assert len(rows["ts_ns"]) == len(rows["name"]) == len(rows["value"])


def test_gpm_rates_replace_byte_counters():
    nv = FakeNVML([0] * 10, [0] * 10, list(range(1, 11)), gpm=True)
    clock = Clock(step=100_000_000)  # 100 ms per clock read -> a GPM window every tick
    s = TelemetrySampler(rank=0, device=0, nvml=nv, clock=clock, gpm_period_s=0.2, log=lambda m: None)
    assert s.open() and s.info["gpm"] is True
    for _ in range(3):
        s.tick()
    assert [v for _t, v in _rows(s, "sm_active_pct")][0] == 55.0
    assert [v for _t, v in _rows(s, "tensor_active_pct")][0] == 40.0
    assert [v for _t, v in _rows(s, "pcie_rx_bytes_per_s")][0] == 2000.0 * (1 << 20)
    assert len(_rows(s, "pcie_tx_bytes_per_s")) == len(_rows(s, "sm_active_pct"))  # no byte-counter rows


def test_no_driver_says_once_and_goes_on():
    class NoDriver:
        def nvmlInit(self) -> None:
            raise RuntimeError("NVML Shared Library Not Found")

    said: list[str] = []
    s = TelemetrySampler(rank=2, device=0, nvml=NoDriver(), log=said.append)
    s.start()
    s.stop()
    assert len(said) == 1 and "no telemetry" in said[0]
    assert s.to_rows()["ts_ns"] == []


def test_thread_samples_and_stops():
    nv = FakeNVML([0] * 10_000, [0] * 10_000, list(range(1, 10_001)))
    s = TelemetrySampler(rank=0, device=0, nvml=nv, period_s=0.005, log=lambda m: None)
    s.start()
    import time

    time.sleep(0.1)
    s.stop()
    n = len(_rows(s, "power_w"))
    assert n >= 3
    time.sleep(0.03)
    assert len(_rows(s, "power_w")) == n  # stopped


class _ManyGPUs(FakeNVML):
    def __init__(self, n: int) -> None:
        super().__init__([0] * 100, [0] * 100, list(range(1, 101)))
        self.n = n

    def nvmlDeviceGetCount(self) -> int:
        return self.n

    def nvmlDeviceGetUUID(self, h: str) -> bytes:
        return f"GPU-{h[1:]}abc".encode()


def test_visible_gpus_follow_cuda_visible_devices():
    from tracekit.capture.telemetry import visible_gpus

    nv = _ManyGPUs(4)
    assert visible_gpus(nv, {}) == [0, 1, 2, 3]
    assert visible_gpus(nv, {"CUDA_VISIBLE_DEVICES": "2,0"}) == [2, 0]  # CUDA ordinal order
    assert visible_gpus(nv, {"CUDA_VISIBLE_DEVICES": "1,-1,3"}) == [1]  # CUDA stops at an invalid index
    assert visible_gpus(nv, {"CUDA_VISIBLE_DEVICES": "GPU-3"}) == [3]
    assert visible_gpus(nv, {"CUDA_VISIBLE_DEVICES": ""}) == []


def test_local_telemetry_opens_visible_gpus_or_says_why():
    from tracekit.capture.telemetry import LocalTelemetry

    lt = LocalTelemetry(nvml=_ManyGPUs(4), env={"CUDA_VISIBLE_DEVICES": "3,1"}, clock=Clock())
    assert lt.open()
    assert [(s.rank, s.device) for s in lt.samplers] == [(0, 3), (1, 1)]  # (CUDA ordinal, NVML index)
    for s in lt.samplers:
        s.tick()
    info = lt.info()
    assert info["available"] and [g["nvml_index"] for g in info["gpus"]] == [3, 1] and info["gpus"][0]["power_limit_w"] == 700.0

    class NoLib:
        def nvmlInit(self) -> None:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    lt = LocalTelemetry(nvml=NoLib())
    assert not lt.open() and "libnvidia-ml" in lt.reason and lt.info()["available"] is False
    lt = LocalTelemetry(nvml=_ManyGPUs(2), env={"CUDA_VISIBLE_DEVICES": ""})
    assert not lt.open() and lt.reason == "no GPU visible to the program"
