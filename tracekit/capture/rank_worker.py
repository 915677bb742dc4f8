"""One rank of a built-in workload capture (runs in a spawned process).

Builds the workload, instruments its forward from outside, runs warm-up steps,
then the measured loop: unprofiled steps first (replay calibration needs
2 x 40), then barrier-aligned profiler windows. Every ``control_every`` steps
the ranks agree on stopping with a one-element allreduce on a gloo control
group (rank 0 asks when the duration is over; any rank asks on Ctrl-C or
SIGTERM, whether the parent passed it on through the stop event or the rank got
it itself, e.g. from a process-group kill), so all ranks stop at the same step,
close their profiler windows and no collective is left hanging.

Outputs in ``run_dir``: ``rank{r}.win{k}.trace.json.gz`` per window and
``rank{r}.extra.json`` (step records, counters, ground-truth markers, rank
metadata, errors). Nothing here imports polars.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

__all__ = ["rank_main", "extra_file"]


_TERM: list[int] = []  # SIGTERM received by this rank


def extra_file(run_dir: Path, rank: int) -> Path:
    return Path(run_dir) / f"rank{rank}.extra.json"


def _model_cfg(opts: Any) -> Any:
    from tracekit.workloads.moe import CPU_SMALL, GLM5_GPU

    base = GLM5_GPU if opts.device == "cuda" else CPU_SMALL
    kw: dict[str, Any] = {"moe_impl": opts.moe_impl, "host_sync": opts.host_sync, "seed": opts.seed}
    if opts.layers:
        kw["n_layers"] = opts.layers
    if opts.hidden:
        kw["hidden"] = opts.hidden
    if opts.experts:
        kw["n_experts"] = opts.experts
    return replace(base, **kw)


def _serve_cfg(opts: Any) -> Any:
    from tracekit.workloads.serving import ServeConfig

    if opts.device == "cuda":
        base = ServeConfig(max_batch=64, prompt_len=256, out_len_min=64, out_len_max=256, prefill_every=16, prefill_max_seqs=4)
    else:
        base = ServeConfig(max_batch=8, prompt_len=16, out_len_min=16, out_len_max=64, prefill_every=8, prefill_max_seqs=2)
    kw: dict[str, Any] = {"cuda_graphs": opts.cuda_graphs, "seed": opts.seed + 1}
    if opts.max_batch:
        kw["max_batch"] = opts.max_batch
    if opts.prompt_len:
        kw["prompt_len"] = opts.prompt_len
    return replace(base, **kw)


def rank_main(rank: int, opts: Any, run_dir: str, store_path: str, stop_event: Any, queue: Any) -> None:
    """Process entry point (torch.multiprocessing spawn target)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent turns Ctrl-C into stop_event
    # SIGTERM sent to the rank itself: stop like the others at the next control step (a flag only;
    # taking the shared event's lock inside a handler could deadlock)
    signal.signal(signal.SIGTERM, lambda _s, _f: _TERM.append(_s))
    run = Path(run_dir)
    # Kineto/NCCL chatter goes to a per-rank log; the parent shows its tail if the rank fails.
    fd = os.open(run / f"rank{rank}.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    out: dict[str, Any] = {"rank": rank, "steps": [], "counters": {}, "markers": [], "meta": {}, "errors": []}
    try:
        _run(rank, opts, run, store_path, stop_event, queue, out)
    except BaseException as e:  # noqa: BLE001 - record and exit non-zero; the parent decides
        out["errors"].append(f"{type(e).__name__}: {e}")
        out["traceback"] = traceback.format_exc(limit=8)
        _write_extra(run, rank, out)
        os._exit(1)
    if not out.get("written"):
        _write_extra(run, rank, out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown (CUDA/NCCL destructors can block); everything is on disk


class _Control:
    """The control step, every ``control_every`` steps: one MAX allreduce of ``[stop, window command]`` on the
    control group. Rank 0 asks to stop once the duration is over and, without ``--profile-steps``, to open or
    close a profiler window (:class:`~tracekit.capture.profiler.AutoWindows`); any rank asks to stop on Ctrl-C
    or SIGTERM. Every rank applies the result at the same step."""

    def __init__(self, rank: int, opts: Any, windows: Any, ctrl: Any, stop_event: Any, auto: Any) -> None:
        import torch

        self.rank, self.opts, self.windows, self.ctrl, self.stop_event, self.auto = rank, opts, windows, ctrl, stop_event, auto
        self.flag = torch.zeros(2, dtype=torch.int32)
        self.t0 = time.time_ns()
        self.k = 0  # windows opened by command

    def __call__(self, step: int) -> str | None:
        """The stop reason ("duration", "interrupted") when the ranks agreed to stop at this step, else None."""
        import torch.distributed as dist

        from tracekit.capture.profiler import CLOSE, OPEN

        if step % max(1, self.opts.control_every):
            return None
        want, cmd = 0, 0
        if _TERM or self.stop_event.is_set():
            want = 2
        elif self.rank == 0 and (time.time_ns() - self.t0) / 1e9 >= self.opts.duration_s and step >= self.opts.min_steps:
            want = 1
        if self.auto is not None and self.rank == 0:
            cmd = self.auto.decide(step, time.monotonic(), self.windows.recording)
        self.flag[0], self.flag[1] = want, cmd
        dist.all_reduce(self.flag, op=dist.ReduceOp.MAX, group=self.ctrl)
        # one read of the agreed flags, with tolist (no aten::item): the capture's own control step must not show in
        # the trace as host readbacks of the program (idle by cause would count them as host syncs between steps)
        stop, got = self.flag.tolist()
        if stop:
            return "interrupted" if stop == 2 else "duration"
        if got == OPEN:
            self.windows.open(self.k)
            self.k += 1
            if self.auto is not None:
                self.auto.opened(time.monotonic())
        elif got == CLOSE:
            stopped = time.monotonic()
            self.windows.close()
            if self.auto is not None:
                self.auto.closed(stopped, time.monotonic())
        return None


def _write_extra(run: Path, rank: int, out: dict[str, Any]) -> None:
    tmp = extra_file(run, rank).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=str))
    os.replace(tmp, extra_file(run, rank))


