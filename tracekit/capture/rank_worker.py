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
from typing import Any

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


def _agreed_schedule(opts: Any, step_s: float, ctrl: Any) -> Any:
    """The automatic window schedule from the slowest rank's warm-up step time (one MAX allreduce on the
    control group, so every rank computes the same schedule)."""
    import torch
    import torch.distributed as dist

    from tracekit.capture.profiler import auto_schedule

    t = torch.tensor([step_s], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=ctrl)
    return auto_schedule(float(t[0]), first=opts.unprofiled_steps, max_windows=opts.max_windows)


def _write_extra(run: Path, rank: int, out: dict[str, Any]) -> None:
    tmp = extra_file(run, rank).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, default=str))
    os.replace(tmp, extra_file(run, rank))


def _run(rank: int, opts: Any, run: Path, store_path: str, stop_event: Any, queue: Any, out: dict[str, Any]) -> None:
    import torch
    import torch.distributed as dist
    from datetime import timedelta

    from tracekit.capture.instrument import StepRecorder, instrument_forward
    from tracekit.capture.profiler import ProfilerWindows, WindowSchedule, torch_profiler_factory
    from tracekit.capture.telemetry import TelemetrySampler
    from tracekit.workloads.moe import TPMoEModel
    from tracekit.workloads.serving import DelayInjector, ServingLoop

    cuda = opts.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % max(1, torch.cuda.device_count()))
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        torch.set_num_threads(1)
        device = torch.device("cpu")
    backend = "nccl" if cuda else "gloo"
    store = dist.FileStore(store_path, opts.world)
    timeout = timedelta(seconds=opts.timeout_s)
    kw: dict[str, Any] = {"device_id": device} if cuda else {}
    dist.init_process_group(backend, store=store, rank=rank, world_size=opts.world, timeout=timeout, **kw)
    ctrl = dist.new_group(backend="gloo", timeout=timeout) if cuda else dist.new_group(backend="gloo")
    meta = out["meta"]
    meta.update({"backend": backend, "device": str(device), "pid": os.getpid(), "torch": torch.__version__})
    if cuda:
        meta["device_name"] = torch.cuda.get_device_name(device)

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    mcfg, scfg = _model_cfg(opts), _serve_cfg(opts)
    t_init = time.perf_counter()
    model = TPMoEModel(mcfg, rank, opts.world, device)
    delay = DelayInjector(rank, opts.delay_rank, opts.delay_ms, opts.delay_every)
    enabled_delay = delay.delay_rank
    delay.delay_rank = None  # no faults during warm-up
    loop = ServingLoop(model, scfg, delay)
    meta["model"] = mcfg.to_json()
    meta["serve"] = scfg.to_json()
    meta["grouped_mm"] = bool(model.use_grouped_mm)
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

    recorder = StepRecorder(rank=rank)
    auto = opts.profile_steps is None  # the schedule follows the step time, agreed on before the first step
    windows = ProfilerWindows(
        WindowSchedule(80 if opts.unprofiled_steps is None else opts.unprofiled_steps, 0 if auto else opts.profile_steps,
                       opts.profile_every or opts.profile_steps or 1, opts.max_windows),
        run,
        rank,
        torch_profiler_factory(cuda=cuda, record_shapes=opts.record_shapes),
        barrier=lambda: dist.barrier(group=ctrl),
        sync=sync,
    )
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
    if cuda and opts.telemetry:
        sampler = TelemetrySampler(rank, device.index or 0, period_s=opts.telemetry_period_s, log=lambda m: queue.put(("log", m)))
        sampler.start()
        meta["telemetry"] = sampler.available
        meta.update({k: v for k, v in sampler.info.items()})

    flag = torch.zeros(1, dtype=torch.int32)
    dist.barrier(group=ctrl)
    t0 = time.time_ns()
    meta["loop_start_ns"] = t0
    if rank == 0:
        queue.put(("ready", t0, meta.get("init_s")))
    step = 0
    last_report = 0.0
    stop_reason = "duration"
    try:
        while True:
            if step % max(1, opts.control_every) == 0:
                elapsed = (time.time_ns() - t0) / 1e9
                want = 0
                if _TERM or stop_event.is_set():
                    want = 2
                elif rank == 0 and elapsed >= opts.duration_s and step >= opts.min_steps:
                    want = 1
                flag[0] = want
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=ctrl)
                if int(flag[0]):
                    stop_reason = "interrupted" if int(flag[0]) == 2 else "duration"
                    break
            if opts.crash_rank == rank and step == opts.crash_step:
                os._exit(3)  # testing: a rank dies without saying goodbye
            if auto and step == 0:
                windows.schedule = _agreed_schedule(opts, warm_step_s, ctrl)
                meta["schedule"] = {"first": windows.schedule.first, "steps": windows.schedule.steps,
                                    "every": windows.schedule.every, "warmup_step_s": warm_step_s}
            windows.before_step(step)
            loop.step()
            windows.after_step(step)
            step += 1
            if rank == 0:
                now = time.perf_counter()
                if now - last_report > 0.25:
                    last_report = now
                    queue.put(("progress", (time.time_ns() - t0) / 1e9, step, loop.tokens_done))
    except Exception as e:  # noqa: BLE001 - a peer died or a collective failed: keep what we have
        stop_reason = "error"
        out["errors"].append(f"{type(e).__name__}: {e}")
    finally:
        try:
            windows.close()
        except Exception as e:  # noqa: BLE001
            out["errors"].append(f"profiler stop/export: {type(e).__name__}: {e}")
        if sampler is not None:
            sampler.stop()
    t1 = time.time_ns()
    meta.update(
        {
            "loop_end_ns": t1,
            "stop_reason": stop_reason,
            "steps": step,
            "tokens": loop.tokens_done,
            "profiler_windows": windows.windows,
            "export_s": windows.export_s,
            "files": [p.name for p in windows.files],
        }
    )
    out["steps"] = recorder.to_rows()
    out["counters"] = sampler.to_rows() if sampler is not None else {}
    out["markers"] = [
        {"step_id": s, "ts_ns": ts, "delay_ns": d} for (s, ts, d) in delay.events
    ]
    _write_extra(run, rank, out)  # before teardown: NCCL teardown after graph capture can hang
    out["written"] = True
    if stop_reason != "error":
        try:
            dist.barrier(group=ctrl)
            if not scfg.cuda_graphs:
                dist.destroy_process_group()
        except Exception:  # noqa: BLE001
            pass
