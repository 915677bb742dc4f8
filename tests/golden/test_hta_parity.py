"""tracekit vs HTA (traceinsight) idle / communication fractions, against numbers recorded from HTA.

``benchmarks/hta_parity.py --record`` ran HTA and stored, per rank, HTA's window and
fractions in ``expected/hta_<case>.json`` (the command is in each file); traceinsight
is not needed here. tracekit is run over the same window. See docs/hta_parity.md.
"""

from __future__ import annotations

import os

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXPECTED = Path(__file__).resolve().parent / "expected"
HTA_DIR = Path(os.environ.get("TRACEKIT_TRACES", "/work/shared/traces") + "/hta")
_spec = importlib.util.spec_from_file_location("hta_parity", ROOT / "benchmarks" / "hta_parity.py")
hta_parity = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(hta_parity)  # type: ignore[union-attr]

pytestmark = pytest.mark.skipif(not HTA_DIR.exists(), reason="shared traces not available")

#: documented differences above 0.5 pp (docs/hta_parity.md): case -> rank -> (Δ idle pp, Δ comm pp),
#: Δ = tracekit − HTA. Causes: HTA drops GPU ops without a launching runtime call in the trace and
#: ops launched in the last ProfilerStep (negative_queue_length, trace_diff_test), and shrinks every
#: op of an ns-resolution trace to whole µs (nccl_parser_config, ns_resolution_trace).
KNOWN = {
    "nccl_parser_config": {"0": (-0.54, -0.03)},
    "negative_queue_length": {"0": (-6.09, 2.42)},
    "ns_resolution_trace": {"0": (-0.95, 0.0)},
    "trace_diff_test": {"1": (-4.00, 0.14)},
}


def _cases() -> list[str]:
    return sorted(p.stem.removeprefix("hta_") for p in EXPECTED.glob("hta_*.json"))


def test_recorded_cases_cover_the_brief() -> None:
    need = {"trace_filter", "nccl_parser_config", "df_index_resolver", "negative_queue_length", "ns_resolution_trace",
            "trace_diff_control", "trace_diff_test"}
    assert need <= set(_cases())


@pytest.mark.parametrize("case", _cases())
def test_fractions_agree_with_hta(case: str, tmp_path: Path) -> None:
    rec = json.loads((EXPECTED / f"hta_{case}.json").read_text())
    pq = tmp_path / "t.parquet"
    hta_parity._convert(HTA_DIR / rec["trace_dir"], pq)
    tk = hta_parity.tracekit_side(pq, rec)
    assert set(tk) == set(rec["ranks"])
    for rank, h in rec["ranks"].items():
        t = tk[rank]
        assert t["window_ns"] == h["hta_window_ns"][1] - h["hta_window_ns"][0]
        # same semantics: restricted to the ops HTA keeps and rounded as HTA rounds, tracekit reproduces HTA
        assert t["idle_pct_hta_emulated"] == pytest.approx(h["idle_pct"], abs=0.02)
        assert t["comm_pct_hta_emulated"] == pytest.approx(h["comm_exposed_pct"], abs=0.02)
        # ns-exact tracekit over all ops vs HTA: within 0.5 pp, or the documented difference
        d_idle, d_comm = t["idle_pct"] - h["idle_pct"], t["comm_pct"] - h["comm_exposed_pct"]
        known = KNOWN.get(case, {}).get(rank)
        if known is None:
            assert abs(d_idle) <= 0.5 and abs(d_comm) <= 0.5
        else:
            assert (d_idle, d_comm) == (pytest.approx(known[0], abs=0.02), pytest.approx(known[1], abs=0.02))
