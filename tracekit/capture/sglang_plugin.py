"""Per-forward hook for SGLang: one NVTX + record_function range and one step record per forward.

Registered under SGLang's ``sglang.srt.plugins`` entry-point group (SGLang >= 0.5.11, see
``pyproject.toml``); :func:`register` is a no-op unless ``TRACEKIT_SGLANG_HOOK=1``, so installing
tracekit never changes a production server. For older SGLang the same :func:`forward_hook` is
installed by :mod:`tracekit.capture.sglang_autopatch` (``tracekit launch``).

The hook wraps ``ModelRunner.forward(self, forward_batch, ...)`` (AROUND) and reads only CPU-side
fields: ``forward_batch.forward_mode`` (an IntEnum), ``batch_size``, ``extend_num_tokens`` (int),
``spec_info.draft_token_num`` (int), ``self.is_draft_worker``, ``self.forward_pass_id`` and the
returned ``ModelRunnerOutput.can_run_graph`` (or the bool of the older ``(logits, can_run_graph)``
tuple). It never touches a GPU tensor, so it adds no device sync.

Range name: ``tk.fwd[<MODE> bs=<bs> tok=<tokens>[ draft]]``.

Step records (when ``TRACEKIT_STEP_DIR`` is set): one JSON object per line in
``<dir>/steps-rank<rank>-pid<pid>.jsonl`` with keys ``rank, tp_rank, pid, start_ns, end_ns`` (Unix
epoch ns, CLOCK_REALTIME — the trace clock), ``mode, bs, tokens, draft, forward_pass_id,
can_run_graph, label``. :func:`load_step_records` turns a directory of them into schema rows
(``kind="step"``, ``src="tracekit.step"``).

This module imports only the standard library at import time (it is loaded in every SGLang
process); torch and polars are imported lazily.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable
from tracekit import _env

__all__ = [
    "ENV_ENABLE",
    "ENV_STEP_DIR",
    "TARGET",
    "register",
    "forward_hook",
    "make_label",
    "forward_tokens",
    "load_step_records",
]

ENV_ENABLE = _env.SGLANG_HOOK
ENV_STEP_DIR = _env.STEP_DIR
TARGET = "sglang.srt.model_executor.model_runner.ModelRunner.forward"
_FLUSH_EVERY_S = 1.0
_EXTEND_LIKE = {"EXTEND", "MIXED", "SPLIT_PREFILL", "DLLM_EXTEND", "DRAFT_EXTEND", "DRAFT_EXTEND_V2"}


def enabled() -> bool:
    """True when the env gate ``TRACEKIT_SGLANG_HOOK=1`` is set."""
    return _env.flag(ENV_ENABLE)


def register() -> None:
    """SGLang plugin entry point: register the AROUND hook on ``ModelRunner.forward``.

    Does nothing unless ``TRACEKIT_SGLANG_HOOK=1``. SGLang's ``load_plugins()`` applies the
    hook (``HookRegistry.apply_hooks``) right after all plugins ran, in every process.
    """
    if not enabled():
        return
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    HookRegistry.register(TARGET, forward_hook, HookType.AROUND)
    _STATE.installed_by = _STATE.installed_by or "plugin"


# ---------------------------------------------------------------- labels (CPU-only fields)


def _int_or_none(v: Any) -> int | None:
    # bool is an int subclass; tensors are not ints: never call .item() here.
    if isinstance(v, bool) or not isinstance(v, int):
        return None
    return int(v)


def _mode_name(fb: Any) -> str:
    mode = getattr(fb, "forward_mode", None)
    name = getattr(mode, "name", None)
    return name if isinstance(name, str) else "UNKNOWN"


def forward_tokens(fb: Any) -> int | None:
    """Tokens processed by a forward, from CPU fields only.

    ``extend_num_tokens`` for extend-like modes (EXTEND, MIXED, SPLIT_PREFILL, ...); for
    TARGET_VERIFY ``batch_size * spec_info.draft_token_num`` when known; else ``batch_size``.
    """
    mode = _mode_name(fb)
    bs = _int_or_none(getattr(fb, "batch_size", None))
    ext = _int_or_none(getattr(fb, "extend_num_tokens", None))
    if mode in _EXTEND_LIKE and ext is not None:
        return ext
    if mode == "TARGET_VERIFY":
        dtn = _int_or_none(getattr(getattr(fb, "spec_info", None), "draft_token_num", None))
        if bs is not None and dtn is not None:
            return bs * dtn
        if ext is not None:
            return ext
    return bs


def make_label(fb: Any, is_draft: bool = False) -> str:
    """``tk.fwd[<MODE> bs=<bs> tok=<tokens>[ draft]]`` from CPU-only ForwardBatch fields."""
    bs = _int_or_none(getattr(fb, "batch_size", None))
    tok = forward_tokens(fb)
    s = f"tk.fwd[{_mode_name(fb)} bs={'?' if bs is None else bs} tok={'?' if tok is None else tok}"
    return s + (" draft]" if is_draft else "]")


# ---------------------------------------------------------------- per-process state


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.installed_by: str | None = None
        self.ranges: tuple[Callable[[str], Any], Callable[[], Any]] | None = None
        self.record_function: Any = None
        self.torch_ready = False
        self.rank: int | None = None
        self.tp_rank: int | None = None
        self.fh: Any = None
        self.buf: list[str] = []
        self.last_flush = 0.0
        self.local = threading.local()

    def setup_torch(self) -> None:
        if self.torch_ready:
            return
        self.torch_ready = True
        try:
            import torch

            self.record_function = torch.profiler.record_function
        except Exception:  # noqa: BLE001 - no torch: no record_function
            self.record_function = None
        self.ranges = _nvtx_pair()


def _nvtx_pair() -> tuple[Callable[[str], Any], Callable[[], Any]] | None:
    """(push, pop) for NVTX: torch.cuda.nvtx when it works, else the ``nvtx`` package, else None."""
    try:
        import torch

        if torch.cuda.is_available():
            nv = torch.cuda.nvtx
            nv.range_push("tk.probe")  # type: ignore[no-untyped-call]
            nv.range_pop()  # type: ignore[no-untyped-call]
            return nv.range_push, nv.range_pop
    except Exception:  # noqa: BLE001 - CPU build or no driver
        pass
    try:
        import nvtx

        return (lambda msg: nvtx.push_range(msg, domain="tracekit")), (lambda: nvtx.pop_range(domain="tracekit"))
    except Exception:  # noqa: BLE001
        return None


_STATE = _State()


def _resolve_rank(runner: Any) -> tuple[int, int | None]:
    """(global rank, tp rank): torch.distributed rank when initialised, else SGLang's tp_rank."""
    tp = _int_or_none(getattr(runner, "tp_rank", None))  # <= 0.5.12
    if tp is None:
        try:
            from sglang.srt.runtime_context import get_parallel  # >= 0.5.16

            tp = _int_or_none(get_parallel().tp_rank)
        except Exception:  # noqa: BLE001
            tp = None
    rank = None
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank = int(dist.get_rank())
    except Exception:  # noqa: BLE001
        rank = None
    if rank is None:
        rank = tp if tp is not None else (_env.int_value(_env.RANK) or 0)
    return rank, tp


