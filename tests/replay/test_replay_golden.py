"""Golden replay tests on hand-built frames with known answers (times in µs)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from frames import TraceBuilder  # noqa: E402

from tracekit._errors import UsageError  # noqa: E402
from tracekit.replay import replay  # noqa: E402
from tracekit.replay.graph import ET_LAUNCH, build_graph  # noqa: E402

US = 1000


def p50(res, i=None):
    return res.baseline.step_ns_p50 if i is None else res.what_if[i].step_ns_p50


def launch_bound() -> TraceBuilder:
    b = TraceBuilder()
    b.step(0, 0, 100, 1)
    for i, t in enumerate((10, 20, 30, 40, 50)):
        b.launch(0, t, 4, t + 5, 2, step_id=1, name="moe" if i == 2 else f"k{i}",
                 category="moe_gemm" if i == 2 else "other_compute")
    b.sync(0, 60, 5, step_id=1)
    return b


def gpu_bound() -> TraceBuilder:
    b = TraceBuilder()
    b.step(0, 0, 140, 1)
    starts = [15, 45, 75, 105]
    for i, (t, s) in enumerate(zip((10, 14, 18, 22), starts)):
        b.launch(0, t, 3, s, 30, step_id=1, name="moe" if i == 1 else f"k{i}",
                 category="moe_gemm" if i == 1 else "other_compute")
    b.sync(0, 26, 111, step_id=1)  # waits for the last kernel (ends 135), tail 2
    return b


def test_self_replay_exact_launch_and_gpu_bound():
    for b in (launch_bound(), gpu_bound()):
        r = replay(b.frame())
        assert r.baseline.self_replay_error == 0.0
        assert r.baseline.profiled_step_ns_p50 == r.baseline.self_replay_step_ns_p50


def test_launch_bound_kernel_scaling_does_not_change_step():
    r = replay(launch_bound().frame(), what_ifs=["moe_gemm=3", "moe_gemm=0.1"])
    assert p50(r) == 100 * US
    assert p50(r, 0) == 100 * US
    assert p50(r, 1) == 100 * US
    assert r.calibration_scale == 1.0 and not r.calibrated
    assert any(q.code == "replay_uncalibrated" for q in r.quality)


def test_gpu_bound_kernel_scaling_moves_step_by_the_saved_time():
    r = replay(gpu_bound().frame(), what_ifs=["moe_gemm=0.5", "re:^k[0-9]$=2"])
    assert p50(r) == 140 * US
    assert p50(r, 0) == 125 * US  # 15 µs saved on the moe kernel propagates through FIFO and the sync
    assert p50(r, 1) == 230 * US  # three 30 µs kernels doubled: +90
    # the step's only sync is where the host takes its result: not a sync to remove (that would overlap steps)
    with pytest.raises(UsageError, match="only host syncs are each step's last"):
        replay(gpu_bound().frame(), what_ifs=["no-host-sync"])
    cp = r.baseline.critical_path_ns
    assert cp["moe_gemm"] == 30 * US
    assert cp["other_compute"] == 90 * US
    assert sum(cp.values()) == pytest.approx(140 * US)


def mid_step_sync() -> TraceBuilder:
    """k0 (30 µs), a sync on it (the host idles until 47), k1 launched after it (55-85), the step's result sync (86-88)."""
    b = TraceBuilder()
    b.step(0, 0, 100, 1)
    b.launch(0, 10, 3, 15, 30, step_id=1, name="k0", category="other_compute")
    b.sync(0, 14, 33, step_id=1)  # waits for k0 (ends 45), tail 2
    b.launch(0, 50, 3, 55, 30, step_id=1, name="k1", category="other_compute")
    b.sync(0, 56, 31, step_id=1)  # the step's result: waits for k1 (ends 85), tail 2
    return b


def test_no_host_sync_removes_the_waits_inside_a_step_and_keeps_its_result_sync():
    r = replay(mid_step_sync().frame(), what_ifs=["no-host-sync"])
    assert p50(r) == 100 * US
    # without the mid-step wait k1 is launched at 17 (the host's own 3 µs after the sync call) and queues behind k0:
    # it runs 45-75, the result sync ends 77 and the host's 13 µs to the end marker end the step at 90 (+ the removed
    # sync call's own ~1 µs)
    assert 90 * US <= p50(r, 0) <= 92 * US
    notes = " ".join(r.what_if[0].notes)
    assert "removed" in notes and "kept" in notes


