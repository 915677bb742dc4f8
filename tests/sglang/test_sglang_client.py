"""tracekit's SGLang client against a fake server that follows SGLang 0.5.23's profile contract."""

from __future__ import annotations

import gzip
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import polars as pl
import pytest

from tracekit._errors import CaptureError, OutputError
from tracekit.capture import sglang_client as sc
from tracekit.schema import frame_from_rows

from fake_server import FakeConfig, FakeSGLang  # tests/sglang is on sys.path (rootdir conftest mode)


@pytest.fixture
def converted(monkeypatch):
    """Record what would be converted; run the real converter when it exists."""
    calls = []
    real = sc._convert

    def fake(files, out, *, extra_frames, metadata, force):
        calls.append({"files": list(files), "out": out, "extra": extra_frames, "meta": metadata})
        try:
            import tracekit.ingest.convert  # noqa: F401
        except ImportError:
            Path(out).write_bytes(b"placeholder")
            return None
        return real(files, out, extra_frames=extra_frames, metadata=metadata, force=force)

    monkeypatch.setattr(sc, "_convert", fake)
    return calls


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _posts(fake, path):
    return [b for m, p, b in fake.requests if p == path]


# ------------------------------------------------------------------ detection, version gates, request


def test_detect_server():
    with FakeSGLang(FakeConfig()) as f:
        assert sc.detect_server(f.url) is True
    with FakeSGLang(FakeConfig(legacy_model_info=True)) as f:
        assert sc.detect_server(f.url) is True  # falls back to /get_model_info
    assert sc.detect_server(f"http://127.0.0.1:{_free_port()}") is False

    class NotSGLang(BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"hello": "world"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), NotSGLang)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        assert sc.detect_server(f"http://127.0.0.1:{srv.server_address[1]}") is False
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize(
    "version, profile_id, steps, plugins",
    [("0.5.23", True, True, True), ("0.5.16.post1", True, True, True), ("0.5.12", False, True, True),
     ("0.5.10", False, False, False), ("0.5.9rc1", False, False, False), (None, False, None, None)],
)
def test_capabilities(version, profile_id, steps, plugins):
    caps = sc.capabilities({"version": version} if version else {})
    assert (caps.profile_id, caps.step_spans, caps.plugins) == (profile_id, steps, plugins)
    codes = {q.code for q in caps.notes()}
    assert ("sglang_no_profile_id" in codes) is (not profile_id)
    assert ("sglang_no_step_spans" in codes) is (steps is False)


def test_profile_request_is_explicit():
    new = sc.build_profile_request("/x/run", caps=sc.capabilities({"version": "0.5.23"}), profile_id="tk-1",
                                   num_steps=5, start_step=3)
    assert new == {"output_dir": "/x/run", "activities": ["CPU", "GPU"], "with_stack": False, "record_shapes": False,
                   "num_steps": 5, "start_step": 3, "profile_id": "tk-1"}
    assert isinstance(new["num_steps"], int) and isinstance(new["start_step"], int)
    old = sc.build_profile_request("/x/run", caps=sc.capabilities({"version": "0.5.10"}), profile_id="tk-1",
                                   with_stack=True)
    assert "profile_id" not in old and old["with_stack"] is True and "num_steps" not in old


def test_rank_files_naming(tmp_path):
    for n in ["p-TP-0.trace.json.gz", "p-TP-1-DP-1.trace.json.gz", "pre-p-TP-2-PP-1-EP-2.trace.json.gz",
              "p-TP-3-DECODE.trace.json.gz", "merged-p.trace.json.gz", "p-TP-0-memory.pickle", "q-TP-5.trace.json.gz"]:
        (tmp_path / n).write_bytes(b"x")
    got = sc.rank_files(tmp_path, "p")
    assert {k: v.name for k, v in got.items()} == {
        (0, 0, 0): "p-TP-0.trace.json.gz", (1, 1, 0): "p-TP-1-DP-1.trace.json.gz",
        (2, 0, 1): "pre-p-TP-2-PP-1-EP-2.trace.json.gz", (3, 0, 0): "p-TP-3-DECODE.trace.json.gz"}
    assert (5, 0, 0) in sc.rank_files(tmp_path)


