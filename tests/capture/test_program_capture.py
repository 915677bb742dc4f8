"""``tracekit capture -- PROGRAM`` end to end on CPU: bounded windows, Ctrl-C, time mode, torchrun, telemetry."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import polars as pl
import pytest

from tracekit.capture.external import run_external
from tracekit.capture.window import WindowSpec
from tracekit._errors import InputError
from tracekit.schema import read_metadata, read_trace

pytestmark = pytest.mark.timeout(300)

PROGS = Path(__file__).parent / "programs"
REPO = Path(__file__).resolve().parents[2]


def _env(tmp: Path) -> dict[str, str]:
    pp = os.environ.get("PYTHONPATH")
    return dict(os.environ, TMPDIR=str(tmp), PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([str(REPO)] + ([pp] if pp else [])))


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants (from /proc)."""
    kids: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                parts = f.read().rsplit(")", 1)[1].split()
            ppid, pages = int(parts[1]), int(parts[21])
        except (OSError, IndexError, ValueError):
            continue
        kids.setdefault(ppid, []).append(int(d))
        rss[int(d)] = pages * page
    total, todo = 0, [root]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(kids.get(p, []))
    return total


class PeakRSS(threading.Thread):
    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid, self.peak, self._halt = pid, 0, threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            self.peak = max(self.peak, _tree_rss(self.pid))
            self._halt.wait(0.05)

    def stop(self) -> int:
        self._halt.set()
        self.join()
        return self.peak


def test_30s_small_op_program_10s_capture_bounded(tmp_path: Path):
    """Acceptance: 30 s of small ops in forward#i ranges, --duration 10s: exit 0 < 90 s, tree RSS < 4 GB."""
    out = tmp_path / "prog.parquet"
    cmd = [sys.executable, "-m", "tracekit.cli", "capture", "--duration", "10s",
           "-o", str(out), "--", sys.executable, str(PROGS / "small_ops.py"), "--seconds", "30"]
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    mon = PeakRSS(p.pid)
    mon.start()
    text, _ = p.communicate(timeout=200)
    wall = time.monotonic() - t0
    peak = mon.stop()
    print(f"wall {wall:.1f} s, peak tree RSS {peak / 2**30:.2f} GiB\n{text[-1500:]}")
    assert p.returncode == 0, text[-3000:]
    assert wall < 90, f"took {wall:.1f} s"
    assert peak < 4 * 2**30, f"peak RSS {peak / 2**30:.2f} GiB"
    df, meta = read_trace(out)
    cap = meta["capture"]
    assert cap["target"] == "program" and cap["options"]["duration_s"] == 10.0
    wins = cap["windows"]
    assert len(wins) >= 2 and all(w["end_ns"] - w["start_ns"] <= 1.5e9 for w in wins)  # bounded windows
    # the capture ran ~10 s of wall time: stopped, not run to the program's end
    assert 9e9 <= wins[-1]["end_ns"] - wins[0]["start_ns"] + 12e9 and wins[-1]["start_ns"] - wins[0]["start_ns"] < 10e9
    steps = df.filter(pl.col("kind") == "step")
    prof = steps.filter(pl.col("profiled"))
    assert prof.height == cap["summary"]["steps_profiled"] == sum(w["steps"] for w in wins) > 100
    assert prof["name"].cast(pl.String).str.starts_with("forward#").all()
    # forward#i is a step label of the grammar: the profiled steps are the trace's own ranges, numbered
    # by the program's step count (the capture's duplicate records were dropped)
    assert prof["src"].cast(pl.String).unique().to_list() != ["tracekit.step"]
    ids = prof.sort("ts_ns")["step_id"].to_list()
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
    # every profiled step lies inside a profiler window and holds the traced ops
    lo, hi = cap["window_ns"]
    assert prof["ts_ns"].min() >= lo and (prof["ts_ns"] + prof["dur_ns"]).max() <= hi
    ops = df.filter(pl.col("kind") == "cpu_op")
    assert ops.height > 20 * prof.height  # 60 ops per step
    codes = {q["code"] for q in meta["quality"]}
    assert "capture_program_stopped" in codes and "telemetry_unavailable" in codes
    assert "capture complete; stopping the program" in text