def _init_dist(rank: int, opts: Any, store_path: str, meta: dict[str, Any]) -> tuple[Any, Any, Callable[[], None]]:
    """Device, process group (NCCL or gloo, FileStore rendezvous) and the gloo control group; (device, ctrl, sync)."""
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    cuda = opts.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    store = dist.FileStore(store_path, opts.world)  # type: ignore[attr-defined]
    timeout = timedelta(seconds=opts.timeout_s)
    kw: dict[str, Any] = {"device_id": device} if cuda else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=opts.world, timeout=timeout, **kw)
    ctrl = dist.new_group(backend="gloo", timeout=timeout) if cuda else dist.new_group(backend="gloo")
    meta.update({"backend": backend, "device": str(device), "pid": os.getpid(), "torch": torch.__version__})
    if cuda:
        meta["device_name"] = torch.cuda.get_device_name(device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    return device, ctrl, sync


def _build_loop(rank: int, opts: Any, device: Any, sync: Callable[[], None], meta: dict[str, Any]) -> tuple[Any, Any, Any, float]:
    """The workload, warmed up (faults off): (serving loop, delay injector, delay rank to enable, warm-up step s)."""
    from tracekit.workloads.moe import TPMoEModel
    from tracekit.workloads.serving import DelayInjector, ServingLoop

    mcfg, scfg = _model_cfg(opts), _serve_cfg(opts)
    t_init = time.perf_counter()
    model = TPMoEModel(mcfg, rank, opts.world, device)
    delay = DelayInjector(rank, opts.delay_rank, opts.delay_ms, opts.delay_every)
    enabled_delay = delay.delay_rank
    delay.delay_rank = None  # no faults during warm-up
    loop = ServingLoop(model, scfg, delay)
    meta.update({"model": mcfg.to_json(), "serve": scfg.to_json(), "grouped_mm": bool(model.use_grouped_mm)})
    t_warm = time.perf_counter()
    for i in range(opts.warmup_steps):
        if i == opts.warmup_steps // 2:  # the later half of the warm-up is the steady step time
            sync()
            t_warm = time.perf_counter()
        loop.step()
    sync()
    warm_step_s = (time.perf_counter() - t_warm) / max(1, opts.warmup_steps - opts.warmup_steps // 2)
    if scfg.cuda_graphs:
        meta["cuda_graphs"] = loop.capture_graphs()
    sync()
    meta["init_s"] = time.perf_counter() - t_init
    loop.step_index = 0
    return loop, delay, enabled_delay, warm_step_s


def _make_windows(rank: int, opts: Any, run: Path, ctrl: Any, sync: Callable[[], None], warm_step_s: float,
                  meta: dict[str, Any]) -> tuple[Any, Any]:
    """The profiler windows: an explicit step schedule (``--profile-steps``), or windows by time that rank 0
    decides (:class:`~tracekit.capture.profiler.AutoWindows`, returned on rank 0, else None)."""
    import torch.distributed as dist

    from tracekit.capture.profiler import (AUTO_SHARE, AUTO_WINDOW_S, AutoWindows, ProfilerWindows, WindowSchedule,
                                           auto_prelude, torch_profiler_factory)

    auto = None
    if opts.profile_steps is None:
        first = auto_prelude(warm_step_s) if opts.unprofiled_steps is None else opts.unprofiled_steps
        auto = AutoWindows(first, max_windows=opts.max_windows) if rank == 0 else None
        meta["schedule"] = {"mode": "auto", "first": first, "window_s": AUTO_WINDOW_S, "share": AUTO_SHARE,
                            "warmup_step_s": warm_step_s}
    windows = ProfilerWindows(
        WindowSchedule(80 if opts.unprofiled_steps is None else opts.unprofiled_steps, opts.profile_steps or 0,
                       opts.profile_every or opts.profile_steps or 1, opts.max_windows),
        run, rank, torch_profiler_factory(cuda=opts.device == "cuda", record_shapes=opts.record_shapes),
        barrier=lambda: dist.barrier(group=ctrl), sync=sync)
    return windows, auto


def _measured_loop(rank: int, opts: Any, loop: Any, windows: Any, control: Any, queue: Any, out: dict[str, Any]) -> tuple[int, str]:
    """Steps until the ranks agree to stop (or a collective fails); closes the open window. (steps, stop reason)."""
    step, last_report, stop_reason = 0, 0.0, "duration"
    try:
        while True:
            why = control(step)
            if why is not None:
                stop_reason = why
                break
            if opts.crash_rank == rank and step == opts.crash_step:
                os._exit(3)  # testing: a rank dies without saying goodbye
            windows.before_step(step)
            loop.step()
            windows.after_step(step)
            step += 1
            if rank == 0 and time.perf_counter() - last_report > 0.25:
                last_report = time.perf_counter()
                queue.put(("progress", (time.time_ns() - control.t0) / 1e9, step, loop.tokens_done))
    except Exception as e:  # noqa: BLE001 - a peer died or a collective failed: keep what we have
        stop_reason = "error"
        out["errors"].append(f"{type(e).__name__}: {e}")
    finally:
        try:
            windows.close()
        except Exception as e:  # noqa: BLE001
            out["errors"].append(f"profiler stop/export: {type(e).__name__}: {e}")
    return step, stop_reason


def _run(rank: int, opts: Any, run: Path, store_path: str, stop_event: Any, queue: Any, out: dict[str, Any]) -> None:
    import torch.distributed as dist

    from tracekit.capture.instrument import StepRecorder, instrument_forward
    from tracekit.capture.telemetry import TelemetrySampler

    meta = out["meta"]
    device, ctrl, sync = _init_dist(rank, opts, store_path, meta)
    loop, delay, enabled_delay, warm_step_s = _build_loop(rank, opts, device, sync, meta)
    recorder = StepRecorder(rank=rank)
    windows, auto = _make_windows(rank, opts, run, ctrl, sync, warm_step_s, meta)
    recorder.profiled = lambda: windows.recording
    if opts.profiling:
        # the first profiler start initialises Kineto/CUPTI (seconds): pay it before the measured loop
        warm = windows.factory()
        warm.start()
        loop.step()
        sync()
        warm.stop()
    loop.step_index = 0
    loop.tokens_done = 0
    delay.delay_rank = enabled_delay
    loop.forward = instrument_forward(loop.forward, recorder, lambda a, k: (a[1], a[2], int(a[0].numel())))
    sampler = None
    if opts.device == "cuda" and opts.telemetry:
        sampler = TelemetrySampler(rank, device.index or 0, period_s=opts.telemetry_period_s, log=lambda m: queue.put(("log", m)))
        sampler.start()
        meta["telemetry"] = sampler.available
        meta.update(dict(sampler.info.items()))
    dist.barrier(group=ctrl)
    control = _Control(rank, opts, windows, ctrl, stop_event, auto)
    meta["loop_start_ns"] = control.t0
    if rank == 0:
        queue.put(("ready", control.t0, meta.get("init_s")))
    try:
        step, stop_reason = _measured_loop(rank, opts, loop, windows, control, queue, out)
    finally:
        if sampler is not None:
            sampler.stop()
    meta.update({"loop_end_ns": time.time_ns(), "stop_reason": stop_reason, "steps": step, "tokens": loop.tokens_done,
                 "profiler_windows": windows.windows, "export_s": windows.export_s, "files": [p.name for p in windows.files]})
    out["steps"] = recorder.to_rows()
    out["counters"] = sampler.to_rows() if sampler is not None else {}
    out["markers"] = [{"step_id": s, "ts_ns": ts, "delay_ns": d} for (s, ts, d) in delay.events]
    _write_extra(run, rank, out)  # before teardown: NCCL teardown after graph capture can hang
    out["written"] = True
    if stop_reason != "error":
        try:
            dist.barrier(group=ctrl)
            if not loop.cfg.cuda_graphs:
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