def test_wait_for_traces_waits_for_growth_and_names_missing_ranks(tmp_path):
    p0 = tmp_path / "id-TP-0.trace.json.gz"

    def writer():
        time.sleep(0.3)
        with open(p0, "wb") as f:
            for _ in range(4):
                f.write(b"x" * 1000)
                f.flush()
                time.sleep(0.2)

    th = threading.Thread(target=writer)
    th.start()
    t = time.monotonic()
    files = sc.wait_for_traces(tmp_path, expected={(0, 0)}, profile_id=None, timeout_s=10, stable_s=0.5, poll_s=0.05)
    th.join()
    assert files == [p0] and p0.stat().st_size == 4000  # did not return while it was growing
    assert time.monotonic() - t >= 0.3 + 0.6 + 0.5 - 0.1
    with pytest.raises(CaptureError, match=r"missing trace files for rank\(s\) TP-1, TP-2"):
        sc.wait_for_traces(tmp_path, expected={(0, 0), (1, 0), (2, 0)}, profile_id=None, timeout_s=0.3, poll_s=0.05)
    with pytest.raises(CaptureError, match="no SGLang trace files"):
        sc.wait_for_traces(tmp_path / "nothing", expected=None, profile_id=None, timeout_s=0.2, poll_s=0.05)
    # allow_missing: the complete files that arrived, after the full wait; still an error when none did
    t = time.monotonic()
    got = sc.wait_for_traces(tmp_path, expected={(0, 0), (1, 0), (2, 0)}, profile_id=None, timeout_s=0.3,
                             stable_s=0.1, poll_s=0.05, allow_missing=True)
    assert got == [p0] and time.monotonic() - t >= 0.3
    assert sc.missing_ranks(got, {(0, 0), (1, 0), (2, 0)}) == [(1, 0), (2, 0)]
    assert sc.missing_ranks(got, None) == []
    with pytest.raises(CaptureError, match="no SGLang trace files"):
        sc.wait_for_traces(tmp_path / "nothing", expected={(0, 0)}, profile_id=None, timeout_s=0.2, poll_s=0.05,
                           allow_missing=True)


# ------------------------------------------------------------------ whole captures


def test_capture_happy_path(tmp_path, converted):
    with FakeSGLang(FakeConfig(tp_size=2, rank_delays_s=(0.2, 0.8))) as f:
        res = sc.capture_sglang(f.url, 0.5, tmp_path / "trace.parquet", output_dir=tmp_path / "prof",
                                telemetry=False, progress=False, poll_timeout_s=30)
        starts, stops = _posts(f, "/start_profile"), _posts(f, "/stop_profile")
    assert len(starts) == 1 and len(stops) == 1
    body = starts[0]
    assert body["activities"] == ["CPU", "GPU"] and body["with_stack"] is False and body["record_shapes"] is False
    assert body["profile_id"].startswith("tracekit-") and Path(body["output_dir"]).parent == (tmp_path / "prof").resolve()
    lv = res.levels[0]
    assert [p.name for p in lv.files] == [f"{body['profile_id']}-TP-{r}.trace.json.gz" for r in range(2)]
    for r, p in enumerate(lv.files):  # complete files: the last one grew for ~0.8 s after stop returned
        assert json.loads(gzip.decompress(p.read_bytes()))["distributedInfo"]["rank"] == r
    meta = converted[0]["meta"]
    assert meta["sglang_server_info"]["tp_size"] == 2 and meta["capture"]["profile_request"] == body
    assert meta["capture"]["window_ns"][1] > meta["capture"]["window_ns"][0]
    assert (tmp_path / "trace.parquet").exists()


def test_capture_refuses_existing_output_before_touching_server(tmp_path):
    (tmp_path / "trace.parquet").write_bytes(b"old")
    with FakeSGLang() as f:
        with pytest.raises(OutputError, match="--force"):
            sc.capture_sglang(f.url, 0.2, tmp_path / "trace.parquet", progress=False)
        assert f.requests == []


def test_unreachable_server(tmp_path):
    with pytest.raises(CaptureError, match="cannot reach SGLang at http://127.0.0.1:"):
        sc.capture_sglang(f"http://127.0.0.1:{_free_port()}", 0.2, tmp_path / "t.parquet", progress=False)


def test_profile_already_running_is_reported_and_left_alone(tmp_path, converted):
    with FakeSGLang() as f:
        sc._http(f.url, "/start_profile", method="POST", body={"output_dir": str(tmp_path / "other")})
        with pytest.raises(CaptureError, match="already running"):
            sc.capture_sglang(f.url, 0.2, tmp_path / "t.parquet", output_dir=tmp_path, telemetry=False, progress=False)
        assert _posts(f, "/stop_profile") == []  # somebody else's profile is not stopped
    assert converted == []


