"""Profiler windows: N profiled steps every M steps, started and stopped together.

The schedule is a pure function of the step number, so every rank opens and
closes each window at the same step without talking; a barrier right before
``start()`` (after a device sync) aligns the ranks in time so there is no
profiler-start transient. Each window is exported as one Kineto JSON per rank:
``rank{r}.win{k}.trace.json.gz`` (torch also writes ``distributedInfo.rank``).

The profiler itself is injected (a factory returning an object with
``start()``, ``stop()``, ``export_chrome_trace(path)``) so the window logic is
tested on a CPU machine with a fake; :func:`torch_profiler_factory` makes the
real one with CUDA sync events enabled where the torch version supports them.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

__all__ = ["WindowSchedule", "ProfilerWindows", "torch_profiler_factory", "window_file", "AutoWindows", "auto_prelude",
           "AUTO_WINDOW_S", "AUTO_SHARE", "AUTO_PRELUDE_S", "OPEN", "CLOSE",
           "quiet_profiler_log", "KINETO_CHATTER"]


def window_file(out_dir: Path, rank: int, window: int) -> Path:
    """Path of one rank's Kineto JSON for one window."""
    return Path(out_dir) / f"rank{rank}.win{window}.trace.json.gz"


@dataclass(frozen=True)
class WindowSchedule:
    """Profile ``steps`` steps starting at ``first`` and then every ``every`` steps.

    ``max_windows`` (0 = unlimited) caps the number of windows. ``steps <= 0``
    disables profiling.
    """

    first: int = 80
    steps: int = 5
    every: int = 200
    max_windows: int = 0

    def window_of(self, step: int) -> int | None:
        """Index of the window that ``step`` belongs to, or None."""
        if self.steps <= 0 or step < self.first:
            return None
        k, off = divmod(step - self.first, max(self.every, self.steps))
        if off >= self.steps or (self.max_windows and k >= self.max_windows):
            return None
        return k

    def starts_at(self, step: int) -> bool:
        k = self.window_of(step)
        return k is not None and (step == self.first or self.window_of(step - 1) != k)

    def ends_after(self, step: int) -> bool:
        k = self.window_of(step)
        return k is not None and self.window_of(step + 1) != k


#: an automatic window records about this long (wall time; bounded memory: one window at a time)
AUTO_WINDOW_S = 1.0
#: automatic windows aim at this share of the wall time: the next one opens once the last window's length is
#: this share of the time since it opened (its stop and export count against the gap; when they alone take
#: longer, the next window opens right after them)
AUTO_SHARE = 1 / 3
#: unprofiled steps before the first automatic window: about this long, at most AUTO_PRELUDE_MAX steps (replay
#: calibrates on 2 x 40 unprofiled steps)
AUTO_PRELUDE_S = 3.0
AUTO_PRELUDE_MAX = 80
OPEN, CLOSE = 1, 2


def auto_prelude(step_s: float, *, prelude_s: float = AUTO_PRELUDE_S) -> int:
    """Unprofiled steps before the first automatic window, from the warm-up step time (8 .. AUTO_PRELUDE_MAX)."""
    ok = step_s > 0 and math.isfinite(step_s)
    return max(8, min(AUTO_PRELUDE_MAX, int(prelude_s / step_s) if ok else AUTO_PRELUDE_MAX))


@dataclass
class AutoWindows:
    """The leader's window decisions when no ``--profile-steps`` is given (pure: times are passed in).

    :meth:`decide` at a control step says OPEN, CLOSE or 0; the capture tells every rank through its control
    collective, so all open and close each window at the same step. A window closes once it has recorded
    ``window_s``; the next opens when the last window is ``share`` of the time from its start to now, or
    right after its stop and export when those took longer. Over a capture the windows hold about ``share`` of
    the wall time, less where stopping and exporting a window costs more than ``(1 / share - 1)`` windows.
    """

    first: int
    window_s: float = AUTO_WINDOW_S
    share: float = AUTO_SHARE
    max_windows: int = 0
    n: int = 0
    opened_at: float | None = None
    last_open: float = 0.0
    last_len: float = 0.0
    exported_at: float | None = None

    def decide(self, step: int, now: float, recording: bool) -> int:
        if recording:
            return CLOSE if self.opened_at is not None and now - self.opened_at >= self.window_s else 0
        if step < self.first or (self.max_windows and self.n >= self.max_windows):
            return 0
        if self.exported_at is None:
            return OPEN
        due = self.last_open + self.last_len / self.share
        return OPEN if now >= max(due, self.exported_at) else 0

    def opened(self, now: float) -> None:
        self.opened_at, self.n = now, self.n + 1

    def closed(self, stopped_at: float, exported_at: float) -> None:
        """The window was stopped at ``stopped_at`` and its export finished at ``exported_at``."""
        if self.opened_at is not None:
            self.last_open, self.last_len = self.opened_at, stopped_at - self.opened_at
        self.opened_at, self.exported_at = None, exported_at


