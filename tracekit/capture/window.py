"""Capture-window logic for ``tracekit capture -- PROGRAM`` (pure: no torch, no signals, no threads).

Semantics follow ``nsys profile --delay/--duration``:

* the capture opens ``delay_s`` after the program started, at the first step
  after that (``start_at="step"``), or at the first record_function range whose
  name starts with ``start_at`` (after the delay);
* it lasts ``duration_s`` of wall time (None: until the program ends) or
  ``steps`` profiled steps, whichever comes first;
* it is recorded as consecutive profiler windows of at most ``window_s`` each
  (a window's stop and export happen between two windows), so the profiler's
  memory is bounded by one window, not by the capture.

When the program marks steps, windows open at a step's start and close at a
step's end, so steps are whole. Without steps, windows open and close on time
(:meth:`WindowController.tick`, driven by the program hook's ticker).

Several processes (torchrun ranks): rank 0 (the leader) decides every boundary
and publishes it on a :class:`Board` (an append-only file in the capture
directory, no socket); every rank, the leader included, applies the published
boundaries, so all open and close window ``k`` at the same step (``lookahead``
steps after the leader decided, so followers a step behind still make it; a
rank already past the step applies it at once and counts it as ``late``) or
at the same wall-clock time.

The controller only calls its injected ``backend`` (``start()``,
``stop_export(k) -> dict``), ``board`` and ``clock``; tests drive it with fakes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

__all__ = ["Backend", "Board", "FileBoard", "MemoryBoard", "WindowController", "WindowSpec", "union_windows"]


def union_windows(per_rank: Iterable[Mapping[int, tuple[int, int]]]) -> list[list[int]]:
    """The capture's profiler windows from every rank's own: window ``k`` spans from the first rank's start to the
    last rank's stop. Ranks open and close a window at the same step, not the same instant (rank 0 decides; the
    others hear of it a little later), so one rank's windows alone leave the others' first and last operators out
    of every analysis. ``per_rank``: per rank, window index -> (start_ns, end_ns) of the windows it completed."""
    spans: dict[int, list[int]] = {}
    for wins in per_rank:
        for k, (a, b) in wins.items():
            cur = spans.get(k)
            spans[k] = [int(a), int(b)] if cur is None else [min(cur[0], int(a)), max(cur[1], int(b))]
    return [spans[k] for k in sorted(spans)]


@dataclass(frozen=True)
class WindowSpec:
    """What to record; see the module docstring. Times in seconds."""

    delay_s: float = 0.0
    start_at: str | None = None  # None | "step" | a range-name prefix
    duration_s: float | None = None
    steps: int | None = None
    window_s: float = 1.0
    gap_s: float = 0.0
    max_windows: int = 0  # 0: no limit
    lookahead: int = 2  # steps between the leader's decision and the boundary (multi-rank only)
    lead_s: float = 0.05  # the same for time boundaries (multi-rank only)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> WindowSpec:
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


class Backend(Protocol):
    def start(self) -> None: ...

    def stop_export(self, k: int) -> dict[str, Any]: ...


class Board(Protocol):
    def publish(self, item: dict[str, Any]) -> None: ...

    def poll(self) -> list[dict[str, Any]]: ...


class MemoryBoard:
    """In-process board (one process, or tests sharing one object between controllers)."""

    def __init__(self) -> None:
        self.items: list[dict[str, Any]] = []
        self._seen: dict[int, int] = {}

    def publish(self, item: dict[str, Any]) -> None:
        self.items.append(dict(item))

    def reader(self) -> MemoryBoard:
        r = MemoryBoard()
        r.items = self.items  # shared list, own read position
        return r

    def poll(self) -> list[dict[str, Any]]:
        i = self._seen.get(0, 0)
        self._seen[0] = len(self.items)
        return self.items[i:]


class FileBoard:
    """Append-only JSON-lines file; :meth:`poll` costs one ``stat`` when nothing changed.

    Each item is one ``write`` of one line to a file opened ``O_APPEND`` (atomic for
    short lines on a local file system); readers parse complete lines only.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        self._pos = 0
        self._buf = b""

    def publish(self, item: dict[str, Any]) -> None:
        line = (json.dumps(item, separators=(",", ":")) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)

    def poll(self) -> list[dict[str, Any]]:
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return []
        if size <= self._pos:
            return []
        with open(self.path, "rb") as f:
            f.seek(self._pos)
            data = f.read(size - self._pos)
        self._pos += len(data)
        data = self._buf + data
        lines = data.split(b"\n")
        self._buf = lines.pop()  # incomplete tail (a write in progress)
        return [json.loads(x) for x in lines if x.strip()]