def test_missing_rank_is_named_and_profile_still_stopped(tmp_path, converted):
    """A rank that never writes its file: the others are converted, flagged missing_ranks, and a warning is logged."""
    said = []
    with FakeSGLang(FakeConfig(tp_size=3, missing_ranks=(1,), rank_delays_s=(0.1,))) as f:
        t = time.monotonic()
        res = sc.capture_sglang(f.url, 0.3, tmp_path / "t.parquet", output_dir=tmp_path, telemetry=False,
                                progress=False, poll_timeout_s=3, log=said.append)
        assert time.monotonic() - t >= 3  # waited the full poll timeout for the missing rank
        assert len(_posts(f, "/stop_profile")) == 1
    assert len(converted) == 1
    assert [p.name.split("-TP-")[1] for p in converted[0]["files"]] == ["0.trace.json.gz", "2.trace.json.gz"]
    q = [x for x in converted[0]["meta"]["quality"] if x["code"] == "missing_ranks"]
    assert len(q) == 1 and q[0]["details"] == {"missing": [1], "missing_labels": ["TP-1"], "expected_ranks": 3}
    assert "TP-1 of 3" in q[0]["message"] and "within 3s" in q[0]["message"]
    assert [x.code for x in res.quality].count("missing_ranks") == 1
    warn = [m for m in said if m.startswith("warning: partial trace")]
    assert len(warn) == 1 and "TP-1" in warn[0] and "other 2 rank(s)" in warn[0]


def test_ctrl_c_still_stops_the_profile(tmp_path, monkeypatch, converted):
    """Ctrl-C while profiling: /stop_profile once, what the server recorded is converted and flagged
    (the CLI then exits 130 naming the kept trace), the load levels not started are not run."""
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sc, "_sleep_with_progress", interrupted)
    with FakeSGLang() as f:
        res = sc.capture_sglang(f.url, 30, tmp_path / "t.parquet", output_dir=tmp_path, telemetry=False, progress=False)
        assert len(_posts(f, "/start_profile")) == 1 and len(_posts(f, "/stop_profile")) == 1
    assert res.interrupted and len(res.levels) == 1 and len(converted) == 1
    assert "capture_interrupted" in [q["code"] for q in converted[0]["meta"]["quality"]]


def test_num_steps_server_stops_by_itself(tmp_path, converted):
    with FakeSGLang(FakeConfig(tp_size=2)) as f:
        res = sc.capture_sglang(f.url, 0, tmp_path / "t.parquet", num_steps=5, output_dir=tmp_path,
                                telemetry=False, progress=False, poll_timeout_s=30)
        assert _posts(f, "/start_profile")[0]["num_steps"] == 5
        assert _posts(f, "/stop_profile") == []  # nothing to stop: files came by themselves
    assert len(res.levels[0].files) == 2


def test_num_steps_on_idle_server_is_stopped_by_hand(tmp_path, converted):
    with FakeSGLang(FakeConfig(tp_size=1, idle_steps=False, rank_delays_s=(0.1,), chunk_gap_s=0.05)) as f:
        res = sc.capture_sglang(f.url, 0, tmp_path / "t.parquet", num_steps=5, output_dir=tmp_path,
                                telemetry=False, progress=False, poll_timeout_s=2.5)
        assert len(_posts(f, "/stop_profile")) == 1
    assert "sglang_steps_incomplete" in {q.code for q in res.quality}
    assert len(res.levels[0].files) == 1


def test_old_server_without_profile_id(tmp_path, converted):
    with FakeSGLang(FakeConfig(version="0.5.10", tp_size=2, legacy_model_info=True)) as f:
        res = sc.capture_sglang(f.url, 0.3, tmp_path / "t.parquet", output_dir=tmp_path, telemetry=False,
                                progress=False, poll_timeout_s=30)
        assert "profile_id" not in _posts(f, "/start_profile")[0]
    codes = {q.code for q in res.quality}
    assert {"sglang_no_profile_id", "sglang_no_step_spans", "sglang_no_plugins"} <= codes
    assert len(res.levels[0].files) == 2 and not res.levels[0].files[0].name.startswith("tracekit-")


