"""Shared frames and a headless-Chromium helper for the timeline / Perfetto tests."""

from __future__ import annotations

import base64
import hashlib
import html as _html
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import Any


XSS = "<img src=x onerror=alert(1)>"
BASE = 1_700_000_000_000_000_000
US = 1_000
MS = 1_000_000
CHROMIUM = os.environ.get("TRACEKIT_CHROMIUM", "/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--mute-audio", "--disable-extensions",
         "--hide-scrollbars"]


def k(rank: int, stream: int, t_us: float, d_us: float, name: str, cat: str, **kw: Any) -> dict[str, Any]:
    return {"rank": rank, "kind": "kernel", "ts_ns": BASE + int(t_us * US), "dur_ns": int(d_us * US), "device": rank,
            "stream": stream, "name": name, "category": cat, **kw}


def small_rows() -> list[dict[str, Any]]:
    """2 ranks × 2 streams over 10 ms: 3 steps, nested ranges, a collective per step, counters."""
    rows: list[dict[str, Any]] = []
    for r in (0, 1):
        for s in range(3):
            t0 = s * 3000.0
            rows.append({"rank": r, "kind": "step", "ts_ns": BASE + int(t0 * US), "dur_ns": 2900 * US,
                         "name": "step[DECODE bs=8]", "step_id": s, "step_mode": "DECODE", "batch_size": 8, "tokens": 8})
            rows.append({"rank": r, "kind": "range", "ts_ns": BASE + int((t0 + 10) * US), "dur_ns": 2800 * US,
                         "name": "forward"})
            rows.append({"rank": r, "kind": "range", "ts_ns": BASE + int((t0 + 20) * US), "dur_ns": 500 * US,
                         "name": "moe_layer"})
            rows.append(k(r, 7, t0 + 20, 400, "fused_moe_kernel", "moe_gemm", step_id=s, grid_x=132, grid_y=1,
                          grid_z=1, block_x=256, block_y=1, block_z=1, registers_per_thread=128))
            rows.append(k(r, 7, t0 + 500, 300, "flash_fwd_kernel", "attention", step_id=s))
            rows.append(k(r, 7, t0 + 900, 100, XSS if (r == 0 and s == 1) else "rms_norm_kernel", "other_compute",
                          step_id=s))
            # collective: rank 1 arrives 200 µs late; both end together
            arrive = t0 + 1100 + (200 if r == 1 else 0)
            rows.append(k(r, 7, arrive, 1500 - (arrive - t0 - 1100), "ncclDevKernel_AllReduce_Sum_bf16_RING_LL",
                          "communication", step_id=s, pg_name="0", coll_seq=s, coll_name="allreduce"))
            rows.append({**k(r, 20, t0 + 100, 50, "Memcpy HtoD (Pageable -> Device)", "memory", step_id=s),
                         "kind": "memcpy", "bytes": 1 << 20, "memcpy_kind": "HtoD"})
        for i in range(10):
            rows.append({"rank": r, "kind": "counter", "ts_ns": BASE + i * MS, "dur_ns": 0, "name": "power_w",
                         "value": 300.0 + 10 * i + r})
            rows.append({"rank": r, "kind": "counter", "ts_ns": BASE + i * MS, "dur_ns": 0,
                         "name": "pcie_rx_bytes_per_s", "value": 2e9 * (i % 3)})
    return rows


def analysis_for(df) -> dict[str, Any]:
    """A hand-written analysis dict in the shape tracekit.api.analyze returns (subset)."""
    return {
        "ranks": [{"rank": 0, "window_ns": 10 * MS, "time_ns": {"moe_gemm": 1_200_000, "communication": 4_500_000,
                                                                 "idle": 4_300_000}},
                  {"rank": 1, "window_ns": [BASE, BASE + 10 * MS], "time_ns": {"moe_gemm": 1_200_000, "idle": 8_800_000}}],
        "findings": ["Rank 1 arrives late at every allreduce " + XSS, {"message": "PCIe-bound <b>phase</b>"}],
        "stalls": [{"waiting_rank": 0, "late_rank": 1, "wait_ns": 200 * US, "ts_ns": BASE + 4100 * US,
                    "cause": "host_sync", "detail": XSS, "pg": "0", "seq": 1}],
        "pcie_phases": [{"rank": 1, "start_ns": BASE + 6000 * US, "end_ns": BASE + 6500 * US, "direction": "rx"}],
        "top_kernels": {"communication": [{"name": XSS, "count": 3, "total_ns": 4_000_000, "mean_ns": 1_333_333}]},
        "quality": [{"code": "test_flag", "message": "a <quality> note"}],
    }


def have_chromium() -> bool:
    return Path(CHROMIUM).exists()


def artifacts_dir(tmp_path: Path) -> Path:
    d = os.environ.get("TRACEKIT_ARTIFACTS")
    if d:
        p = Path(d)
        p.mkdir(parents=True, exist_ok=True)
        return p
    return tmp_path


def chromium(args: list[str], url: str, *, timeout_s: float = 150.0, tries: int = 2) -> str:
    """Headless Chromium's stdout for ``url`` with ``args`` (after the common flags and a fresh profile).

    A run that hangs (headless Chromium's screenshot can stall on a loaded machine: a CI run saw one not finish in
    240 s where the same page alone takes seconds) is killed with its whole process group and run once more from a
    fresh profile; a second hang fails the test."""
    for attempt in range(tries):
        ud = tempfile.mkdtemp(prefix="tk-test-chrome-")
        cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={ud}", *args, url]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            return p.communicate(timeout=timeout_s)[0]
        except subprocess.TimeoutExpired:
            if attempt == tries - 1:
                raise
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
            shutil.rmtree(ud, ignore_errors=True)
    raise AssertionError("unreachable")


def run_page(html_path: Path, *, hash_: str = "", screenshot: Path | None = None, budget_ms: int = 30_000,
             timeout_s: float = 150.0) -> str:
    """Load a page in headless Chromium; returns the dumped DOM (or '' for a screenshot run)."""
    args = [f"--virtual-time-budget={budget_ms}", "--window-size=1400,1800"]
    args += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
    return chromium(args, html_path.resolve().as_uri() + ("#" + hash_ if hash_ else ""), timeout_s=timeout_s)


def pre_json(dom: str, elem_id: str) -> dict[str, Any]:
    m = re.search(rf'<pre id="{elem_id}">(.*?)</pre>', dom, re.S)
    assert m, f"no #{elem_id} in the dumped DOM (page script did not run?)"
    raw = _html.unescape(m.group(1)).strip()
    assert raw, f"#{elem_id} is empty: the page never finished"
    return json.loads(raw)


def sha256_csp(script: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(script.encode()).digest()).decode() + "'"