@pytest.mark.parametrize("when", ["second_window", "export"])
def test_ctrl_c_keeps_completed_windows(tmp_path: Path, when: str):
    """Ctrl-C while window 1 records (acceptance), or while a window stops/exports (that export finishes first)."""
    out = tmp_path / "int.parquet"
    cmd = [sys.executable, "-m", "tracekit.cli", "capture", "--steps-from", "forward#",
           "--window", "0.5s" if when == "second_window" else "1s",
           "--after", "finish", "-o", str(out), "--", sys.executable, str(PROGS / "small_ops.py"), "--seconds", "120"]
    p = subprocess.Popen(cmd, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    t_end = time.monotonic() + 120
    # rank0.exporting exists while a window stops and exports (it names the window)
    pattern = "tracekit-ext-*/rank0.win0.trace.json" if when == "second_window" else "tracekit-ext-*/rank0.exporting"
    hit, k = None, None
    while time.monotonic() < t_end and p.poll() is None:
        hit = next(iter(tmp_path.glob(pattern)), None)
        if hit is not None and when == "export":
            try:
                k = int(hit.read_text())  # the window that is stopping/exporting
            except (OSError, ValueError):  # gone already, or being written
                hit = None
        if hit is not None:
            break
        time.sleep(0.01)
    assert hit is not None, f"{pattern} never appeared"
    if when == "second_window":
        time.sleep(0.3)  # window 1 is open now (it opens at the next step)
        p.send_signal(signal.SIGINT)  # to tracekit, which passes it on
    else:  # straight to the program (no forwarding delay) while the export runs
        state = json.loads((hit.parent / "rank0.state.json").read_text())
        os.kill(int(state["pid"]), signal.SIGINT)
    text, _ = p.communicate(timeout=150)
    # Ctrl-C to tracekit: interrupted (130) with what was collected kept; to the program only: tracekit completes (0)
    assert p.returncode == (130 if when == "second_window" else 0), text[-3000:]
    df, meta = read_trace(out)
    wins = meta["capture"]["windows"]
    assert wins[0]["window"] == 0 and wins[0]["cut_by"] is None and wins[0]["steps"] > 0  # kept whole
    if when == "second_window":
        assert [w["window"] for w in wins] == [0, 1]
        assert wins[1]["cut_by"] == "exit" and wins[1]["signals_held"] == 0  # closed and exported at exit
    else:
        assert k is not None
        w = wins[k]
        assert w["window"] == k and w["cut_by"] is None and w["steps"] > 0
        assert w["signals_held"] == 1  # Ctrl-C arrived during the export, was held, delivered after
        assert len(wins) <= k + 2 and all(x["signals_held"] == 0 for x in wins if x["window"] != k)
    codes = {q["code"] for q in meta["quality"]}
    steps = df.filter((pl.col("kind") == "step") & pl.col("profiled"))
    for w in wins:  # a window counts the steps that ran wholly inside it (not one the close cut: Ctrl-C mid-step)
        inside = (pl.col("ts_ns") >= w["start_ns"]) & (pl.col("ts_ns") + pl.col("dur_ns").fill_null(0) <= w["end_ns"])
        assert steps.filter(inside).height == w["steps"]
    if when == "second_window":
        assert "capture_interrupted" in codes and "Ctrl-C: stopping the program" in text
    else:
        assert "capture_program_failed" in codes  # the program itself ended by KeyboardInterrupt


class FakeNVML:
    """Endless fake NVML for the capturing process: 2 GPUs, power ramps, GPM on."""

    NVML_GPM_METRICS_GET_VERSION = 1

    def __init__(self) -> None:
        self.i = 0

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetName(self, h: int) -> bytes:
        return b"Fake H200"

    def nvmlDeviceGetEnforcedPowerLimit(self, h: int) -> int:
        return 700_000

    def nvmlDeviceGetFieldValues(self, h: int, fields: list[int]) -> list[SimpleNamespace]:
        self.i += 1
        v = SimpleNamespace(dVal=0.0, uiVal=300_000 + h * 100_000, ulVal=0, ullVal=0, sllVal=0, siVal=0, usVal=0)
        return [SimpleNamespace(fieldId=f, nvmlReturn=0, valueType=1, value=v, timestamp=self.i, latencyUsec=3) for f in fields]

    def nvmlDeviceGetClockInfo(self, h: int, which: int) -> int:
        return 1980

    def nvmlDeviceGetUtilizationRates(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(gpu=90, memory=20)

    def nvmlGpmQueryDeviceSupport(self, h: int) -> SimpleNamespace:
        return SimpleNamespace(isSupportedDevice=1)

    def nvmlGpmSampleAlloc(self) -> object:
        return object()

    def nvmlGpmSampleGet(self, h: int, s: object) -> object:
        return s

    def c_nvmlGpmMetricsGet_t(self) -> SimpleNamespace:
        return SimpleNamespace(version=0, numMetrics=0, sample1=None, sample2=None,
                               metrics=[SimpleNamespace(metricId=0, nvmlReturn=0, value=0.0) for _ in range(8)])

    def nvmlGpmMetricsGet(self, mg: SimpleNamespace) -> SimpleNamespace:
        for m in mg.metrics[: mg.numMetrics]:
            m.value = {2: 70.0, 5: 35.0, 20: 10.0, 21: 20.0}[m.metricId]
        return mg


def test_program_without_steps_time_windows_and_telemetry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """No step marks: windows follow time; per-window statistics; fake-NVML counters joined to rank 0."""
    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # the program sees NVML GPU 1 only
    out = tmp_path / "nosteps.parquet"
    spec = WindowSpec(delay_s=1.0, duration_s=3.0, window_s=0.5)
    res = run_external([sys.executable, str(PROGS / "no_steps.py"), "--seconds", "20"], out, spec=spec,
                       after="stop", nvml=FakeNVML(), say=lambda m: None)
    df, meta = read_trace(out)
    cap = meta["capture"]
    wins = cap["windows"]
    # the program outlives the capture (the first profiler start alone can take seconds on a busy machine)
    assert res.stopped and cap["summary"]["done_reason"] == "complete" and len(wins) >= 2
    t0 = min(w["start_ns"] for w in wins)
    lens = [(w["end_ns"] - w["start_ns"]) / 1e9 for w in wins]
    assert all(w["steps"] == 0 for w in wins)
    assert all(0.45 <= x <= 0.8 for x in lens[:-1]) and lens[-1] <= 0.8, lens  # the last one ends with --duration
    # the capture ends once --duration has passed: within the last window, or during its stop/export
    last = wins[-1]
    assert (last["end_ns"] - t0) / 1e9 <= 3.5 and (last["end_ns"] - t0) / 1e9 + last["stop_s"] + last["export_s"] >= 2.9
    assert cap["summary"]["steps_seen"] == 0 and df.filter(pl.col("kind") == "step").height == 0
    assert df.filter(pl.col("kind") == "cpu_op").height > 0
    # counters: only GPU 1 (the visible one), as rank 0, inside the capture window
    ctr = df.filter(pl.col("kind") == "counter")
    names = set(ctr["name"].cast(pl.String).unique().to_list())
    assert {"power_w", "power_limit_w", "sm_clock_mhz", "sm_active_pct", "tensor_active_pct",
            "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s"} <= names
    assert set(ctr["rank"].unique().to_list()) == {0} and set(ctr["device"].unique().to_list()) == {1}
    pw = ctr.filter(pl.col("name") == "power_w")["value"]
    assert pw.min() == pw.max() == 400.0  # GPU 1's fake power, not GPU 0's 300 W
    lo, hi = cap["window_ns"]
    assert ctr["ts_ns"].min() >= lo and ctr["ts_ns"].max() <= hi and lo == t0
    per = {(t["rank"], t["window"]): t for t in cap["window_telemetry"]}
    assert per[(0, 0)]["mean_power_w"] == 400.0 and per[(0, 0)]["mean_sm_active_pct"] == 70.0
    assert cap["telemetry"]["available"] and cap["telemetry"]["gpus"][0]["nvml_index"] == 1
    assert "telemetry_unavailable" not in {q["code"] for q in meta["quality"]}


@pytest.mark.slow
def test_torchrun_ranks_share_window_steps(tmp_path: Path):
    out = tmp_path / "ddp.parquet"
    cmd = [sys.executable, "-m", "tracekit.cli", "capture", "--steps", "30", "--window", "0.2s", "--delay", "2s",
           "--steps-from", "forward#", "--after", "finish", "-o", str(out), "--",
           sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(PROGS / "ddp_steps.py"), "--steps", "300"]
    env = dict(_env(tmp_path), GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1")  # the program's own sockets: loopback
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    df, meta = read_trace(out)
    wins = pl.DataFrame(meta["capture"]["windows"])
    assert sorted(wins["rank"].unique().to_list()) == [0, 1]
    # the same windows at the same steps on both ranks
    per = {r: [(w["window"], w["steps"]) for w in wins.filter(pl.col("rank") == r).to_dicts()] for r in (0, 1)}
    assert per[0] == per[1] and sum(s for _k, s in per[0]) == 30
    steps = df.filter((pl.col("kind") == "step") & pl.col("profiled"))
    ids = {r: sorted(steps.filter(pl.col("rank") == r)["step_id"].to_list()) for r in (0, 1)}
    assert ids[0] == ids[1] and len(ids[0]) == 30
    assert not {q["code"] for q in meta["quality"]} & {"capture_window_late", "capture_rank_missing"}


def test_program_ending_before_the_delay_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "late.parquet"
    res = run_external([sys.executable, str(PROGS / "no_steps.py"), "--seconds", "2"], out,
                       spec=WindowSpec(delay_s=60, steps=5), after="stop", say=lambda m: None)
    assert res.returncode == 0 and not res.stopped  # it ended by itself: nothing was sent to it
    meta = read_metadata(out)
    q = {x["code"]: x["message"] for x in meta["quality"]}
    assert "before --delay 60s" in q["capture_no_profiler_windows"]
    assert "marked no step" in q["capture_no_steps"]
    assert "capture_program_stopped" not in q and meta["capture"]["windows"] == []
    # nothing was collected: reading it says why in one line (the capture's own reason), never an empty report
    with pytest.raises(InputError, match=r"collected no rows \(.*before --delay 60s"):
        read_trace(out)


@pytest.mark.parametrize("on", [True, False])
def test_module_context_flag_adds_module_ranges(tmp_path, monkeypatch, on):
    """``capture --module-context`` (run_external(module_context=True)) puts tk.mod[...] ranges around the
    router, experts and attention modules of the program; without it the trace has none (it is opt-in)."""
    for k, v in _env(tmp_path).items():
        monkeypatch.setenv(k, v)
    out = tmp_path / "t.parquet"
    res = run_external([sys.executable, str(PROGS / "tiny_moe.py"), "--steps", "40"], out,
                       spec=WindowSpec(steps=10), after="finish", telemetry=False, module_context=on,
                       say=lambda m: None)
    assert res.returncode == 0
    df, meta = read_trace(out)
    names = df.filter(pl.col("name").cast(pl.String).str.starts_with("tk.mod["))["name"].cast(pl.String)
    roles = {n.split("[", 1)[1].split()[0] for n in names.unique().to_list()}
    assert meta["capture"]["options"]["module_context"] is on
    if on:
        assert {"router", "experts", "attention"} <= roles, roles
        assert names.len() >= 3 * 10  # every profiled step's three modules
    else:
        assert names.len() == 0
