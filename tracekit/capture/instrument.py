"""Forward instrumentation for any PyTorch program.

:func:`instrument_forward` wraps a forward callable (or :func:`instrument_module`
a module's ``forward``) so that every call

* opens an NVTX range (``nvtx`` package, domain ``tracekit``, else
  ``torch.cuda.nvtx`` when CUDA is there) and, while a torch profiler is
  recording, a ``record_function`` range, both named
  ``tk.fwd[<MODE> bs=<bs> tok=<tokens>]`` (``record_function`` costs ~12 us per
  call even with the profiler off, so it is skipped then);
* appends a step record (CLOCK_REALTIME start/end ns from ``time.time_ns``,
  mode, batch size, tokens, whether the profiler was recording) to a
  :class:`StepRecorder` that lives for the whole capture, also outside
  profiler windows.

The label comes from a caller-supplied function of the call's arguments that
must use CPU-side values only (shapes, Python ints, CPU tensors): the wrapper
itself never touches device memory and never forces a device sync. With the
profiler off the added cost is a few microseconds per call
(``benchmarks/instrument_overhead.py``).

:meth:`StepRecorder.frame` turns the records into trace rows (``kind="step"``,
``src="tracekit.step"``) for ``convert(..., extra_frames=[...])``.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

__all__ = ["StepRecord", "StepRecorder", "Label", "instrument_forward", "instrument_module", "fwd_label", "STEP_SRC"]

STEP_SRC = "tracekit.step"

#: label function: (args, kwargs) -> (mode, batch_size, tokens)
Label = Callable[[tuple[Any, ...], dict[str, Any]], tuple[str, int, int]]


def fwd_label(mode: str, bs: int, tokens: int) -> str:
    """The range name the converter parses into a step row."""
    return f"tk.fwd[{mode} bs={bs} tok={tokens}]"


class StepRecord(NamedTuple):
    step_id: int
    start_ns: int
    end_ns: int
    mode: str
    batch_size: int
    tokens: int
    profiled: bool


@dataclass
class StepRecorder:
    """Keeps one :class:`StepRecord` per forward for the whole capture.

    ``profiled`` is a zero-argument callable telling whether a profiler window
    is open (the capture's window controller sets it). Records are stored as
    plain tuples (an append costs ~50 ns; objects would cost microseconds).
    """

    rank: int = 0
    profiled: Callable[[], bool] = lambda: False
    _raw: list[tuple[int, int, str, int, int, bool]] = field(default_factory=list)

    def add(self, start_ns: int, end_ns: int, mode: str, bs: int, tokens: int, profiled: bool) -> None:
        self._raw.append((start_ns, end_ns, mode, bs, tokens, profiled))

    def __len__(self) -> int:
        return len(self._raw)

    @property
    def records(self) -> list[StepRecord]:
        return [StepRecord(i, *t) for i, t in enumerate(self._raw)]

    def to_rows(self) -> list[dict[str, Any]]:
        """Plain dicts with trace column names (picklable, JSON-able)."""
        return [
            {
                "rank": self.rank,
                "kind": "step",
                "ts_ns": r.start_ns,
                "dur_ns": max(0, r.end_ns - r.start_ns),
                "name": fwd_label(r.mode, r.batch_size, r.tokens),
                "step_id": r.step_id,
                "step_mode": r.mode,
                "batch_size": r.batch_size,
                "tokens": r.tokens,
                "profiled": r.profiled,
                "src": STEP_SRC,
            }
            for r in self.records
        ]

    def frame(self) -> Any:
        """The records as a schema-conformant polars frame (imports polars lazily)."""
        from tracekit.schema import frame_from_rows

        return frame_from_rows(self.to_rows())


def _nvtx_pair() -> tuple[Callable[[str], Any], Callable[[], Any]] | None:
    try:
        import nvtx

        dom = nvtx.get_domain("tracekit")
        attrs = dom.get_event_attributes
        cache: dict[str, Any] = {}  # building attributes costs ~10 us; labels repeat

        def push(msg: str) -> None:
            a = cache.get(msg)
            if a is None:
                if len(cache) > 4096:
                    cache.clear()
                a = cache[msg] = attrs(message=msg)
            dom.push_range(a)

        return push, dom.pop_range
    except Exception:  # noqa: BLE001 - nvtx absent or broken
        pass
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    except Exception:  # noqa: BLE001
        pass
    return None


def instrument_forward(
    fn: Callable[..., Any],
    recorder: StepRecorder,
    label: Label,
    *,
    nvtx: bool = True,
) -> Callable[..., Any]:
    """Wrap ``fn``; each call is one step record plus NVTX + record_function ranges.

    ``label(args, kwargs)`` returns ``(mode, batch_size, tokens)`` from CPU-side
    values. Exceptions from ``fn`` propagate; the step is still recorded.
    """
    import torch
    from torch.autograd.profiler import record_function

    profiler_on = torch._C._autograd._profiler_enabled  # ~0.5 us; record_function costs ~12 us even when off
    pair = _nvtx_pair() if nvtx else None
    push, pop = pair if pair else (None, None)
    add = recorder._raw.append
    clock = time.time_ns

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        mode, bs, tok = label(args, kwargs)
        name = f"tk.fwd[{mode} bs={bs} tok={tok}]"
        prof = recorder.profiled()
        if push is not None:
            push(name)
        t0 = clock()
        try:
            if profiler_on():
                with record_function(name):
                    return fn(*args, **kwargs)
            return fn(*args, **kwargs)
        finally:
            t1 = clock()
            if pop is not None:
                pop()
            add((t0, t1, mode, bs, tok, prof))

    wrapped.__tracekit_wrapped__ = fn  # type: ignore[attr-defined]
    return wrapped


def instrument_module(module: Any, recorder: StepRecorder, label: Label, *, nvtx: bool = True) -> Any:
    """Replace ``module.forward`` by its instrumented version; returns the module."""
    module.forward = instrument_forward(module.forward, recorder, label, nvtx=nvtx)
    return module
