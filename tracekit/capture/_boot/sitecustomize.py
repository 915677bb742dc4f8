"""Loaded by ``tracekit capture -- PROGRAM`` through PYTHONPATH (nothing else imports it).

When ``TRACEKIT_CAPTURE_DIR`` is set, every Python process of the program
(each torchrun worker too, not the torchrun launcher) starts a torch profiler
with CPU + CUDA activities and CUDA sync events, and on exit (normal, Ctrl-C
or SIGTERM) exports ``rank{RANK}.win0.trace.json.gz`` into that directory.
A sitecustomize already on the path is chained (imported after this one).
"""

import os
import sys


def _tk_boot() -> None:
    out = os.environ.get("TRACEKIT_CAPTURE_DIR")
    if not out:
        return
    argv = " ".join(getattr(sys, "orig_argv", sys.argv) or [])
    if "torch.distributed.run" in argv or "torchrun" in argv or "torch.distributed.launch" in argv:
        return  # the launcher itself does no GPU work
    try:
        import atexit
        import signal

        import torch
    except ImportError:
        return
    rank = int(os.environ.get("RANK", "0"))
    acts = [torch.profiler.ProfilerActivity.CPU]
    kw = {}
    if torch.cuda.is_available():
        acts.append(torch.profiler.ProfilerActivity.CUDA)
        try:
            kw["experimental_config"] = torch.profiler._ExperimentalConfig(enable_cuda_sync_events=True)
        except Exception:  # noqa: BLE001
            pass
    prof = torch.profiler.profile(activities=acts, **kw)
    prof.start()
    done = []

    def finish(*_a: object) -> None:
        if done:
            return
        done.append(1)
        try:
            if torch.cuda.is_available() and torch.cuda.is_initialized():
                torch.cuda.synchronize()
            prof.stop()
            final = os.path.join(out, f"rank{rank}.win0.trace.json.gz")
            part = os.path.join(out, f".rank{rank}.win0.part.json.gz")
            prof.export_chrome_trace(part)
            os.replace(part, final)
        except Exception as e:  # noqa: BLE001
            print(f"tracekit: rank {rank}: profiler export failed: {e}", file=sys.stderr)

    def on_term(_s: int, _f: object) -> None:
        finish()
        os._exit(143)

    atexit.register(finish)
    signal.signal(signal.SIGTERM, on_term)


_tk_boot()