def two_rank_rendezvous() -> TraceBuilder:
    b = TraceBuilder()
    for rank, (pre_name, pre_cat, pre_dur, arr, dur) in enumerate(
        [("a", "other_compute", 10, 25, 38), ("b", "dense_gemm", 40, 55, 8)]
    ):
        b.step(rank, 0, 70, 1)
        b.launch(rank, 10, 2, 15, pre_dur, step_id=1, name=pre_name, category=pre_cat)
        b.launch(rank, 12, 2, arr, dur, step_id=1, name="ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                 category="communication", family="allreduce.nccl", coll_name="allreduce", pg_name="0",
                 coll_seq=0, coll_in_nelems=1024, coll_dtype="Float", coll_group_size=2)
        b.sync(rank, 14, 51, step_id=1)  # ends 65 = rendezvous 63 + tail 2
    return b


def test_two_rank_rendezvous():
    df = two_rank_rendezvous().frame()
    g = build_graph(df)
    assert g.instances.height == 1
    assert g.instances.item(0, "transfer_ns") == 8 * US  # min over ranks, not rank 0's 38 µs
    r = replay(df, what_ifs=["dense_gemm=0.5", "other_compute=0.5", "communication=2", "allreduce=bw:1GB/s,lat:5us"])
    assert p50(r) == 70 * US
    assert r.baseline.self_replay_error == 0.0
    assert p50(r, 0) == 50 * US  # the late rank arrives 20 µs earlier: both ranks finish earlier
    assert p50(r, 1) == 70 * US  # the early rank only waits longer
    assert p50(r, 2) == 78 * US  # transfer 8 → 16
    # fabric: 5 µs + 4096 B · 2·(2−1)/2 / 1 GB/s = 9.096 µs (vs 8): +1.096 µs
    assert p50(r, 3) == pytest.approx(70 * US + 1096, abs=1)
    # the wait of rank 0 is attributed to what delayed rank 1 (its dense GEMM), not to communication
    cp = r.baseline.critical_path_ns
    assert cp["dense_gemm"] == 40 * US and cp["communication"] == 8 * US


def test_graph_launch_kernels_have_one_launch_edge():
    b = TraceBuilder()
    b.step(0, 0, 70, 1)
    c = b.call(0, 10, 20, name="cudaGraphLaunch", step_id=1)
    for name, ts in (("g1", 32), ("g2", 43), ("g3", 54)):
        b.op(0, ts, 10, c, name=name, category="moe_gemm" if name == "g1" else "other_compute", step_id=1)
    b.sync(0, 35, 31, step_id=1)  # ends 66
    df = b.frame()
    g = build_graph(df)
    assert int((g.etype == ET_LAUNCH).sum()) == 1
    r = replay(df, what_ifs=["moe_gemm=2"])
    assert p50(r) == 70 * US
    assert p50(r, 0) == 80 * US


def test_cross_stream_event_edge():
    b = TraceBuilder()
    b.step(0, 0, 80, 1)
    b.launch(0, 10, 2, 15, 50, name="A", category="moe_gemm", step_id=1)
    b.call(0, 14, 1, name="cudaEventRecord", step_id=1)
    b.sync(0, 16, 1, name="cudaStreamWaitEvent", stream=9, sync_name="Stream Wait Event", step_id=1)
    b.launch(0, 18, 1, 65, 10, name="B", stream=9, step_id=1)
    b.sync(0, 20, 57, name="cudaDeviceSynchronize", stream=-1, sync_name="Context Sync", step_id=1)
    r = replay(b.frame(), what_ifs=["moe_gemm=0.5"])
    assert p50(r) == 80 * US
    assert p50(r, 0) == 55 * US  # B follows A on the other stream, the device sync follows B


def calibration_trace(unprofiled_us: float = 54) -> TraceBuilder:
    b = TraceBuilder()
    for s in range(2):
        o = s * 1000
        b.step(0, o, 100, s)
        for t in (10, 30, 50, 70):
            b.launch(0, o + t, 2, o + t + 5, 1, step_id=s)
    for i in range(6):
        b.step(0, 5000 + i * 200, unprofiled_us, 100 + i, profiled=False, src="tracekit.step")
    return b


