"""benchmarks/gen_synthetic.py: the synthetic Kineto captures used by the scale benchmark and the diff example."""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from gen_synthetic import BASE_TIME_NS, write_synthetic_kineto  # noqa: E402


def _load(p: Path) -> dict:
    return json.loads(gzip.open(p, "rt").read())


@pytest.fixture(scope="module")
def cap(tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("syn")
    spec = write_synthetic_kineto(out, 4, 300, seed=3, layers=2, tp_size=2)
    return spec, [_load(p) for p in spec.paths]


def test_files_and_top_level_keys(cap) -> None:
    spec, docs = cap
    assert [p.name for p in spec.paths] == [f"synthetic-TP-{r}.trace.json.gz" for r in range(4)]
    for r, d in enumerate(docs):
        assert d["baseTimeNanoseconds"] == BASE_TIME_NS
        assert d["distributedInfo"]["rank"] == r and d["distributedInfo"]["world_size"] == 4
        tp = [g for g in d["distributedInfo"]["pg_config"] if g["pg_desc"] == "tp"][0]
        assert tp["ranks"] == ([0, 1] if r < 2 else [2, 3])
        assert d["deviceProperties"][0]["name"] == "NVIDIA H200"


def test_kernel_count_and_correlation(cap) -> None:
    spec, docs = cap
    for d in docs:
        ev = d["traceEvents"]
        kernels = [e for e in ev if e.get("cat") == "kernel"]
        assert len(kernels) == 300
        runtime = {e["args"]["correlation"]: e for e in ev if e.get("cat") == "cuda_runtime"}
        for k in kernels:
            rt = runtime[k["args"]["correlation"]]
            assert rt["name"] in ("cudaLaunchKernel", "cudaLaunchKernelExC")
            assert rt["ts"] <= k["ts"]  # launched before it runs
            assert isinstance(k["ts"], float) and abs(k["ts"] * 1000 - round(k["ts"] * 1000)) < 1e-3  # ns resolution


def test_allreduce_ends_agree_within_tp_group(cap) -> None:
    _, docs = cap

    def ends(d: dict) -> list[int]:
        return [round((e["ts"] + e["dur"]) * 1000) for e in d["traceEvents"]
                if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_AllReduce")]

    e = [ends(d) for d in docs]
    assert len(e[0]) > 0 and len(e[0]) == len(e[1])
    assert e[0] == e[1] and e[2] == e[3]  # same TP group: identical end times
    comm = [ev for ev in docs[0]["traceEvents"] if ev.get("name") == "record_param_comms"]
    assert comm and comm[0]["args"]["Collective name"] == "allreduce" and comm[0]["args"]["Group size"] == 2


def test_steps_and_no_overlap_on_stream(cap) -> None:
    spec, docs = cap
    ev = docs[0]["traceEvents"]
    steps = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("step[")]
    prof = [e for e in ev if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    assert len(steps) == len(prof) == spec.steps
    assert steps[0]["name"].startswith("step[DECODE bs=")
    gpu = sorted((e for e in ev if e.get("cat") in ("kernel", "gpu_memcpy")), key=lambda e: e["ts"])
    assert all(round((a["ts"] + a["dur"]) * 1000) <= round(b["ts"] * 1000) for a, b in zip(gpu, gpu[1:]))


def test_moe_scale_and_determinism(tmp_path: Path) -> None:
    a = write_synthetic_kineto(tmp_path / "a", 2, 200, seed=1, layers=2, compress=False)
    b = write_synthetic_kineto(tmp_path / "b", 2, 200, seed=1, layers=2, compress=False)
    assert a.paths[0].read_text().replace(str(tmp_path / "a"), "") == b.paths[0].read_text().replace(str(tmp_path / "b"), "")
    slow = write_synthetic_kineto(tmp_path / "s", 2, 200, seed=1, layers=2, moe_gemm_scale=2.0, compress=False)

    def moe_us(p: Path) -> float:
        return sum(e["dur"] for e in json.loads(p.read_text())["traceEvents"]
                   if e.get("cat") == "kernel" and e["name"] == "fused_moe_kernel")

    assert moe_us(slow.paths[0]) == pytest.approx(2.0 * moe_us(a.paths[0]), rel=0.01)


def test_reads_through_kineto_reader(cap) -> None:
    kineto = pytest.importorskip("tracekit.ingest.kineto")
    common = pytest.importorskip("tracekit.ingest.common")
    import polars as pl

    spec, _ = cap
    raw, meta = kineto.read_kineto(spec.paths[1])
    df = common.finalize_rank(raw)
    k = df.filter(pl.col("kind").cast(pl.String) == "kernel")
    assert k.height == 300 and k["launch_ts_ns"].null_count() == 0
    cats = set(k["category"].cast(pl.String).unique().to_list())
    assert {"moe_gemm", "moe_routing", "attention", "dense_gemm", "communication"} <= cats
    st = df.filter(pl.col("kind").cast(pl.String) == "step")
    assert st.height == spec.steps and st["step_mode"].cast(pl.String).unique().to_list() == ["DECODE"]
