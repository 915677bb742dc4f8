"""Capture-window controller (pure): delay, duration, steps, windows of bounded length, time mode,
named start, several ranks on one board, interrupted captures, the file board."""

from __future__ import annotations

from pathlib import Path

import pytest

from tracekit.capture.window import FileBoard, MemoryBoard, WindowController, WindowSpec

S = 1_000_000_000


class Clock:
    """Manual clock (ns); ``stop_export`` advances it to model a slow export."""

    def __init__(self, t: int = 0) -> None:
        self.t = t

    def __call__(self) -> int:
        return self.t


class FakeProfiler:
    def __init__(self, clock: Clock, export_s: float = 0.0, fail_on: int | None = None) -> None:
        self.clock, self.export_s, self.fail_on = clock, export_s, fail_on
        self.active = False
        self.starts = 0
        self.exported: list[int] = []

    def start(self) -> None:
        assert not self.active, "two profilers at once"
        self.active = True
        self.starts += 1

    def stop_export(self, k: int) -> dict:
        assert self.active
        self.active = False
        self.clock.t += int(self.export_s * S)
        if k == self.fail_on:
            raise RuntimeError("disk full")
        self.exported.append(k)
        return {"export_s": self.export_s}


def _ctl(spec: WindowSpec, clock: Clock, prof: FakeProfiler, board=None, **kw) -> WindowController:
    return WindowController(spec, prof, board if board is not None else MemoryBoard(), clock, t0_ns=0, **kw)


def _run_steps(ctl: WindowController, clock: Clock, n: int, step_s: float) -> None:
    for _ in range(n):
        ctl.begin_step()
        clock.t += int(step_s * S)
        ctl.end_step()


def test_delay_then_windows_of_bounded_length_until_duration():
    clock, prof = Clock(), FakeProfiler(Clock())
    prof.clock = clock
    prof.export_s = 0.5
    done = []
    ctl = _ctl(WindowSpec(delay_s=2.0, duration_s=5.0, window_s=1.0), clock, prof, on_done=done.append)
    _run_steps(ctl, clock, 100, 0.1)  # 10 s of 100 ms steps (+ exports)
    assert ctl.done and done == [ctl] and ctl.done_reason == "complete"
    w = ctl.windows
    assert w[0]["start_ns"] >= 2 * S and w[0]["first_step"] == 20  # nothing before the delay
    # windows of window_s (whole steps), separated by the export; the last one ends with --duration
    assert [(x["end_ns"] - x["start_ns"]) / S for x in w] == pytest.approx([1.0, 1.0, 1.0, 0.5])
    assert all(b["start_ns"] == a["end_ns"] + 0.5 * S for a, b in zip(w, w[1:]))
    assert w[-1]["end_ns"] - w[0]["start_ns"] == 5 * S
    assert len(w) == 4 and prof.exported == [0, 1, 2, 3] and not prof.active
    assert ctl.profiled_steps == sum(x["steps"] for x in w) == 35
    n_before = prof.starts
    _run_steps(ctl, clock, 20, 0.1)
    assert prof.starts == n_before  # done: nothing more is recorded


def test_steps_limit_exact_across_windows():
    clock = Clock()
    prof = FakeProfiler(clock)
    ctl = _ctl(WindowSpec(steps=25, window_s=1.0), clock, prof)
    _run_steps(ctl, clock, 200, 0.1)
    assert ctl.done and ctl.profiled_steps == 25
    assert [x["steps"] for x in ctl.windows] == [10, 10, 5]
    assert [x["first_step"] for x in ctl.windows] == [0, 10, 20]