def _write_record(rec: dict[str, Any]) -> None:
    d = _env.get(ENV_STEP_DIR)
    if not d:
        return
    st = _STATE
    with st.lock:
        if st.fh is None:
            p = Path(d)
            p.mkdir(parents=True, exist_ok=True)
            st.fh = open(p / f"steps-rank{rec['rank']}-pid{rec['pid']}.jsonl", "a", encoding="utf-8")  # noqa: SIM115
            atexit.register(_flush, True)
            threading.Thread(target=_flusher, name="tracekit-step-flush", daemon=True).start()
        st.buf.append(json.dumps(rec, separators=(",", ":")))
        now = time.monotonic()
        if now - st.last_flush >= _FLUSH_EVERY_S:
            _flush_locked()
            st.last_flush = now


def _flush_locked() -> None:
    st = _STATE
    if st.fh is not None and st.buf:
        st.fh.write("\n".join(st.buf) + "\n")
        st.fh.flush()
        st.buf.clear()


def _flusher() -> None:
    """Flush buffered records every interval, so an idle server's last records reach the disk."""
    while _STATE.fh is not None:
        time.sleep(_FLUSH_EVERY_S / 2)
        try:
            _flush()
        except (OSError, ValueError):
            return


def _flush(close: bool = False) -> None:
    with _STATE.lock:
        _flush_locked()
        if close and _STATE.fh is not None:
            _STATE.fh.close()
            _STATE.fh = None


# ---------------------------------------------------------------- the hook