def gzip_fast(src: Path, dst: Path, chunk: int = 4 << 20) -> None:
    """``src`` gzipped into ``dst`` at the fastest level (ISA-L's igzip when installed, else zlib level 1): the
    window files live until the capture converts them, so speed matters more than size (level 1: ~8 % of the JSON)."""
    import gzip

    opener: Callable[..., Any] = gzip.open
    level = 1
    try:
        from isal import igzip  # core dependency; absent in a program's own environment

        opener, level = igzip.open, 0
    except ImportError:  # pragma: no cover - the standard library's
        pass
    with open(src, "rb") as f, opener(dst, "wb", compresslevel=level) as out:
        while b := f.read(chunk):
            out.write(b)


#: lines Kineto writes to stderr on every profiler start and stop (its USDT and STAGE levels, which its
#: KINETO_LOG_LEVEL does not silence), and its error on a machine without a usable GPU driver or device
#: (CUDA error 35 / 100, printed by a CUDA build of torch on a CPU-only machine at every stop)
KINETO_CHATTER = re.compile(
    rb"^(?:USDT|STAGE):\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ [\w.]+:\d+\] "
    rb"|^ERROR:\d{4}-\d\d-\d\d [\d:]+ \d+:\d+ [\w.]+:\d+\] gpuGetDeviceCount failed with code (?:35|100)\b")


@contextlib.contextmanager
def quiet_profiler_log() -> Iterator[None]:
    """Run a profiler start/stop/export with the process' stderr (fd 2) held in a temporary file, then write
    back every line but Kineto's chatter (:data:`KINETO_CHATTER`). Other threads' output in that time is kept,
    only later. Where fd 2 cannot be redirected, the block runs as it is."""
    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            with contextlib.suppress(OSError, ValueError, AttributeError):
                sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            keep = [ln for ln in tmp.read().splitlines(keepends=True) if not KINETO_CHATTER.match(ln)]
            data = b"".join(keep)
            with contextlib.suppress(OSError):
                while data:
                    data = data[os.write(2, data):]


def torch_profiler_factory(*, cuda: bool, record_shapes: bool = False, with_stack: bool = False) -> Callable[[], Any]:
    """A factory of ``torch.profiler.profile`` objects (CPU + CUDA activities, CUDA sync events)."""
    import torch

    acts = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    kwargs: dict[str, Any] = {}
    if cuda:
        try:
            kwargs["experimental_config"] = torch.profiler._ExperimentalConfig(  # type: ignore[attr-defined]
                enable_cuda_sync_events=True)
        except Exception:  # noqa: BLE001 - older torch
            pass

    def make() -> Any:
        return torch.profiler.profile(activities=acts, record_shapes=record_shapes, with_stack=with_stack, **kwargs)

    return make


@dataclass
class ProfilerWindows:
    """Drives windows from the step loop: call :meth:`before_step` / :meth:`after_step`.

    ``barrier`` and ``sync`` are injected (collective barrier of the capture's
    control group; device synchronize). ``windows`` holds ``[start_ns, end_ns]``
    per finished window (CLOCK_REALTIME), ``files`` the exported paths.
    """

    schedule: WindowSchedule
    out_dir: Path
    rank: int
    factory: Callable[[], Any]
    barrier: Callable[[], None] = lambda: None
    sync: Callable[[], None] = lambda: None
    clock: Callable[[], int] = time.time_ns
    windows: list[list[int]] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    export_s: float = 0.0
    _prof: Any = None
    _k: int | None = None
    _t0: int = 0

    @property
    def recording(self) -> bool:
        return self._prof is not None

    def before_step(self, step: int) -> None:
        if self._prof is None and self.schedule.starts_at(step):
            self.open(self.schedule.window_of(step) or 0)

    def open(self, k: int) -> None:
        """Start window ``k`` now (every rank calls it at the same step: the barrier aligns them)."""
        if self._prof is not None:
            return
        self.sync()
        self.barrier()
        prof = self.factory()
        prof.start()
        # the window is the time the profiler records: from when start() returns to when stop() is called
        # (kineto's stop takes tens of ms; stamping after it put ~35 ms of unrecorded time, read as host idle,
        # at the end of every window of the built-in workload on an H200)
        self._t0 = self.clock()
        self._prof, self._k = prof, k

    def after_step(self, step: int) -> None:
        if self._prof is not None and self.schedule.ends_after(step):
            self.close()

    def close(self) -> Path | None:
        """Stop the open window (if any) and export it; safe to call twice."""
        prof, k = self._prof, self._k
        if prof is None:
            return None
        self._prof = self._k = None
        self.sync()
        t1 = self.clock()  # the device has drained: nothing after this is recorded
        prof.stop()
        path = window_file(self.out_dir, self.rank, int(k or 0))
        e0 = time.perf_counter()
        plain = path.with_name("." + path.name.replace(".trace.json.gz", ".part.json"))
        part = path.with_name("." + path.name.replace(".trace.json.gz", ".part.json.gz"))
        # exported plain, then gzipped at level 1: torch's own .gz export writes text through gzip at level 9,
        # 5-10x the plain export (a 1 s CPU-mode window: ~11 s), time the windows' schedule loses to exports
        prof.export_chrome_trace(str(plain))
        gzip_fast(plain, part)
        plain.unlink()
        os.replace(part, path)  # a killed export never leaves a file with the final name
        self.export_s += time.perf_counter() - e0
        self.windows.append([self._t0, t1])
        self.files.append(path)
        return path
