"""Profiler window schedule/controller (fake profiler), forward instrumentation, step summaries."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tracekit.capture.assemble import frames_from_extras, summarize_steps
from tracekit.capture.instrument import StepRecorder, fwd_label, instrument_forward, instrument_module
from tracekit.capture.profiler import ProfilerWindows, WindowSchedule, window_file


def test_schedule_windows():
    s = WindowSchedule(first=10, steps=3, every=20, max_windows=2)
    prof = [i for i in range(100) if s.window_of(i) is not None]
    assert prof == [10, 11, 12, 30, 31, 32]
    assert [i for i in range(100) if s.starts_at(i)] == [10, 30]
    assert [i for i in range(100) if s.ends_after(i)] == [12, 32]
    assert WindowSchedule(first=0, steps=0).window_of(5) is None


class FakeProf:
    def __init__(self, log: list[str]) -> None:
        self.log = log

    def start(self) -> None:
        self.log.append("start")

    def stop(self) -> None:
        self.log.append("stop")

    def export_chrome_trace(self, path: str) -> None:
        self.log.append("export")
        Path(path).write_text("{}")


def test_windows_barrier_before_start_and_files(tmp_path: Path):
    log: list[str] = []
    w = ProfilerWindows(
        WindowSchedule(first=2, steps=2, every=5, max_windows=0), tmp_path, 3, lambda: FakeProf(log),
        barrier=lambda: log.append("barrier"), sync=lambda: log.append("sync"),
    )
    rec: list[bool] = []
    for step in range(10):
        w.before_step(step)
        rec.append(w.recording)
        w.after_step(step)
    assert rec == [False, False, True, True, False, False, False, True, True, False]
    assert log[:3] == ["sync", "barrier", "start"]  # ranks aligned before the profiler starts
    assert log.count("start") == 2 and log.count("export") == 2
    assert [p.name for p in w.files] == ["rank3.win0.trace.json.gz", "rank3.win1.trace.json.gz"]
    assert all(p.exists() for p in w.files) and not list(tmp_path.glob(".*part*"))
    assert len(w.windows) == 2 and all(a <= b for a, b in w.windows)
    assert window_file(tmp_path, 0, 4).name == "rank0.win4.trace.json.gz"


def test_close_mid_window_keeps_it(tmp_path: Path):
    log: list[str] = []
    w = ProfilerWindows(WindowSchedule(first=0, steps=5, every=10), tmp_path, 0, lambda: FakeProf(log))
    w.before_step(0)
    assert w.recording
    assert w.close() is not None and w.close() is None  # idempotent
    assert log == ["start", "stop", "export"] and len(w.files) == 1


def test_window_spans_only_the_recorded_time(tmp_path: Path):
    # the window starts when start() has returned and ends before stop(): a slow stop (kineto's processing)
    # is not part of what was recorded
    log: list[str] = []
    ticks = iter(range(100))

    def clock() -> int:
        log.append("clock")
        return next(ticks)

    w = ProfilerWindows(WindowSchedule(first=0, steps=2, every=10), tmp_path, 0, lambda: FakeProf(log),
                        sync=lambda: log.append("sync"), clock=clock)
    for step in range(3):
        w.before_step(step)
        w.after_step(step)
    assert log == ["sync", "start", "clock", "sync", "clock", "stop", "export"]
    assert w.windows == [[0, 1]]


def _label(a, k):  # noqa: ANN001, ANN202
    return a[1], a[2], int(a[0].numel())


def test_instrument_records_every_call_and_profiler_range():
    rec = StepRecorder(rank=5)
    flag = {"on": False}
    rec.profiled = lambda: flag["on"]
    f = instrument_forward(lambda t, m, n: t.sum(), rec, _label)
    x = torch.ones(6)
    f(x, "DECODE", 6)
    flag["on"] = True
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as p:
        f(torch.ones(96), "EXTEND", 3)
    flag["on"] = False
    with pytest.raises(ZeroDivisionError):
        instrument_forward(lambda t, m, n: 1 / 0, rec, _label)(x, "DECODE", 6)
    r = rec.records
    assert [(s.step_id, s.mode, s.batch_size, s.tokens, s.profiled) for s in r] == [
        (0, "DECODE", 6, 6, False), (1, "EXTEND", 3, 96, True), (2, "DECODE", 6, 6, False)]
    assert all(s.end_ns >= s.start_ns > 1_600_000_000 * 10**9 for s in r)  # CLOCK_REALTIME ns
    names = [e.name for e in p.events()]
    assert "tk.fwd[EXTEND bs=3 tok=96]" in names and fwd_label("EXTEND", 3, 96) in names
    rows = rec.to_rows()
    assert rows[1]["kind"] == "step" and rows[1]["src"] == "tracekit.step" and rows[1]["profiled"] is True
    df = rec.frame()
    assert df.height == 3 and df["rank"].to_list() == [5, 5, 5]


def test_instrument_module_wraps_forward():
    class M(torch.nn.Module):
        def forward(self, t, mode, n):  # noqa: ANN001, ANN201
            return t * 2

    rec = StepRecorder()
    m = instrument_module(M(), rec, _label)
    assert m(torch.ones(4), "DECODE", 4).sum().item() == 8.0
    assert len(rec) == 1


def _step(ts: int, dur: int, mode: str, tok: int, prof: bool) -> dict:
    return {"rank": 0, "kind": "step", "ts_ns": ts, "dur_ns": dur, "step_mode": mode, "tokens": tok, "profiled": prof,
            "batch_size": tok, "name": fwd_label(mode, tok, tok), "src": "tracekit.step", "step_id": 0}


def test_summarize_steps_known_answers():
    steps = [_step(i * 10_000_000, 5_000_000 + (i % 2) * 2_000_000, "DECODE", 8, False) for i in range(80)]
    steps.append(_step(800_000_000, 10_000_000, "EXTEND", 64, False))
    steps += [_step(900_000_000 + i * 20_000_000, 12_000_000, "DECODE", 8, True) for i in range(5)]
    s = summarize_steps(steps)
    assert s["steps"] == 86 and s["profiled_steps"] == 5
    assert s["blocks_median_ns"] == [6_000_000.0, 6_000_000.0]  # two blocks of 40 (5 and 7 ms alternating)
    assert s["decode_median_ns"] == {"unprofiled": 6_000_000.0, "profiled": 12_000_000.0}
    assert s["profiler_overhead_pct"] == pytest.approx(100.0)
    assert s["unprofiled_median_ns"]["EXTEND"] == 10_000_000.0
    tok = 80 * 8 + 64 + 5 * 8
    span_s = (900_000_000 + 4 * 20_000_000 + 12_000_000) / 1e9
    assert s["tokens_per_s"] == pytest.approx(tok / span_s)
    assert s["unprofiled_tokens_per_s"] == pytest.approx((80 * 8 + 64) / ((40 * 5e6 + 40 * 7e6 + 10e6) / 1e9))


def test_frames_from_extras_markers_and_counters():
    extras = {
        0: {"steps": [_step(100, 50, "DECODE", 4, False)], "markers": [{"step_id": 4, "ts_ns": 120, "delay_ns": 5_000_000}],
            "counters": {"rank": [0, 0], "kind": ["counter"] * 2, "ts_ns": [1, 2], "dur_ns": [0, 0], "device": [0, 0],
                         "name": ["power_w", "power_w"], "value": [300.0, 310.0], "src": ["tracekit.telemetry"] * 2}},
        1: {"steps": [], "markers": [], "counters": {}},
    }
    frames = frames_from_extras(extras)
    kinds = sorted(k for f in frames for k in f["kind"].cast(str).to_list())
    assert kinds == ["counter", "counter", "instant", "step"]
    inst = [f for f in frames if "instant" in f["kind"].cast(str).to_list()][0]
    assert inst["name"].cast(str).to_list() == ["tk.fault.delay"] and inst["value"].to_list() == [5.0]
    assert inst["step_id"].to_list() == [4] and inst["src"].cast(str).to_list() == ["tracekit.ground_truth"]