def forward_hook(original_fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """AROUND hook for ``ModelRunner.forward``: ranges + step record, result passed through.

    Signature as SGLang's HookRegistry calls AROUND hooks: ``fn(original_fn, *args, **kwargs)``
    with ``args[0]`` the ModelRunner and ``forward_batch`` the first positional (or keyword)
    argument. If tracekit's hook is installed twice (plugin and import hook), the inner one
    passes through.
    """
    st = _STATE
    if getattr(st.local, "active", False) or not args:
        return original_fn(*args, **kwargs)
    runner = args[0]
    fb = args[1] if len(args) > 1 else kwargs.get("forward_batch")
    st.setup_torch()
    try:
        is_draft = bool(getattr(runner, "is_draft_worker", False) is True)
        label = make_label(fb, is_draft)
    except Exception:  # noqa: BLE001 - a label problem must never break a forward
        is_draft, label = False, "tk.fwd[UNKNOWN bs=? tok=?]"
    rf = st.record_function(label) if st.record_function is not None else None
    st.local.active = True
    t0 = time.time_ns()
    if st.ranges is not None:
        st.ranges[0](label)
    try:
        if rf is not None:
            with rf:
                out = original_fn(*args, **kwargs)
        else:
            out = original_fn(*args, **kwargs)
    finally:
        if st.ranges is not None:
            st.ranges[1]()
        t1 = time.time_ns()
        st.local.active = False
    if _env.get(ENV_STEP_DIR):
        try:
            _record(runner, fb, out, label, is_draft, t0, t1)
        except Exception:  # noqa: BLE001 - recording is best effort, never breaks serving
            pass
    return out


def _can_run_graph(out: Any) -> bool | None:
    v = getattr(out, "can_run_graph", None)  # ModelRunnerOutput (>= ~0.5.9)
    if isinstance(v, bool):
        return v
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], bool):  # (logits, can_run_graph) <= 0.5.6
        return out[1]
    return None


def _record(runner: Any, fb: Any, out: Any, label: str, is_draft: bool, t0: int, t1: int) -> None:
    st = _STATE
    if st.rank is None:
        st.rank, st.tp_rank = _resolve_rank(runner)
    _write_record(
        {
            "rank": st.rank,
            "tp_rank": st.tp_rank,
            "pid": os.getpid(),
            "start_ns": t0,
            "end_ns": t1,
            "mode": _mode_name(fb),
            "bs": _int_or_none(getattr(fb, "batch_size", None)),
            "tokens": forward_tokens(fb),
            "draft": is_draft,
            "forward_pass_id": _int_or_none(getattr(runner, "forward_pass_id", None)),
            "can_run_graph": _can_run_graph(out),
            "label": label,
        }
    )


# ---------------------------------------------------------------- reader


def load_step_records(step_dir: str | os.PathLike[str]) -> Any:
    """Read ``steps-rank*.jsonl`` under ``step_dir`` into schema rows (a polars DataFrame).

    One ``kind="step"`` row per forward: ``ts_ns=start_ns``, ``dur_ns=end_ns-start_ns``,
    ``name`` = the range label, ``step_id`` = SGLang's ``forward_pass_id`` (per runner; a draft
    runner counts separately, see ``step_mode``), ``step_mode`` = mode (``DRAFT`` for a draft
    runner's forwards), ``batch_size``, ``tokens``, ``pid``, ``src="tracekit.step"``;
    ``profiled`` is left null (the converter knows the profiler windows). A torn last line (a
    rank killed mid-write) is skipped. Returns an empty schema frame when nothing is there.
    """
    from tracekit.schema import empty_frame, frame_from_rows

    d = Path(step_dir)
    files = sorted(d.glob("steps-rank*.jsonl")) if d.is_dir() else []
    rows: list[dict[str, Any]] = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                try:
                    r = json.loads(line)
                    start, end = int(r["start_ns"]), int(r["end_ns"])
                    rank = int(r["rank"])
                except (ValueError, KeyError, TypeError):
                    continue
                mode = "DRAFT" if r.get("draft") else r.get("mode")
                rows.append(
                    {
                        "rank": rank,
                        "kind": "step",
                        "ts_ns": start,
                        "dur_ns": max(0, end - start),
                        "pid": r.get("pid"),
                        "name": r.get("label") or f"tk.fwd[{mode}]",
                        "step_id": r.get("forward_pass_id"),
                        "step_mode": mode,
                        "batch_size": r.get("bs"),
                        "tokens": r.get("tokens"),
                        "src": "tracekit.step",
                    }
                )
    if not rows:
        return empty_frame()
    return frame_from_rows(rows).sort(["rank", "ts_ns"], maintain_order=True)