def test_load_sweep_captures_each_level(tmp_path, converted):
    from tracekit.capture.loadgen import LoadSpec

    with FakeSGLang(FakeConfig(tp_size=1, idle_steps=False, completion_s=0.02)) as f:
        res = sc.capture_sglang(f.url, 0.6, tmp_path / "trace.parquet", load="2,8", output_dir=tmp_path,
                                load_spec=LoadSpec(concurrency=1, prompt_tokens=20, max_tokens=7), load_warmup_s=0.3,
                                telemetry=False, progress=False, poll_timeout_s=30)
        comps = _posts(f, "/v1/completions")
    assert [lv.out.name for lv in res.levels] == ["trace-load2.parquet", "trace-load8.parquet"]
    for lv, c in zip(res.levels, (2, 8)):
        ld = lv.load
        assert ld["concurrency"] == c and ld["requests_ok"] > 0 and ld["requests_failed"] == 0
        assert ld["completion_tokens"] == 7 * ld["requests_ok"] and ld["prompt_tokens"] == 20 * ld["requests_ok"]
        assert ld["output_tokens_per_s"] == pytest.approx(ld["completion_tokens"] / ld["window_s"])
        assert ld["latency_ms_p50"] >= 20.0  # the fake takes 20 ms per request
    # 4x the concurrency at 20 ms per request: clearly more throughput
    assert res.levels[1].load["requests_per_s"] > 2 * res.levels[0].load["requests_per_s"]
    assert comps[0]["max_tokens"] == 7 and comps[0]["ignore_eos"] is True and comps[0]["model"] == "fake-glm5"
    assert [c["meta"]["capture"]["load"]["concurrency"] for c in converted] == [2, 8]


# ------------------------------------------------------------------ step records and graph note