def test_calibration_fits_cpu_gap_scale():
    # step = 8 µs of calls + 92 µs of gaps × s; the unprofiled 54 µs needs s = 0.5
    r = replay(calibration_trace().frame())
    assert r.calibrated
    assert r.calibration_scale == pytest.approx(0.5, abs=2e-3)
    assert p50(r) == pytest.approx(54 * US, rel=1e-3)
    assert r.baseline.measured_step_ns_p50 == 54 * US
    assert r.baseline.self_replay_error == 0.0
    assert r.noise is not None and r.noise.relative == 0.0


def test_noise_warning_when_change_inside_noise():
    b = calibration_trace()
    b.rows = [x for x in b.rows if x.get("profiled") is not False]
    for i, d in enumerate((50, 50, 50, 58, 58, 58)):  # halves 50 vs 58 → noise 8 / p50 (nearest rank: 58)
        b.step(0, 5000 + i * 200, d, 100 + i, profiled=False, src="tracekit.step")
    r = replay(b.frame(), what_ifs=["other_compute=1.01"])
    assert r.noise.relative == pytest.approx(8 / 58, rel=1e-6)
    assert r.what_if[0].within_noise is True


def test_oracle_equals_uniform_scaling_when_target_is_scaled():
    base = gpu_bound()
    tgt = gpu_bound()
    for row in tgt.rows:
        if row.get("name") == "moe":
            row["dur_ns"] = 15 * US
    r = replay(base.frame(), what_ifs=["moe_gemm=0.5"], durations_from=tgt.frame())
    assert r.what_if[1].spec == "oracle"
    assert r.what_if[1].step_ns_p50 == r.what_if[0].step_ns_p50 == 125 * US
    assert "4/4 ops matched exactly" in r.what_if[1].notes[0]


def test_cuda_graph_emulation_collapses_host_work():
    # launch-bound: 5 kernels of 2 µs; graph: launch 10 µs, then kernels back to back with 0.3 µs per node
    r = replay(launch_bound().frame(), what_ifs=["cuda-graph:node=0.3us,launch=10us"])
    pred = p50(r, 0)
    # host: the step's calls collapse into one 10 µs launch; kernels chain with 0.3 µs per node
    # (10 + 5·2 + 4·0.3 = 21.2 µs); the sync then returns after its typical tail (2 µs): 23.2 µs
    assert pred == pytest.approx(23.2 * US, abs=1)


def test_bad_specs_raise_usage_error():
    df = launch_bound().frame()
    for spec in ("nonsense", "moe_gemm=-1", "allreduce=bw:fast", "re:([=2", "nosuchcat=0.5"):
        with pytest.raises(UsageError):
            replay(df, what_ifs=[spec])


def test_multi_rank_step_time_is_max_over_ranks():
    df = two_rank_rendezvous().frame()
    r = replay(df)
    assert r.baseline.n_steps == 1
    assert np.isfinite(r.baseline.step_ns_mean)


def test_json_keys_are_the_typed_fields_in_the_documented_order():
    """``replay --json``: the typed ``baseline``, ``noise`` and ``graph`` encode to the keys (and order) the dicts
    they replaced had (docs/replay.md), each value the field's own; nothing falls through to ``default=str``."""
    import json

    r = replay(calibration_trace().frame(), what_ifs=["other_compute=0.5"])
    j = r.to_json()
    assert list(j) == ["baseline", "calibration_scale", "calibrated", "noise", "what_if", "graph", "quality"]
    assert list(j["baseline"]) == [
        "step_ns_p50", "step_ns_mean", "measured_step_ns_p50", "measured_step_ns_mean", "measured_is_unprofiled",
        "measured_host_range_ns_p50", "measured_is_host_range", "profiled_step_ns_p50", "profiled_host_range_ns_p50",
        "self_replay_step_ns_p50", "self_replay_error", "calibrated_error", "tokens_per_s", "critical_path_ns", "n_steps",
        "by_shape", "step_mode", "step_tokens", "host_call_scale", "gpu_gap_scale"]
    assert list(j["noise"]) == ["relative", "halves_ns", "n_steps", "matched"]
    assert list(j["graph"]) == ["vertices", "edges", "gpu_ops", "collective_instances", "ranks", "typical"]
    for name, node in (("baseline", r.baseline), ("noise", r.noise), ("graph", r.graph)):
        assert j[name] == {k: getattr(node, k) for k in j[name]}, name
    assert json.dumps(j, default=str) == json.dumps(j)  # every value is JSON's own (no object written as its str)
    assert replay(launch_bound().frame()).to_json()["noise"] is None  # no unprofiled timings: null, as before
