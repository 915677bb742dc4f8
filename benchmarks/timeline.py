"""Timeline HTML + Perfetto export benchmark on a synthetic multi-rank capture.

Builds a schema-conformant frame directly with polars/numpy (no converter):
``--kernels`` GPU kernels spread over ``--ranks`` ranks and ``--seconds`` of
capture, with steps, NVTX-like ranges, collectives (pg_name/coll_seq) and
100 Hz power / SM-active / PCIe counters. Then it measures

* Python: payload build + HTML write time, HTML size;
* headless Chromium (Debian ``chromium``): wall time to a finished first render
  (process start → status written), the in-page render time (navigation start →
  plot done, includes parsing the inlined plotly.js), and programmatic zoom steps
  (``Plotly.relayout`` + a WebGL flush) on the detail and overview axes;
* the Perfetto export: time and size.

Usage::

    python benchmarks/timeline.py                       # 1M kernels, 8 ranks, 30 s
    python benchmarks/timeline.py --kernels 100000 --window 0s:30s   # force folding of the whole capture

Prints one line per figure and a JSON summary at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

CHROMIUM = os.environ.get("TRACEKIT_CHROMIUM", "/usr/bin/chromium")
CHROME_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--no-first-run", "--mute-audio",
                "--disable-extensions", "--hide-scrollbars"]

_PATTERN = ["attention", "dense_gemm", "moe_routing", "moe_gemm", "moe_gemm", "other_compute", "communication",
            "dense_gemm", "moe_gemm", "communication"]
_NAMES = {
    "attention": ["flash_fwd_splitkv_kernel", "flashinfer::BatchDecodeWithPagedKVCacheKernel"],
    "dense_gemm": ["sm90_xmma_gemm_bf16bf16_bf16f32", "cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm>"],
    "moe_routing": ["moe_align_block_size_kernel", "topkGatingSoftmax"],
    "moe_gemm": ["fused_moe_kernel", "fused_moe_kernel_gptq_awq"],
    "other_compute": ["rms_norm_kernel", "act_and_mul_kernel"],
    "communication": ["cross_device_reduce_1stage", "ncclDevKernel_AllReduce_Sum_bf16_RING_LL"],
}


def synthetic_trace(kernels: int = 1_000_000, ranks: int = 8, seconds: float = 30.0, *, seed: int = 0,
                    step_ms: float = 30.0, counters_hz: float = 100.0) -> pl.DataFrame:
    """A conformed trace frame (see module docstring); vectorized, ~1 s per 1M kernels."""
    from tracekit.schema import conform

    rng = np.random.default_rng(seed)
    base = 1_700_000_000_000_000_000
    n_steps = max(1, int(seconds * 1000 / step_ms))
    per_rank = kernels // ranks
    per_step = max(1, per_rank // n_steps)
    frames = []
    step_ns = int(step_ms * 1e6)
    busy_ns = step_ns * 0.85
    for r in range(ranks):
        n = per_step * n_steps
        step_of = np.repeat(np.arange(n_steps), per_step)
        pos = np.tile(np.arange(per_step), n_steps)
        cat_i = pos % len(_PATTERN)
        dur = rng.lognormal(0.0, 0.6, n)
        # scale so each step's kernels fill ~85% of the step
        dur = dur / dur.reshape(n_steps, per_step).sum(1).repeat(per_step) * busy_ns
        dur = dur.astype(np.int64)
        gap = rng.exponential(300.0, n).astype(np.int64)
        step_start = base + step_of.astype(np.int64) * step_ns + rng.integers(0, 200_000, n_steps)[step_of]
        adv = (dur + gap).reshape(n_steps, per_step)
        rel = (np.cumsum(adv, axis=1) - adv).ravel()
        ts = step_start + rel
        cats = np.array(_PATTERN)[cat_i]
        variant = rng.integers(0, 2, n)
        names = np.array([_NAMES[c][v] for c, v in zip(_PATTERN, [0] * len(_PATTERN))])[cat_i]
        alt = np.array([_NAMES[c][1] for c in _PATTERN])[cat_i]
        names = np.where(variant == 1, alt, names)
        # a hostile kernel name in every 10th step (the XSS checks look for it in the page)
        names = np.where((pos == 5) & (step_of % 10 == 0), "<img src=x onerror=alert(1)>", names)
        is_comm = cats == "communication"
        coll_seq = np.where(is_comm, np.cumsum(is_comm) - 1, -1)
        k = pl.DataFrame({
            "rank": np.full(n, r, np.int32), "kind": "kernel", "ts_ns": ts, "dur_ns": dur,
            "device": np.full(n, r, np.int32), "stream": np.full(n, 7, np.int64), "name": names,
            "category": cats, "step_id": step_of.astype(np.int64),
            "grid_x": rng.integers(1, 1024, n).astype(np.int32), "grid_y": np.ones(n, np.int32),
            "grid_z": np.ones(n, np.int32), "block_x": np.full(n, 256, np.int32), "block_y": np.ones(n, np.int32),
            "block_z": np.ones(n, np.int32), "registers_per_thread": rng.integers(32, 255, n).astype(np.int32),
        }).with_columns(
            pl.when(pl.col("category") == "communication").then(pl.lit("0")).alias("pg_name"),
            pl.Series("coll_seq", coll_seq).replace(-1, None),
        )
        st = pl.DataFrame({
            "rank": np.full(n_steps, r, np.int32), "kind": "step",
            "ts_ns": (base + np.arange(n_steps) * step_ns).astype(np.int64),
            "dur_ns": np.full(n_steps, step_ns - 1000, np.int64), "name": "step[DECODE bs=64]",
            "step_id": np.arange(n_steps, dtype=np.int64), "step_mode": "DECODE",
            "batch_size": np.full(n_steps, 64, np.int32), "tokens": np.full(n_steps, 64, np.int64),
        })
        rg = pl.DataFrame({
            "rank": np.full(n_steps, r, np.int32), "kind": "range",
            "ts_ns": (base + np.arange(n_steps) * step_ns + 10_000).astype(np.int64),
            "dur_ns": np.full(n_steps, int(step_ns * 0.8), np.int64), "name": "forward_batch",
        })
        nc = int(seconds * counters_hz)
        t_c = (base + np.arange(nc) * int(1e9 / counters_hz)).astype(np.int64)
        ctr = []
        for nm, val in (("power_w", 400 + 200 * rng.random(nc)), ("sm_active_pct", 60 + 30 * rng.random(nc)),
                        ("pcie_rx_bytes_per_s", 2e9 * rng.random(nc)), ("pcie_tx_bytes_per_s", 1e9 * rng.random(nc))):
            ctr.append(pl.DataFrame({"rank": np.full(nc, r, np.int32), "kind": "counter", "ts_ns": t_c,
                                     "dur_ns": np.zeros(nc, np.int64), "name": nm, "value": val}))
        frames += [k, st, rg, *ctr]
    return conform(pl.concat(frames, how="diagonal_relaxed")).sort(["rank", "ts_ns"])


def run_chromium(html: Path, *, hash_: str = "", budget_ms: int = 60_000, screenshot: Path | None = None,
                 timeout_s: float = 300.0) -> tuple[dict, float, str]:
    """Load ``html`` in headless Chromium; returns (status dict from #tk-status, wall seconds, stderr tail)."""
    ud = tempfile.mkdtemp(prefix="tk-chrome-")
    try:
        cmd = [CHROMIUM, *CHROME_FLAGS, f"--user-data-dir={ud}", f"--virtual-time-budget={budget_ms}",
               "--window-size=1400,2400"]
        cmd += [f"--screenshot={screenshot}"] if screenshot else ["--dump-dom"]
        cmd.append(html.resolve().as_uri() + (("#" + hash_) if hash_ else ""))
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
        wall = time.perf_counter() - t
        status: dict = {}
        out = p.stdout
        a = out.find('<pre id="tk-status">')
        if a >= 0:
            b = out.find("</pre>", a)
            raw = out[a + len('<pre id="tk-status">'):b]
            import html as _h

            try:
                status = json.loads(_h.unescape(raw)) if raw.strip() else {}
            except ValueError:
                status = {"unparsed": raw[:500]}
        return status, wall, p.stderr[-2000:]
    finally:
        shutil.rmtree(ud, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kernels", type=int, default=1_000_000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--window", default=None, help="detail window, e.g. 10s:10.5s (default: automatic)")
    ap.add_argument("--out", default=None, help="keep outputs in this directory")
    ap.add_argument("--no-browser", action="store_true")
    ap.add_argument("--no-perfetto", action="store_true")
    args = ap.parse_args(argv)

    from tracekit.report.timeline_html import build_html, build_payload

    outdir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tk-bench-"))
    outdir.mkdir(parents=True, exist_ok=True)
    res: dict = {"kernels": args.kernels, "ranks": args.ranks, "seconds": args.seconds}
    t = time.perf_counter()
    df = synthetic_trace(args.kernels, args.ranks, args.seconds)
    res["frame_s"] = round(time.perf_counter() - t, 2)
    res["rows"] = df.height
    print(f"synthetic frame: {df.height:,} rows ({args.kernels:,} kernels, {args.ranks} ranks, {args.seconds} s) "
          f"in {res['frame_s']} s")
    t = time.perf_counter()
    payload = build_payload(df, {}, None, window=args.window)
    res["payload_s"] = round(time.perf_counter() - t, 2)
    t = time.perf_counter()
    html = build_html(payload, {}, None, title="benchmark")
    path = outdir / "timeline.html"
    path.write_text(html, encoding="utf-8")
    res["html_write_s"] = round(time.perf_counter() - t, 2)
    res["html_mb"] = round(path.stat().st_size / 1e6, 2)
    det = payload["detail"]
    res["detail_ops"] = det["kernels"]["n"]
    res["folded_ops"] = det["folded"]["n_ops"] if det.get("folded") else 0
    res["window"] = det["reason"]
    print(f"timeline HTML: {res['html_mb']} MB; payload {res['payload_s']} s + html {res['html_write_s']} s; "
          f"detail {res['detail_ops']:,} ops drawn, {res['folded_ops']:,} folded ({det['reason']})")
    if not args.no_browser:
        if not Path(CHROMIUM).exists():
            print(f"chromium not found at {CHROMIUM}; skipping browser figures")
        else:
            st, wall, err = run_chromium(path, hash_="bench")
            res["browser_wall_s"] = round(wall, 2)
            res["render_ms"] = round(st.get("render_ms", -1), 1)
            for key in ("zoom_ms", "zoom_overview_ms"):
                steps = st.get(key, [])
                res[key] = [round(a, 1) for a, _b in steps]  # relayout (what plotly does)
                res[key.replace("_ms", "_raster_ms")] = [round(b, 1) for _a, b in steps]  # + WebGL raster done
            res["js_errors"] = st.get("errors", ["no status (page did not finish)"])
            res["segments"] = st.get("segments")
            print(f"chromium: first render {res['render_ms']} ms after navigation start (process wall incl. "
                  f"startup and zoom bench {res['browser_wall_s']} s); segments {res['segments']}")
            for key, what in (("zoom", "detail"), ("zoom_overview", "overview")):
                a, b = res[key + "_ms"], res[key + "_raster_ms"]
                print(f"zoom steps {what}: relayout ms {a} (max {max(a or [0]):.1f}); "
                      f"incl. software-GL raster ms {b} (max {max(b or [0]):.1f})")
            if res["js_errors"]:
                print("JS errors:", res["js_errors"], err[-500:])
    if not args.no_perfetto:
        from tracekit.report.perfetto import export_perfetto

        t = time.perf_counter()
        pout = outdir / "trace.json.gz"
        info = export_perfetto(df, {}, pout, force=True)
        res["perfetto_s"] = round(time.perf_counter() - t, 2)
        res["perfetto_mb"] = round(pout.stat().st_size / 1e6, 2)
        res["perfetto_events"] = info.get("events")
        print(f"perfetto export: {res['perfetto_mb']} MB gz, {res['perfetto_events']:,} events in {res['perfetto_s']} s")
    res["loadavg_1m"] = round(os.getloadavg()[0], 2)
    res["cpus"] = os.cpu_count()
    print(f"machine: {res['cpus']} CPUs, 1-min load average {res['loadavg_1m']} at the end of the run")
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