def test_load_step_records_golden(tmp_path):
    from tracekit.capture.sglang_plugin import load_step_records

    recs = [
        {"rank": 1, "tp_rank": 1, "pid": 7, "start_ns": 2000, "end_ns": 2500, "mode": "DECODE", "bs": 4, "tokens": 4,
         "draft": False, "forward_pass_id": 11, "can_run_graph": True, "label": "tk.fwd[DECODE bs=4 tok=4]"},
        {"rank": 1, "tp_rank": 1, "pid": 7, "start_ns": 1000, "end_ns": 1900, "mode": "EXTEND", "bs": 2, "tokens": 300,
         "draft": False, "forward_pass_id": 10, "can_run_graph": False, "label": "tk.fwd[EXTEND bs=2 tok=300]"},
        {"rank": 1, "tp_rank": 1, "pid": 7, "start_ns": 2100, "end_ns": 2200, "mode": "TARGET_VERIFY", "bs": 4,
         "tokens": 16, "draft": True, "forward_pass_id": 3, "can_run_graph": True, "label": "x"},
    ]
    (tmp_path / "steps-rank1-pid7.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + '\n{"rank": 1, "sta')
    df = load_step_records(tmp_path)
    assert df.select("ts_ns", "dur_ns", "step_id", "step_mode", "batch_size", "tokens").rows() == [
        (1000, 900, 10, "EXTEND", 2, 300), (2000, 500, 11, "DECODE", 4, 4), (2100, 100, 3, "DRAFT", 4, 16)]
    assert set(df["kind"].cast(pl.String)) == {"step"} and set(df["src"].cast(pl.String)) == {"tracekit.step"}
    assert load_step_records(tmp_path / "none").height == 0


def test_graph_attribution_note():
    rows = [
        {"rank": 0, "kind": "kernel", "ts_ns": 0, "dur_ns": 300, "name": "k", "graph_id": 5, "step_id": 1},
        {"rank": 0, "kind": "kernel", "ts_ns": 300, "dur_ns": 300, "name": "k", "graph_id": 5, "step_id": None},
        {"rank": 0, "kind": "kernel", "ts_ns": 600, "dur_ns": 400, "name": "k2"},
        {"rank": 0, "kind": "runtime", "ts_ns": 0, "dur_ns": 9999, "name": "cudaGraphLaunch"},
    ]
    q = sc.graph_attribution_note(frame_from_rows(rows))
    assert q is not None and q.code == "graph_no_layer_attribution"
    assert q.details == {"graph_kernels": 2, "graph_gpu_time_frac": 0.6, "graph_kernels_without_step": 1}
    assert "--cuda-graph-backend-decode=disabled" in q.message and "--enable-layerwise-nvtx-marker" in q.message
    assert sc.graph_attribution_note(frame_from_rows(rows[2:])) is None


# ------------------------------------------------------------------ through the real converter


def _needs_convert():
    return pytest.importorskip("tracekit.ingest.convert")


def test_end_to_end_trace_has_ranks_steps_and_server_info(tmp_path, monkeypatch):
    _needs_convert()
    from tracekit.capture.sglang_plugin import load_step_records
    from tracekit.schema import read_trace

    import fake_server

    steps = tmp_path / "steps"
    monkeypatch.setenv("TRACEKIT_STEP_DIR", str(steps))  # the fake server's forwards run tracekit's hook
    # Forwards of a few ms, as on a real server (the fake's take ~0.2 ms): the converter matches a record
    # to the traced step that starts inside it (the hook wraps the range); see the dedupe golden test below.
    fwd = fake_server._Runner.forward

    def ms_forward(self, fb, *a, **k):
        out = fwd(self, fb, *a, **k)
        time.sleep(0.003)
        return out

    monkeypatch.setattr(fake_server._Runner, "forward", ms_forward)
    with FakeSGLang(FakeConfig(tp_size=2, hook=True)) as f:
        res = sc.capture_sglang(f.url, 0.8, tmp_path / "trace.parquet", output_dir=tmp_path, step_dir=steps,
                                telemetry=False, progress=False, poll_timeout_s=30)
    df, meta = read_trace(res.out)
    assert sorted(df["rank"].unique().to_list()) == [0, 1]
    assert meta["sglang_server_info"]["version"] == "0.5.23"
    assert meta["capture"]["profile_request"]["with_stack"] is False
    st = df.filter(pl.col("kind").cast(pl.String) == "step")
    src = st["src"].cast(pl.String)
    from_trace = st.filter(src != "tracekit.step")
    from_records = st.filter(src == "tracekit.step")
    # tk.fwd ranges in the profiler trace became steps on both ranks, with mode/bs/tokens parsed
    assert from_trace.height > 0 and set(from_trace["rank"].unique().to_list()) == {0, 1}
    assert set(from_trace["step_mode"].cast(pl.String)) <= {"DECODE", "EXTEND"}
    ext = from_trace.filter(pl.col("step_mode").cast(pl.String) == "EXTEND")
    if ext.height:
        assert (ext["tokens"] == ext["batch_size"] * 64).all()
    # The hook's step records (rank 0: the fake runs one runner). The client keeps those that start in
    # the capture window; the converter drops a record that duplicates a traced step and gives the traced
    # step the record's global forward id; records of forwards outside the profiled span stay, profiled=false.
    t0, t1 = meta["capture"]["window_ns"]
    every = load_step_records(steps).sort("ts_ns")
    recs = every.filter((pl.col("ts_ns") >= t0) & (pl.col("ts_ns") <= t1))
    assert recs.height > 0 and set(recs["rank"].unique().to_list()) == {0}
    traced0 = from_trace.filter(pl.col("rank") == 0).sort("ts_ns")
    key = ["step_id", "step_mode", "batch_size", "tokens"]

    def rows(f):
        return [(r[0], str(r[1]), r[2], r[3]) for r in f.select(key).rows()]

    # each traced forward's own record is the one starting just before it (the hook wraps the range)
    own = traced0.select(pl.col("ts_ns").alias("_t"), *key).join_asof(
        every.select("ts_ns", *[pl.col(k).alias(f"r_{k}") for k in key]), left_on="_t", right_on="ts_ns",
        strategy="backward")
    in_window = own.filter(pl.col("ts_ns").is_between(t0, t1))  # a forward racing the stop may fall outside
    assert in_window.height >= traced0.height - 1 and in_window.height > 0
    assert rows(in_window) == [tuple(r) for r in in_window.select([f"r_{k}" for k in key]).with_columns(
        pl.col("r_step_mode").cast(pl.String)).rows()]  # ids mapped to the capture's, mode/bs/tokens agree
    assert traced0["step_id"].is_unique().all()
    span_lo, span_hi = traced0["ts_ns"].min(), (traced0["ts_ns"] + traced0["dur_ns"]).max()
    kept = from_records.sort("ts_ns")
    assert kept["rank"].unique().to_list() in ([], [0]) and not kept["profiled"].any()
    assert ((kept["ts_ns"] < span_lo) | (kept["ts_ns"] >= span_hi)).all()  # only forwards outside the span
    assert sorted(rows(kept) + rows(in_window)) == sorted(rows(recs))  # every record: a traced step, or kept


def test_dedupe_when_unprofiled_forwards_are_shorter_than_the_hook_offset(tmp_path):
    """Golden: 4 traced forwards (400 us, under the profiler) whose hook records start 100 us earlier and
    last 600 us, among 22 unprofiled records of 150 us. Intended: the 4 records are dropped, the traced
    steps carry ids 10..13, the 22 others stay unprofiled, and no step id repeats on the rank."""
    conv = _needs_convert()
    from tracekit.schema import read_trace

    base = 1_760_000_000_000_000_000
    us = 1000
    ev = []
    for i in range(4):
        t = 11000.0 + i * 5000
        ev.append({"ph": "X", "cat": "user_annotation", "name": "tk.fwd[DECODE bs=8 tok=8]", "pid": 10, "tid": 10,
                   "ts": t, "dur": 400.0})
        ev.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 10, "tid": 10, "ts": t + 50, "dur": 300.0})
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": base, "distributedInfo": {"rank": 0, "world_size": 1},
           "deviceProperties": [], "traceEvents": ev}
    src = tmp_path / "p-TP-0.trace.json.gz"
    src.write_bytes(gzip.compress(json.dumps(doc).encode()))

    def rec(sid, t_us, dur_us):
        return {"rank": 0, "kind": "step", "ts_ns": base + int(t_us * us), "dur_ns": int(dur_us * us),
                "name": "tk.fwd[DECODE bs=8 tok=8]", "step_id": sid, "step_mode": "DECODE", "batch_size": 8,
                "tokens": 8, "src": "tracekit.step"}

    recs = [rec(8, 1000, 150), rec(9, 6000, 150)]
    recs += [rec(10 + i, 11000 + i * 5000 - 100, 600) for i in range(4)]
    recs += [rec(14 + j, 31000 + j * 5000, 150) for j in range(20)]
    conv.convert([src], tmp_path / "t.parquet", extra_frames=[frame_from_rows(recs)])
    df, _ = read_trace(tmp_path / "t.parquet")
    st = df.filter(pl.col("kind").cast(pl.String) == "step").sort("ts_ns")
    traced = st.filter(pl.col("src").cast(pl.String) != "tracekit.step")
    kept = st.filter(pl.col("src").cast(pl.String) == "tracekit.step")
    assert traced["step_id"].to_list() == [10, 11, 12, 13]
    assert kept["step_id"].to_list() == [8, 9, *range(14, 34)] and not kept["profiled"].any()
    assert st["step_id"].is_unique().all()


