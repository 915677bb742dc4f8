"""Property tests over the Kineto reader: random event lists -> JSON -> read_kineto -> finalize_rank.

Invariants:
* nothing but :class:`InputError` ever escapes (junk types, missing fields, huge ints, bad nesting);
* every GPU op (kernel, memcpy, memset) gets exactly one category from CATEGORIES and a family;
* durations are never negative, timestamps never null; kernel rows = kernel events with a numeric ts;
* the two decoders (fast columnar, exact msgspec) give the same rows;
* converting the same input twice gives byte-identical trace.parquet files.
"""

from __future__ import annotations

import gzip
import json
import os
import tempfile
from pathlib import Path
from typing import Any

import polars as pl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tracekit._errors import InputError
from tracekit.ingest.common import finalize_rank
from tracekit.ingest.convert import convert
from tracekit.ingest.kineto import read_kineto
from tracekit.schema import CATEGORIES, GPU_OP_KINDS

#: TRACEKIT_FUZZ_SCALE=10 runs ten times more examples (local soak); CI uses the defaults (< 20 s).
SCALE = int(os.environ.get("TRACEKIT_FUZZ_SCALE", "1"))
SETTINGS = settings(max_examples=60 * SCALE, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

NAMES = [
    "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclDevComm*, unsigned long, ncclWork*)",
    "fused_moe_kernel",
    "nvjet_sm90_tst_128x216_64x4_2x1_v_bz_coopA_NNT",
    "flash_fwd_kernel",
    "Memcpy HtoD (Pinned -> Device)",
    "Memset (Device)",
    "cudaLaunchKernel",
    "cudaGraphLaunch",
    "record_param_comms",
    "step[DECODE bs=4]",
    "tk.fwd[EXTEND bs=2 tok=77]",
    "ProfilerStep#3",
    "",
]
CATS = ["kernel", "Kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation",
        "gpu_user_annotation", "cuda_sync", "ac2g", "python_function", "Trace", "made_up_category", None]

junk = st.one_of(st.none(), st.booleans(), st.text(max_size=5), st.lists(st.integers(), max_size=2),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
small_int = st.integers(-5, 10**6)
ts_num = st.one_of(st.integers(0, 2 * 10**15), st.floats(0, 1e12, allow_nan=False, allow_infinity=False))
ts_val = st.one_of(ts_num, ts_num, ts_num, junk)
dur_val = st.one_of(st.integers(-1000, 10**7), st.floats(-10, 1e5, allow_nan=False, allow_infinity=False), junk)

args_st = st.one_of(
    st.none(),
    junk,
    st.fixed_dictionaries(
        {},
        optional={
            "correlation": st.one_of(st.integers(0, 50), st.integers(2**63, 2**70), junk),
            "External id": st.one_of(st.integers(0, 50), junk),
            "device": st.one_of(st.integers(0, 8), junk),
            "stream": st.one_of(st.integers(0, 30), junk),
            "grid": st.one_of(st.lists(st.integers(1, 10**6), max_size=4), junk),
            "block": st.one_of(st.lists(st.integers(1, 1024), max_size=3), junk),
            "bytes": st.one_of(small_int, junk),
            "Collective name": st.one_of(st.sampled_from(["allreduce", "_allgather_base", "broadcast"]), junk),
            "Process Group Name": st.one_of(st.sampled_from(["0", "1", "tp"]), junk),
            "Process Group Ranks": st.one_of(st.just("[0, 1]"), st.lists(st.integers(0, 3), max_size=3), junk),
            "In msg nelems": st.one_of(small_int, junk),
            "dtype": st.one_of(st.sampled_from(["BFloat16", "Float"]), junk),
            "Seq": st.one_of(small_int, junk),
            "Input Dims": st.one_of(st.lists(st.lists(st.integers(0, 9), max_size=3), max_size=3), junk),
        },
    ),
)

event_st = st.fixed_dictionaries(
    {},
    optional={
        "ph": st.one_of(st.sampled_from(["X", "X", "X", "X", "i", "M", "f", "s"]), junk),
        "cat": st.one_of(st.sampled_from(CATS), junk),
        "name": st.one_of(st.sampled_from(NAMES), st.text(max_size=12), junk),
        "pid": st.one_of(small_int, st.text(max_size=4), junk),
        "tid": st.one_of(small_int, st.text(max_size=4), junk),
        "ts": ts_val,
        "dur": dur_val,
        "args": args_st,
    },
)

doc_st = st.fixed_dictionaries(
    {"traceEvents": st.lists(event_st, max_size=40)},
    optional={
        "baseTimeNanoseconds": st.one_of(st.integers(0, 2 * 10**18), junk),
        "distributedInfo": st.one_of(st.fixed_dictionaries({"rank": st.integers(0, 7), "world_size": st.integers(1, 8)}), junk),
        "displayTimeUnit": st.sampled_from(["ms", "ns"]),
        "record_shapes": st.sampled_from([0, 1]),
        "deviceProperties": st.one_of(st.lists(st.fixed_dictionaries({"id": st.integers(0, 3), "name": st.text(max_size=8)}), max_size=2), junk),
    },
)


def _write(doc: Any, d: Path, gz: bool) -> Path:
    f = d / ("rank0.json.gz" if gz else "rank0.json")
    data = json.dumps(doc).encode()
    f.write_bytes(gzip.compress(data, 1) if gz else data)
    return f


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _read(f: Path, exact: bool | None = None):
    try:
        return read_kineto(f, exact=exact)
    except InputError as e:
        assert "\n" not in str(e) and f.name in str(e)
        return None


@SETTINGS
@given(doc=doc_st, gz=st.booleans())
def test_reader_never_crashes_and_categorizes_every_gpu_op(doc: dict, gz: bool) -> None:
    with tempfile.TemporaryDirectory() as td:
        got = _read(_write(doc, Path(td), gz))
    if got is None:
        return
    raw, meta = got
    df = finalize_rank(raw)
    assert df.height == raw.height
    assert df["ts_ns"].null_count() == 0
    assert df.height == 0 or df["dur_ns"].min() >= 0
    gpu = df.filter(pl.col("kind").cast(pl.String).is_in(list(GPU_OP_KINDS)))
    assert gpu["category"].null_count() == 0 and gpu["family"].null_count() == 0
    assert set(gpu["category"].cast(pl.String).unique().to_list()) <= set(CATEGORIES)
    non_gpu = df.filter(~pl.col("kind").cast(pl.String).is_in(list(GPU_OP_KINDS)))
    assert non_gpu["category"].null_count() == non_gpu.height  # categories belong to GPU ops only
    # every well-formed kernel event becomes exactly one kernel row
    want = sum(
        1 for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "Kernel") and _is_num(e.get("ts"))
    )
    assert df.filter(pl.col("kind").cast(pl.String) == "kernel").height == want


@SETTINGS
@given(doc=doc_st)
def test_fast_and_exact_decoders_agree(doc: dict) -> None:
    with tempfile.TemporaryDirectory() as td:
        f = _write(doc, Path(td), False)
        a, b = _read(f, exact=False), _read(f, exact=True)
    assert (a is None) == (b is None)
    if a is None:
        return
    assert a[0].equals(b[0]), (a[0], b[0])


@settings(max_examples=12 * SCALE, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=doc_st)
def test_convert_twice_is_byte_identical(doc: dict) -> None:
    with tempfile.TemporaryDirectory() as td:
        d = Path(td)
        f = _write(doc, d, True)
        outs = []
        for name in ("a.parquet", "b.parquet"):
            try:
                convert([f], d / name, jobs=1)
            except InputError:
                return
            outs.append((d / name).read_bytes())
        assert outs[0] == outs[1]
