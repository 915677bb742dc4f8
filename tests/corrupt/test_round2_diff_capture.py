"""Reliability round two (issue 20): diff says when two traces are not comparable; capture --ranks is bounded.

diff: a Kineto trace of the real A100 job against the real H200 nsys capture (both in
/work/shared/traces) differ in device, source format and workload; each gets a note that says
what the comparison still means, in the terminal and in --json. A run against itself gets none.
capture: --ranks 0 or negative, or more CPU ranks than the cores bear without --oversubscribe,
are usage errors before any rank starts.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from corrupt._build import TF0, TRACES, assert_clean_error, cli_inproc, dump, load, need

pytestmark = pytest.mark.filterwarnings("ignore")

run = cli_inproc
H200 = TRACES / "nsys/generated-h200/h200_1gpu.sqlite"


@pytest.fixture(scope="module")
def pair(tmp_path_factory) -> tuple[Path, Path]:
    need(TF0, H200)
    d = tmp_path_factory.mktemp("diffpair")
    doc = copy.deepcopy(load(TF0))
    doc["deviceProperties"] = [{"id": 0, "name": "NVIDIA A100-SXM4-80GB"}]
    a100 = d / "a100.parquet"
    assert run("convert", dump(doc, d / "rank0.json.gz"), "-o", a100, "-q").returncode == 0
    h200 = d / "h200.parquet"
    assert run("convert", H200, "-o", h200, "-q").returncode == 0
    return a100, h200


def test_diff_of_an_a100_kineto_and_an_h200_nsys_trace_warns(pair) -> None:
    a100, h200 = pair
    p = run("diff", a100, h200, "--json")
    assert p.returncode == 0, p.stderr
    q = {x["code"]: x["message"] for x in json.loads(p.stdout)["quality"]}
    assert "A100" in q["diff_devices_differ"] and "H200" in q["diff_devices_differ"]
    assert "not what a change did" in q["diff_devices_differ"]
    assert "kineto" in q["diff_formats_differ"] and "nsys" in q["diff_formats_differ"]
    assert "different workloads" in q["diff_workloads_differ"]
    t = run("diff", a100, h200, "--width", "200")
    assert t.returncode == 0 and "diff_devices_differ" in t.stdout and "diff_workloads_differ" in t.stdout


def test_diff_of_a_run_against_itself_has_no_comparability_note(pair) -> None:
    a100, _ = pair
    p = run("diff", a100, a100, "--json")
    assert p.returncode == 0, p.stderr
    codes = {x["code"] for x in json.loads(p.stdout)["quality"]}
    assert not codes & {"diff_devices_differ", "diff_formats_differ", "diff_workloads_differ"}


def test_comparability_from_capture_shapes() -> None:
    from tracekit.compare.comparable import comparability_notes

    m = lambda **o: {"capture": {"workload": {"options": {"layers": 2, "hidden": 256, **o}}}}  # noqa: E731
    assert comparability_notes(m(), m()) == []
    (code, msg), = comparability_notes(m(), m(hidden=6144))
    assert code == "diff_workloads_differ" and "hidden 256 vs 6144" in msg


@pytest.mark.parametrize("n, words", [("0", ["--ranks 0", "at least 1"]), ("-2", ["--ranks -2"]),
                                      ("100000", ["--ranks 100000", "at most 1024"])])
def test_capture_ranks_out_of_bounds(tmp_path: Path, n: str, words: list[str]) -> None:
    out = tmp_path / "c.parquet"
    p = run("capture", "--workload", "--device", "cpu", "--ranks", n, "--duration", "1s", "-o", out)
    assert_clean_error(p, *words, code=64)
    assert not out.exists()


def test_capture_cpu_ranks_above_the_cores_need_oversubscribe(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tracekit.commands.capture import CPU_RANKS_PER_CORE, check_cpu_ranks
    import os

    limit = max(8, CPU_RANKS_PER_CORE * len(os.sched_getaffinity(0)))
    out = tmp_path / "c.parquet"
    p = run("capture", "--workload", "--device", "cpu", "--ranks", str(limit + 1), "--duration", "1s", "-o", out)
    assert_clean_error(p, f"--ranks {limit + 1}", "--oversubscribe", code=64)
    check_cpu_ranks("cpu", limit + 1, True)  # allowed with --oversubscribe
    check_cpu_ranks("cuda", 10**6, False)  # GPU ranks are bounded by the visible GPUs (resolve_device)