def _graph_trace(path: Path) -> None:
    base = 1_760_000_000_000_000_000
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "tk.fwd[DECODE bs=32 tok=32]", "pid": 10, "tid": 10,
         "ts": 100.0, "dur": 50.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 10, "tid": 10, "ts": 120.0, "dur": 10.0,
         "args": {"correlation": 500, "External id": 1}},
        {"ph": "X", "cat": "user_annotation", "name": "tk.fwd[DECODE bs=32 tok=32]", "pid": 10, "tid": 10,
         "ts": 300.0, "dur": 50.0},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "pid": 10, "tid": 10, "ts": 320.0, "dur": 10.0,
         "args": {"correlation": 501, "External id": 2}},
    ]
    for corr, t in ((500, 140.0), (501, 340.0)):
        for i, name in enumerate(["fused_moe_kernel", "cross_device_reduce_1stage", "rmsnorm_kernel"]):
            ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": t + i * 20.0, "dur": 15.0,
                       "args": {"correlation": corr, "graph id": 3, "device": 0, "stream": 7, "External id": 0}})
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": base, "distributedInfo": {"rank": 0, "world_size": 1},
           "deviceProperties": [], "traceEvents": ev}
    path.write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_graph_kernels_attributed_to_launching_forward(tmp_path):
    conv = _needs_convert()
    from tracekit.schema import read_trace

    src = tmp_path / "g-TP-0.trace.json.gz"
    _graph_trace(src)
    conv.convert([src], tmp_path / "g.parquet")
    df, _ = read_trace(tmp_path / "g.parquet")
    steps = df.filter(pl.col("kind").cast(pl.String) == "step").sort("ts_ns")
    k = df.filter(pl.col("kind").cast(pl.String) == "kernel").sort("ts_ns")
    assert steps.height == 2 and k.height == 6
    assert k["graph_id"].to_list() == [3] * 6
    # each graph's kernels carry the step whose range launched them (joined by correlation)
    ids = steps["step_id"].to_list()
    assert k["step_id"].to_list() == [ids[0]] * 3 + [ids[1]] * 3
    assert (k["launch_name"].cast(pl.String) == "cudaGraphLaunch").all()
    q = sc.graph_attribution_note(df)
    assert q is not None and q.details["graph_kernels"] == 6 and q.details["graph_kernels_without_step"] == 0
    assert q.details["graph_gpu_time_frac"] == 1.0