def test_time_mode_without_steps():
    clock = Clock()
    prof = FakeProfiler(clock, export_s=0.2)
    ctl = _ctl(WindowSpec(delay_s=1.0, duration_s=3.0, window_s=1.0), clock, prof)
    while not ctl.done and clock.t < 20 * S:
        assert ctl.wants_tick()
        ctl.tick()
        clock.t += S // 100
    assert ctl.done and len(ctl.windows) == 3
    assert ctl.windows[0]["start_ns"] == pytest.approx(1 * S, abs=S // 50)
    assert all(x["mode"] == "time" and x["steps"] == 0 for x in ctl.windows)
    assert not ctl.wants_tick()


def test_start_at_first_step_and_named_range():
    clock = Clock()
    prof = FakeProfiler(clock)
    ctl = _ctl(WindowSpec(start_at="step", delay_s=0.5, steps=3), clock, prof)
    for _ in range(50):
        ctl.tick()  # no steps yet: time does not open a step-started capture
        clock.t += S // 50
    assert prof.starts == 0
    _run_steps(ctl, clock, 10, 0.1)
    assert ctl.windows[0]["first_step"] == 0 and ctl.profiled_steps == 3

    clock2 = Clock()
    prof2 = FakeProfiler(clock2)
    ctl2 = _ctl(WindowSpec(start_at="decode", steps=2), clock2, prof2)
    _run_steps(ctl2, clock2, 5, 0.1)
    assert prof2.starts == 0  # steps alone do not start it
    ctl2.range_enter("prefill")
    assert prof2.starts == 0
    ctl2.range_enter("decode_loop")
    assert prof2.starts == 1 and ctl2.recording
    _run_steps(ctl2, clock2, 5, 0.1)
    assert ctl2.profiled_steps == 2 and ctl2.done


def test_two_ranks_open_and_close_at_the_same_steps():
    clock = Clock()
    board = MemoryBoard()
    p0, p1 = FakeProfiler(clock), FakeProfiler(clock)
    spec = WindowSpec(duration_s=3.0, window_s=1.0, lookahead=2)
    c0 = _ctl(spec, clock, p0, board=board, leader=True, world=2)
    c1 = _ctl(spec, clock, p1, board=board.reader(), leader=False, world=2)
    for _ in range(80):  # lockstep, the follower one call behind the leader
        c0.begin_step()
        c1.begin_step()
        clock.t += S // 10
        c0.end_step()
        c1.end_step()
    assert c0.done and c1.done
    key = [(w["first_step"], w["first_step"] + w["steps"]) for w in c0.windows]
    assert key == [(w["first_step"], w["first_step"] + w["steps"]) for w in c1.windows]
    assert len(key) >= 2 and all(w["late"] == 0 for w in c0.windows + c1.windows)
    assert key[0][0] == 2  # opened `lookahead` steps after the leader decided


def test_follower_past_the_step_applies_it_late():
    clock = Clock()
    board = MemoryBoard()
    spec = WindowSpec(steps=4, lookahead=1)
    c0 = _ctl(spec, clock, FakeProfiler(clock), board=board, leader=True, world=2)
    c1 = _ctl(spec, clock, FakeProfiler(clock), board=board.reader(), leader=False, world=2)
    _run_steps(c1, clock, 3, 0.1)  # the follower runs ahead by 3 steps
    _run_steps(c0, clock, 1, 0.1)  # the leader decides: open at step 1
    _run_steps(c1, clock, 1, 0.1)
    assert c1.recording and c1._open["late"] == 2


def test_finish_exports_the_open_window_and_keeps_the_earlier_ones():
    clock = Clock()
    prof = FakeProfiler(clock, fail_on=1)
    ctl = _ctl(WindowSpec(window_s=0.5), clock, prof)
    _run_steps(ctl, clock, 12, 0.1)  # window 0 done, window 1 fails on export, window 2 open
    assert ctl.recording
    ctl.finish("SIGINT")
    assert not prof.active  # the profiler it started is stopped
    assert [w["k"] for w in ctl.windows] == [0, 1, 2]
    assert ctl.windows[1].get("failed") and "disk full" in ctl.errors[0]
    assert ctl.windows[2]["cut_by"] == "SIGINT" and prof.exported == [0, 2]
    ctl.finish("exit")  # twice is fine
    assert ctl.done_reason == "SIGINT"


def test_profiler_start_failure_ends_the_capture():
    class NoProfiler(FakeProfiler):
        def start(self) -> None:
            raise RuntimeError("Profiler is already enabled")

    clock = Clock()
    ctl = _ctl(WindowSpec(), clock, NoProfiler(clock))
    _run_steps(ctl, clock, 3, 0.1)
    assert ctl.done and ctl.done_reason == "profiler_error" and "already enabled" in ctl.errors[0]


def test_file_board_reads_complete_lines_only(tmp_path: Path):
    path = tmp_path / "board.jsonl"
    a, b = FileBoard(path), FileBoard(path)
    assert b.poll() == []
    a.publish({"what": "open", "k": 0, "step": 5})
    with open(path, "ab") as f:
        f.write(b'{"what":"close","k":0,')  # a write in progress
    assert b.poll() == [{"what": "open", "k": 0, "step": 5}]
    with open(path, "ab") as f:
        f.write(b'"step":9}\n')
    assert b.poll() == [{"what": "close", "k": 0, "step": 9}]
    assert b.poll() == []


def test_time_window_that_sees_a_step_closes_at_a_step_end():
    clock = Clock()
    prof = FakeProfiler(clock)
    ctl = _ctl(WindowSpec(window_s=0.5, duration_s=2.0), clock, prof)
    ctl.tick()  # the program has marked no step yet: the window opens on time
    assert ctl.recording and ctl._open["mode"] == "time"
    clock.t += S // 10
    _run_steps(ctl, clock, 30, 0.1)
    for w in ctl.windows:
        assert w["mode"] == "step" and w["steps"] > 0
    # whole steps: every window ends on a step end, so the steps counted are all it holds
    assert ctl.profiled_steps == sum(w["steps"] for w in ctl.windows)
    assert ctl.windows[0]["first_step"] == 0


def test_two_ranks_steps_limit_same_windows_without_waiting_for_the_leader():
    clock = Clock()
    board = MemoryBoard()
    spec = WindowSpec(steps=16, window_s=0.25, lookahead=2)  # windows of 13 + 2 steps, then a last one of 1
    c0 = _ctl(spec, clock, FakeProfiler(clock), board=board, leader=True, world=2)
    c1 = _ctl(spec, clock, FakeProfiler(clock), board=board.reader(), leader=False, world=2)
    for _ in range(100):  # the follower runs one whole step ahead of the leader
        c1.begin_step()
        c1.end_step()
        c0.begin_step()
        clock.t += S // 50
        c0.end_step()
    k0 = [(w["first_step"], w["steps"]) for w in c0.windows]
    k1 = [(w["first_step"], w["steps"]) for w in c1.windows]
    assert [s for _f, s in k0] == [15, 1]
    assert k0 == k1 and c1.profiled_steps == 16  # the last window too: it closes by its step budget


def test_time_decided_close_applies_after_the_window_saw_a_step():
    clock = Clock()
    board = MemoryBoard()
    spec = WindowSpec(window_s=0.5, duration_s=1.0, lead_s=0.05)
    c0 = _ctl(spec, clock, FakeProfiler(clock), board=board, leader=True, world=2)
    c1 = _ctl(spec, clock, FakeProfiler(clock), board=board.reader(), leader=False, world=2)
    for _ in range(6):  # the program is still starting: windows open on time
        c0.tick()
        c1.tick()
        clock.t += S // 20
    assert c0.recording and c1.recording
    clock.t += S // 4  # window_s passed: the leader decides a close on time (50 ms ahead) ...
    c0.tick()
    c1.tick()
    for _ in range(40):  # ... but the first steps begin before that time comes
        for c in (c0, c1):
            c.begin_step()
        clock.t += S // 20
        for c in (c0, c1):
            c.end_step()
    for c in (c0, c1):
        assert c.windows and c.windows[0]["end_ns"] - c.windows[0]["start_ns"] < 0.6 * S
        assert c.done
