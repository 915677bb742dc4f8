"""``tracekit capture -- PROGRAM ...``: profile any PyTorch / torchrun program.

The program runs with ``TRACEKIT_CAPTURE_DIR`` set and ``tracekit/capture/_boot``
first on ``PYTHONPATH``; its ``sitecustomize`` starts a torch profiler in each
Python process (each torchrun worker, identified by ``RANK``) and exports one
Kineto JSON per rank at exit. After ``duration_s`` the program's process group
gets SIGINT (then SIGTERM, then SIGKILL); the files are converted into one
``trace.parquet``. Programs that want step records use
:mod:`tracekit.capture.instrument` themselves.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Sequence

from tracekit._errors import CaptureError, QualityLog

__all__ = ["run_external"]

_BOOT = Path(__file__).with_name("_boot")


def run_external(
    cmd: Sequence[str], out: Path, *, duration_s: float, force: bool = False, keep_raw: Path | None = None
) -> Path:
    """Run ``cmd`` for at most ``duration_s`` under the profiler and write ``out``."""
    out = Path(out)
    if out.exists() and not force:
        raise CaptureError(f"{out}: exists; pass --force to overwrite or -o another path")
    run_dir = Path(tempfile.mkdtemp(prefix="tracekit-ext-"))
    env = dict(os.environ)
    env["TRACEKIT_CAPTURE_DIR"] = str(run_dir)
    env["PYTHONPATH"] = os.pathsep.join([str(_BOOT)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    quality = QualityLog()
    t0 = time.time_ns()
    try:
        proc = subprocess.Popen(list(cmd), env=env, start_new_session=True)
    except OSError as e:
        raise CaptureError(f"{cmd[0]}: cannot start ({e}); check the command after --") from None
    try:
        try:
            rc = proc.wait(timeout=duration_s)
        except subprocess.TimeoutExpired:
            rc = None
            for sig, wait_s in ((signal.SIGINT, 60), (signal.SIGTERM, 20), (signal.SIGKILL, 5)):
                try:
                    os.killpg(proc.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            quality.add("capture_program_stopped", f"program stopped after {duration_s:g}s", severity="info")
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGINT)
            proc.wait(timeout=60)
            rc = None
        if rc not in (0, None):
            quality.add("capture_program_failed", f"{cmd[0]} exited with code {rc}")
        files = sorted(run_dir.glob("rank*.win*.trace.json.gz"))
        if not files:
            raise CaptureError(
                f"{' '.join(cmd)}: no profiler output; is it a Python program that imports torch? (exit code {rc})"
            )
        from tracekit.ingest.convert import convert

        meta = {
            "capture": {"target": "program", "command": list(cmd), "window_ns": [t0, time.time_ns()], "duration_s": duration_s},
            "quality": [q.to_json() for q in quality],
        }
        convert(files, out, force=force, metadata=meta)
    finally:
        if keep_raw is not None:
            keep_raw.mkdir(parents=True, exist_ok=True)
            for f in run_dir.glob("rank*"):
                shutil.copy2(f, keep_raw / f.name)
        shutil.rmtree(run_dir, ignore_errors=True)
    return out