@dataclass
class WindowController:
    """One rank's capture state machine. Call :meth:`begin_step` / :meth:`end_step` around each step,
    :meth:`range_enter` for other ranges (named start), :meth:`tick` from a timer, :meth:`finish` at exit.

    ``t0_ns``: when the program started (the delay counts from it). ``windows``: one dict per
    exported window (``k, start_ns, end_ns, first_step, steps, late`` plus the backend's figures).
    """

    spec: WindowSpec
    backend: Backend
    board: Any
    clock: Callable[[], int]
    t0_ns: int
    leader: bool = True
    world: int = 1
    windows: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    step: int = -1  # index of the current (or last) step; -1 before the first
    steps_seen: int = 0
    profiled_steps: int = 0
    done: bool = False
    done_reason: str = ""
    on_done: Callable[[WindowController], None] | None = None

    def __post_init__(self) -> None:
        self._k = 0  # next window to open
        self._open: dict[str, Any] | None = None  # the window being recorded
        self._plan: dict[int, dict[str, Any]] = {}  # k -> {"open": item, "close": item}
        self._end: dict[str, Any] | None = None
        self._decided: set[tuple[str, int]] = set()  # leader: (what, k) published
        self._capture_start_ns: int | None = None
        self._last_close_ns: int | None = None
        self._started = self.spec.start_at is None  # whether the start condition (besides the delay) was met
        self._in_step = False
        self._step_begin_ns = 0

    # -- state -----------------------------------------------------------------
    @property
    def recording(self) -> bool:
        return self._open is not None

    @property
    def capture_start_ns(self) -> int | None:
        return self._capture_start_ns

    def _la(self) -> int:
        return self.spec.lookahead if self.world > 1 else 0

    def _lead_ns(self) -> int:
        return int(self.spec.lead_s * 1e9) if self.world > 1 else 0

    def _past_delay(self, now: int) -> bool:
        return now - self.t0_ns >= self.spec.delay_s * 1e9

    def _capture_over(self, now: int) -> bool:
        if self.spec.steps is not None and self.profiled_steps >= self.spec.steps:
            return True
        if self.spec.max_windows and len(self.windows) >= self.spec.max_windows:
            return True
        d = self.spec.duration_s
        return d is not None and self._capture_start_ns is not None and now - self._capture_start_ns >= d * 1e9

    def _may_open(self, now: int) -> bool:
        if self.done or self._open is not None or not self._started or not self._past_delay(now):
            return False
        if self._last_close_ns is not None and now - self._last_close_ns < self.spec.gap_s * 1e9:
            return False
        return not self._capture_over(now)

    # -- the board -----------------------------------------------------------------
    def _publish(self, item: dict[str, Any]) -> None:
        key = (item["what"], int(item.get("k", -1)))
        if key in self._decided:
            return
        self._decided.add(key)
        self.board.publish(item)

    def _refresh(self) -> None:
        for it in self.board.poll():
            if it.get("what") == "end":
                self._end = it
            else:
                self._plan.setdefault(int(it["k"]), {})[it["what"]] = it

    # -- program events ------------------------------------------------------------
    def begin_step(self) -> None:
        """A step starts (call before its range opens)."""
        if self.done:
            return
        now = self.clock()
        self.step += 1
        self.steps_seen += 1
        self._in_step = True
        if self.spec.start_at == "step" and self._past_delay(now):
            self._started = True
        if self.leader and self._may_open(now):
            self._publish({"what": "open", "k": self._k, "step": self.step + self._la(), "max_steps": self._left()})
        self._refresh()
        self._apply_open(now, step=self.step)
        if self._open is not None and self._open["mode"] == "time":
            self._open["mode"] = "step"  # opened on time before the program's first step: close on a step end
        self._maybe_end(now)
        self._step_begin_ns = self.clock()

    def end_step(self) -> None:
        """The current step ended (call after its range closed)."""
        if self.done:
            return
        now = self.clock()
        self._in_step = False
        w = self._open
        if w is not None and self._step_begin_ns >= w["start_ns"]:  # the whole step ran inside the window
            w["steps"] += 1
            self.profiled_steps += 1
        if w is not None and w["mode"] == "step" and self.leader and ("close", w["k"]) not in self._decided:
            at = self._close_step(now, w)
            if at is not None:
                self._publish({"what": "close", "k": w["k"], "step": at})
        self._refresh()
        w = self._open
        if w is not None and w["mode"] == "step":
            c = self._plan.get(w["k"], {}).get("close")
            if w.get("max_steps") is not None and w["steps"] >= w["max_steps"]:
                self._close(now, late=0)  # every rank counts the same steps: no word from the leader needed
            elif c is not None and c.get("step") is not None and self.step >= c["step"]:
                self._close(now, late=self.step - c["step"])
            elif c is not None and c.get("t_ns") is not None and now >= c["t_ns"]:
                self._close(now, late=0)  # decided on time before the window saw its first step
        self._maybe_end(self.clock())

    def _close_step(self, now: int, w: dict[str, Any]) -> int | None:
        """The leader's close decision at the end of ``self.step``: the step after which window ``w`` closes.

        (``--steps`` needs no decision: every rank closes a window after its ``max_steps``.)"""
        la = self._la()
        d = self.spec.duration_s
        if now - w["start_ns"] >= self.spec.window_s * 1e9 or (
            d is not None and self._capture_start_ns is not None and now - self._capture_start_ns >= d * 1e9
        ):
            return self.step + la
        return None

    def range_enter(self, name: str) -> None:
        """A range that is not a step opens (only matters for a named start)."""
        sa = self.spec.start_at
        if self.done or self._started or not sa or sa == "step" or not name.startswith(sa):
            return
        now = self.clock()
        if not self._past_delay(now):
            return
        self._started = True
        # every rank reaches its own first such range: each opens there, without the board
        self._do_open(now, mode="step" if self.steps_seen else "time", late=0, max_steps=self._left())

    def tick(self) -> None:
        """Time-based boundaries (no steps in the program, or none in the window): call every few ms."""
        if self.done:
            return
        now = self.clock()
        if self.leader:
            if self._may_open(now) and not self.steps_seen:
                self._publish({"what": "open", "k": self._k, "t_ns": now + self._lead_ns(), "max_steps": self._left()})
            w = self._open
            if w is not None and w["mode"] == "time" and ("close", w["k"]) not in self._decided:
                if self._capture_over(now) or now - w["start_ns"] >= self.spec.window_s * 1e9:
                    self._publish({"what": "close", "k": w["k"], "t_ns": now + self._lead_ns()})
        self._refresh()
        self._apply_open(now, step=None)
        w = self._open
        if w is not None and w["mode"] == "time":
            c = self._plan.get(w["k"], {}).get("close")
            if c is not None and c.get("t_ns") is not None and now >= c["t_ns"]:
                self._close(now, late=0)
        self._maybe_end(self.clock())

    def wants_tick(self) -> bool:
        """Whether :meth:`tick` has anything to do soon (cheap; the ticker asks before interrupting)."""
        if self.done:
            return False
        w = self._open
        if w is not None:
            return bool(w["mode"] == "time")
        return not self.steps_seen

    def finish(self, reason: str) -> None:
        """The program is ending: close the open window (exported), then done. Safe to call twice."""
        if self.done:
            return
        now = self.clock()
        if self._open is not None:
            self._close(now, late=0, cut=reason)
        if self.leader:
            self._publish({"what": "end", "reason": reason})
        self._set_done(reason)

    # -- boundaries ------------------------------------------------------------------
    def _apply_open(self, now: int, step: int | None) -> None:
        if self._open is not None or self.done:
            return
        item = self._plan.get(self._k, {}).get("open")
        if item is None:
            return
        if item.get("step") is not None:
            if step is None or step < item["step"]:
                return
            self._do_open(now, mode="step", late=step - item["step"], max_steps=item.get("max_steps"))
        elif item.get("t_ns") is not None and now >= item["t_ns"]:
            self._do_open(now, mode="time", late=0, max_steps=item.get("max_steps"))

    def _left(self) -> int | None:
        return None if self.spec.steps is None else self.spec.steps - self.profiled_steps

    def _do_open(self, now: int, mode: str, late: int, max_steps: int | None = None) -> None:
        try:
            self.backend.start()
        except Exception as e:  # noqa: BLE001 - no profiler: stop trying
            self.errors.append(f"profiler start: {type(e).__name__}: {e}")
            self._set_done("profiler_error")
            return
        t = self.clock()
        if self._capture_start_ns is None:
            self._capture_start_ns = t
        first = self.step if self._in_step and mode == "step" else self.step + 1
        self._open = {"k": self._k, "start_ns": t, "first_step": first, "steps": 0, "mode": mode, "late": late,
                      "max_steps": max_steps}

    def _close(self, now: int, late: int, cut: str | None = None) -> None:
        w = self._open
        assert w is not None
        self._open = None
        end = self.clock()
        try:
            info = self.backend.stop_export(w["k"]) or {}
        except Exception as e:  # noqa: BLE001 - keep the earlier windows
            self.errors.append(f"window {w['k']}: profiler stop/export: {type(e).__name__}: {e}")
            info = {"failed": True}
        w.update(info)
        w["end_ns"] = end
        w["late"] = max(w["late"], late)
        if cut:
            w["cut_by"] = cut
        self.windows.append(w)
        self._k += 1
        self._last_close_ns = self.clock()

    def _maybe_end(self, now: int) -> None:
        if self.done or self._open is not None:
            return
        if self._end is not None:
            self._set_done(str(self._end.get("reason") or "leader"))
            return
        if self._capture_start_ns is not None and self._capture_over(now):
            if self.leader:
                self._publish({"what": "end", "reason": "complete"})
            # followers wait for the leader's word unless they have recorded as many windows
            if self.leader or (self.spec.steps is not None and self.profiled_steps >= self.spec.steps):
                self._set_done("complete")

    def _set_done(self, reason: str) -> None:
        self.done = True
        self.done_reason = reason
        if self.on_done is not None:
            self.on_done(self)
