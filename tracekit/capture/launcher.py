"""``tracekit launch -- python -m sglang.launch_server ...``: run a server with tracekit's forward hook.

The child gets ``TRACEKIT_SGLANG_HOOK=1``, ``TRACEKIT_STEP_DIR`` and a bootstrap directory first on
``PYTHONPATH`` whose ``sitecustomize.py`` installs the import hook (:mod:`sglang_autopatch`). So
every spawned scheduler rank hooks ``ModelRunner.forward`` — through SGLang's plugin system when
tracekit is installed in the server's environment (>= 0.5.11; the two installs do not double
count), through the import hook otherwise. Optionally, once the server answers, capture it with
:func:`tracekit.capture.sglang_client.capture_sglang` (step records merged in).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from tracekit import _env
from tracekit._errors import CaptureError, UsageError

__all__ = ["LaunchResult", "hook_env", "server_url_from_args", "wait_until_ready", "launch"]


@dataclass
class LaunchResult:
    returncode: int | None
    step_dir: Path
    capture: Any = None
    notes: list[str] = field(default_factory=list)


def hook_env(step_dir: Path, bootstrap_dir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """The child's environment: hook gate, step dir, bootstrap dir first on PYTHONPATH."""
    env = _env.environ() if base is None else dict(base)
    env[_env.SGLANG_HOOK] = "1"
    env[_env.STEP_DIR] = str(step_dir)
    rest = env.get(_env.PYTHONPATH, "")
    env[_env.PYTHONPATH] = str(bootstrap_dir) + (os.pathsep + rest if rest else "")
    return env


def server_url_from_args(argv: Sequence[str]) -> str:
    """``http://HOST:PORT`` from ``--host``/``--port`` in a launch_server command (SGLang defaults 127.0.0.1:30000)."""
    host, port = "127.0.0.1", "30000"
    it = list(argv)
    for i, a in enumerate(it):
        for flag in ("--host", "--port"):
            val = None
            if a == flag and i + 1 < len(it):
                val = it[i + 1]
            elif a.startswith(flag + "="):
                val = a.split("=", 1)[1]
            if val is not None:
                if flag == "--host":
                    host = val
                else:
                    port = val
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def wait_until_ready(url: str, proc: subprocess.Popen[Any] | None, timeout_s: float,
                     say: Callable[[str], None], poll_s: float = 1.0) -> None:
    """Poll until the server identifies itself (``detect_server``); CaptureError if the child exits first."""
    from tracekit.capture.sglang_client import detect_server

    t_end = time.monotonic() + timeout_s
    said = False
    while time.monotonic() < t_end:
        if proc is not None and proc.poll() is not None:
            raise CaptureError(f"the launched server exited with code {proc.returncode} before answering at {url}; see its log above")
        if detect_server(url, timeout_s=2.0):
            return
        if not said:
            say(f"waiting for the server at {url} ...")
            said = True
        time.sleep(poll_s)
    raise CaptureError(f"the launched server did not answer at {url} within {timeout_s:g}s; raise --ready-timeout")


def launch(cmd: Sequence[str], *, step_dir: str | Path | None = None, capture_duration_s: float | None = None,
           out: str | Path = "trace.parquet", exit_after_capture: bool = False, ready_timeout_s: float = 1800.0,
           capture_kwargs: dict[str, Any] | None = None, say: Callable[[str], None] | None = None) -> LaunchResult:
    """Run ``cmd`` with the hook installed; optionally capture it; return when the child exits.

    With ``exit_after_capture`` the server is terminated (SIGINT, then SIGTERM) after the capture.
    Ctrl-C is passed to the child, which shuts down; the step records stay in ``step_dir``.
    """
    if not cmd:
        raise UsageError("give the server command after --, e.g. tracekit launch -- python -m sglang.launch_server --model-path M")
    say = say or (lambda m: print(f"tracekit: {m}", file=sys.stderr, flush=True))
    sd = Path(step_dir) if step_dir is not None else Path(tempfile.mkdtemp(prefix="tracekit-steps-"))
    sd.mkdir(parents=True, exist_ok=True)
    from tracekit.capture.sglang_autopatch import write_bootstrap

    boot = write_bootstrap(Path(tempfile.mkdtemp(prefix="tracekit-boot-")))
    env = hook_env(sd.resolve(), boot)
    res = LaunchResult(returncode=None, step_dir=sd)
    say(f"launching with tracekit's forward hook; step records -> {sd}")
    try:
        proc = subprocess.Popen(list(cmd), env=env)
    except OSError as e:
        raise CaptureError(f"cannot start {cmd[0]!r}: {e}") from None
    try:
        if capture_duration_s is not None:
            url = server_url_from_args(cmd)
            wait_until_ready(url, proc, ready_timeout_s, say)
            from tracekit.capture.sglang_client import capture_sglang

            res.capture = capture_sglang(url, capture_duration_s, out, step_dir=sd, **(capture_kwargs or {}))
            say(f"wrote {', '.join(str(lv.out) for lv in res.capture.levels)}")
            if exit_after_capture:
                _terminate(proc)
        res.returncode = proc.wait()
    except KeyboardInterrupt:
        _terminate(proc)
        res.returncode = proc.returncode
        raise
    except BaseException:
        _terminate(proc)
        raise
    return res


def _terminate(proc: subprocess.Popen[Any], grace_s: float = 30.0) -> None:
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0)):
        try:
            proc.send_signal(sig)
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            return
    proc.kill()
    proc.wait()
