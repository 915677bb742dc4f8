"""Synthetic N-rank torch.profiler (Kineto) traces of a GLM-5-shaped TP MoE decode loop.

:func:`write_synthetic_kineto` writes one ``synthetic-TP-<rank>.trace.json(.gz)``
per rank, shaped like a real SGLang / torch.profiler capture:

* per GPU op: ``cpu_op`` (``aten::mm``, ``sgl_kernel::...``) → ``cuda_runtime``
  ``cudaLaunchKernel`` (``External id`` + ``correlation``) → ``kernel`` with the same
  ``correlation``, grid/block/registers/shared memory;
* two NCCL all-reduces per layer (``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``),
  launched from ``record_param_comms`` (collective name, nelems, dtype, process
  group name/desc/ranks, group size) through ``cudaLaunchKernelExC``; the kernel
  carries the same fields (as Kineto does). All ranks of a TP group **end** an
  all-reduce at the same instant; the early ranks wait inside the kernel;
* per step: ``ProfilerStep#N`` and SGLang ``step[DECODE bs=N]`` (every 16th step
  ``step[EXTEND bs=N toks=T]``) ``user_annotation`` spans plus the
  ``gpu_user_annotation`` projection, an HtoD input copy, a DtoH token copy and a
  ``cudaStreamSynchronize`` that blocks the CPU until the GPU drains;
* top level ``baseTimeNanoseconds``, ``distributedInfo`` (rank, world_size,
  pg_config), ``deviceProperties`` (H200); ``ts``/``dur`` in µs with ns
  resolution (3 decimals), so ``unix_ns = baseTimeNanoseconds + ts * 1000``.

Generation streams step by step (all ranks advance together, memory is one step
of all ranks); timing is vectorized with numpy (max-plus recurrences as cumulative
maxima), so throughput is bounded by string formatting (~1 M kernels / 10 s).
Deterministic for a given ``seed``.

CLI: ``python benchmarks/gen_synthetic.py OUT_DIR --ranks 8 --kernels-per-rank 100000``.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Sequence

import numpy as np

__all__ = ["write_synthetic_kineto", "SyntheticSpec", "BASE_TIME_NS"]

#: baseTimeNanoseconds of every synthetic trace (2026-01-01T00:00:00Z).
BASE_TIME_NS = 1_767_225_600_000_000_000
_T0_NS = 3_600_000_000_000  # first step starts 1 h after the base (ts ~ 3.6e9 µs, like real traces)

_H200 = {
    "name": "NVIDIA H200",
    "totalGlobalMem": 150754820096,
    "computeMajor": 9,
    "computeMinor": 0,
    "maxThreadsPerBlock": 1024,
    "maxThreadsPerMultiprocessor": 2048,
    "regsPerBlock": 65536,
    "warpSize": 32,
    "sharedMemPerBlock": 49152,
    "numSms": 132,
    "regsPerMultiprocessor": 65536,
    "sharedMemPerBlockOptin": 232448,
    "sharedMemPerMultiprocessor": 233472,
}

_AR_KERNEL = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"


@dataclass(frozen=True)
class _Tpl:
    """One op of the layer loop: kernel name, CPU op, base GPU µs, CPU µs, launch geometry."""

    kernel: str
    cpu: str
    gpu_us: float
    cpu_us: float
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    regs: int
    smem: int
    is_ar: bool = False
    is_moe: bool = False
    scales_with_bs: bool = True


_NORM = _Tpl(
    "void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, __nv_bfloat16*, "
    "__nv_bfloat16*, unsigned int, unsigned int, unsigned int, float, float)",
    "sgl_kernel::fused_add_rmsnorm", 3.5, 9.0, (64, 1, 1), (256, 1, 1), 32, 2048,
)
_GEMM_QKV = _Tpl("nvjet_tst_64x8_64x16_4x1_v_bz_TNT", "aten::mm", 11.0, 14.0, (132, 1, 1), (384, 1, 1), 168, 196608)
_ATTN = _Tpl(
    "void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u, 8u, 16u, 1u, 8u, "
    "(flashinfer::PageStorage)0, __nv_bfloat16, __nv_bfloat16, __nv_bfloat16, int>(__nv_bfloat16*, "
    "flashinfer::paged_kv_t<(flashinfer::PageStorage)0, __nv_bfloat16, int>, "
    "flashinfer::kv_partition_info_t<int>, __nv_bfloat16*, float*, bool*, int, float, float, float, float)",
    "flashinfer::batch_decode_with_paged_kv_cache", 16.0, 22.0, (32, 16, 1), (16, 8, 1), 64, 33792,
)
_GEMM_O = _Tpl("nvjet_tst_64x8_64x16_4x1_v_bz_TNN", "aten::mm", 7.5, 12.0, (132, 1, 1), (384, 1, 1), 168, 196608)
_AR = _Tpl(_AR_KERNEL, "record_param_comms", 9.0, 18.0, (8, 1, 1), (640, 1, 1), 96, 103808, is_ar=True,
           scales_with_bs=False)
_GATE = _Tpl("nvjet_tst_32x8_64x16_2x1_v_bz_TNT", "aten::mm", 4.0, 11.0, (40, 1, 1), (256, 1, 1), 126, 98304)
_ROUTE = _Tpl(
    "void moe_fused_gate_kernel<float, 256, 8, 32, 8>(void*, void*, float*, int*, long, long, long, long, double, bool)",
    "sgl_kernel::moe_fused_gate", 3.0, 10.0, (16, 1, 1), (32, 8, 1), 40, 0,
)
_ALIGN = _Tpl(
    "void moe_align_block_size_kernel<int>(int const*, int*, int*, int*, int, int, int, int, unsigned long, int*)",
    "sgl_kernel::moe_align_block_size", 4.5, 12.0, (1, 1, 1), (1024, 1, 1), 30, 4104,
)
_MOE_W13 = _Tpl("fused_moe_kernel", "sglang::fused_moe_w13", 38.0, 30.0, (1024, 1, 1), (128, 1, 1), 255, 81920,
                is_moe=True)
_ACT = _Tpl(
    "void flashinfer::activation::act_and_mul_kernel<__nv_bfloat16, &(float silu<float>(float const&))>"
    "(__nv_bfloat16*, __nv_bfloat16 const*, int)",
    "sgl_kernel::silu_and_mul", 2.5, 8.0, (64, 1, 1), (128, 1, 1), 24, 0,
)
_MOE_W2 = _Tpl("fused_moe_kernel", "sglang::fused_moe_w2", 22.0, 26.0, (512, 1, 1), (128, 1, 1), 255, 81920,
               is_moe=True)
_SUM = _Tpl(
    "void moe_sum_reduce_kernel<__nv_bfloat16, 8>(__nv_bfloat16 const*, __nv_bfloat16*, long, long, long, float)",
    "sgl_kernel::moe_sum_reduce", 3.0, 9.0, (64, 1, 1), (256, 1, 1), 40, 0,
)
_EMBED = _Tpl(
    "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, long, unsigned int, 2, 2, -2>"
    "(at::cuda::detail::TensorInfo<c10::BFloat16, unsigned int>, at::cuda::detail::TensorInfo<c10::BFloat16 const, "
    "unsigned int>, at::cuda::detail::TensorInfo<long const, unsigned int>, int, int, unsigned int, long)",
    "aten::embedding", 4.0, 20.0, (132, 1, 1), (128, 1, 1), 32, 0,
)
_LM_HEAD = _Tpl("nvjet_tst_128x16_64x16_2x1_v_bz_TNT", "aten::mm", 45.0, 15.0, (132, 1, 1), (384, 1, 1), 168, 196608)
_SAMPLE = _Tpl(
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, "
    "long, 4> >(at::native::ReduceOp<float, at::native::ArgMaxOps<float>, unsigned int, long, 4>)",
    "aten::argmax", 6.0, 16.0, (64, 1, 1), (32, 16, 1), 38, 128,
)

_LAYER = (_NORM, _GEMM_QKV, _ATTN, _GEMM_O, _AR, _NORM, _GATE, _ROUTE, _ALIGN, _MOE_W13, _ACT, _MOE_W2, _SUM, _AR)
_PROLOGUE = (_EMBED,)
_EPILOGUE = (_NORM, _LM_HEAD, _SAMPLE)


@dataclass(frozen=True)
class SyntheticSpec:
    """What was written: paths, totals, and ground truth useful to tests."""

    paths: list[Path]
    ranks: int
    tp_size: int
    kernels_per_rank: int
    steps: int
    allreduces_per_rank: int
    base_time_ns: int
    seconds: float


def _tpls_for_step(layers: int) -> list[_Tpl]:
    return list(_PROLOGUE) + list(_LAYER) * layers + list(_EPILOGUE)


class _RankWriter:
    """Streams one rank's traceEvents; header written first, footer on close."""

    def __init__(self, path: Path, rank: int, world: int, tp_size: int, pid: int, device: int, compress: bool) -> None:
        self.path = path
        self.fh: IO[str] = (
            gzip.open(path, "wt", compresslevel=1, encoding="utf-8") if compress else open(path, "w", encoding="utf-8")
        )
        self.rank, self.pid, self.tid, self.device = rank, pid, pid, device
        self.corr = 1000
        self.ext = 1
        g0 = (rank // tp_size) * tp_size
        self.tp_ranks = list(range(g0, g0 + tp_size))
        self.pg_name = str(2 + rank // tp_size)
        pg_config = [
            {"pg_name": "0", "pg_desc": "default_pg", "backend_config": "cuda:nccl", "pg_size": world,
             "ranks": list(range(world))},
            {"pg_name": self.pg_name, "pg_desc": "tp", "backend_config": "cuda:nccl", "pg_size": tp_size,
             "ranks": self.tp_ranks},
        ]
        head = {
            "schemaVersion": 1,
            "deviceProperties": [dict(_H200, id=i) for i in range(min(tp_size, 8))],
            "cupti_version": 26,
            "cuda_runtime_version": 12080,
            "cuda_driver_version": 12080,
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": world, "pg_count": 2,
                                "pg_config": pg_config, "nccl_version": "2.27.5"},
            "record_shapes": 0,
            "with_stack": 0,
            "trace_id": f"SYNTHETIC{rank:08d}",
            "displayTimeUnit": "ms",
            "baseTimeNanoseconds": BASE_TIME_NS,
        }
        txt = json.dumps(head)
        self.fh.write(txt[:-1] + ', "traceEvents": [\n')
        meta = [
            {"name": "process_name", "ph": "M", "ts": 0, "pid": pid, "tid": 0, "args": {"name": "python3"}},
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": pid, "tid": pid, "args": {"name": "thread 0 (python3)"}},
            {"name": "process_name", "ph": "M", "ts": 0, "pid": device, "tid": 0, "args": {"name": f"GPU {device}"}},
            {"name": "thread_name", "ph": "M", "ts": 0, "pid": device, "tid": 7, "args": {"name": "stream 7"}},
        ]
        self.fh.write(",\n".join(json.dumps(m) for m in meta))
        pgr = json.dumps(json.dumps(self.tp_ranks))  # a JSON string holding "[0, 1]" as Kineto writes it
        self._comm_args = (
            f'"Collective name": "allreduce", "dtype": "BFloat16", "Process Group Name": "{self.pg_name}", '
            f'"Process Group Description": "tp", "Process Group Ranks": {pgr}, "Group size": {tp_size}, '
            '"In split size": "[]", "Out split size": "[]"'
        )

    def write(self, chunk: str) -> None:
        if chunk:
            self.fh.write(",\n")
            self.fh.write(chunk)

    def close(self) -> None:
        self.fh.write("\n], \"traceName\": " + json.dumps(str(self.path)) + "}\n")
        self.fh.close()


def _segment_times(launch: np.ndarray, dur: np.ndarray, gap: np.ndarray, g0: np.ndarray) -> np.ndarray:
    """GPU start times of back-to-back ops on one stream (rows = ranks).

    ``start_j = max(start_{j-1} + dur_{j-1} + gap_{j-1}, launch_j)`` with
    ``start_0 = max(g0, launch_0)``, solved as a cumulative maximum.
    """
    step = dur + gap
    prefix = np.concatenate([np.zeros((step.shape[0], 1)), np.cumsum(step, axis=1)[:, :-1]], axis=1)
    m = np.maximum.accumulate(launch - prefix, axis=1)
    return prefix + np.maximum(m, g0[:, None])


def write_synthetic_kineto(
    out_dir: str | os.PathLike[str],
    ranks: int,
    kernels_per_rank: int,
    seed: int = 0,
    *,
    layers: int = 78,
    tp_size: int | None = None,
    batch_sizes: Sequence[int] = (8, 16, 32, 64),
    moe_gemm_scale: float = 1.0,
    straggler_rank: int | None = None,
    straggler_factor: float = 1.15,
    compress: bool = True,
    prefix: str = "synthetic",
) -> SyntheticSpec:
    """Write ``ranks`` Kineto JSON traces with about ``kernels_per_rank`` kernels each.

    Returns a :class:`SyntheticSpec` (file paths, step and all-reduce counts).
    ``tp_size`` (default ``min(ranks, 8)``) sets the all-reduce groups: ranks are
    TP groups of consecutive ranks that rendezvous on every all-reduce.
    ``moe_gemm_scale`` multiplies the MoE GEMM durations (untuned > 1, tuned < 1),
    ``straggler_rank`` makes one rank's compute slower by ``straggler_factor``.
    Every kernel counts toward ``kernels_per_rank``; the last step may be cut short.
    """
    t_start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if ranks < 1 or kernels_per_rank < 1:
        raise ValueError("ranks and kernels_per_rank must be >= 1")
    tp = tp_size or min(ranks, 8)
    if ranks % tp:
        raise ValueError(f"ranks ({ranks}) must be a multiple of tp_size ({tp})")
    rng = np.random.default_rng(seed)
    tpls = _tpls_for_step(layers)
    n_full = len(tpls)
    gpu_base = np.array([t.gpu_us for t in tpls]) * 1000.0
    cpu_base = np.array([t.cpu_us for t in tpls]) * 1000.0
    is_ar = np.array([t.is_ar for t in tpls])
    is_moe = np.array([t.is_moe for t in tpls])
    bs_scaled = np.array([t.scales_with_bs for t in tpls])
    gpu_base = np.where(is_moe, gpu_base * moe_gemm_scale, gpu_base)
    rank_scale = np.ones(ranks)
    if straggler_rank is not None and 0 <= straggler_rank < ranks:
        rank_scale[straggler_rank] = straggler_factor

    ext_json = [json.dumps(t.kernel) for t in tpls]
    cpu_json = [json.dumps(t.cpu) for t in tpls]
    geo = [
        f'"registers per thread": {t.regs}, "shared memory": {t.smem}, "grid": [{t.grid[0]}, {t.grid[1]}, '
        f'{t.grid[2]}], "block": [{t.block[0]}, {t.block[1]}, {t.block[2]}], "est. achieved occupancy %": 0'
        for t in tpls
    ]
    writers = [
        _RankWriter(out / f"{prefix}-TP-{r}.trace.json{'.gz' if compress else ''}", r, ranks, tp,
                    pid=100_000 + 17 * r, device=r % 8, compress=compress)
        for r in range(ranks)
    ]
    # rank-level clock: all ranks start a step near the same instant (one host, shared CLOCK_REALTIME)
    step_start = np.rint(np.full(ranks, float(_T0_NS)) + rng.uniform(0, 20_000, ranks))
    written = 0
    step = 0
    n_ar_total = 0
    group_of = np.arange(ranks) // tp
    try:
        while written < kernels_per_rank:
            n = min(n_full, kernels_per_rank - written)
            extend = step % 16 == 15
            bs = int(rng.choice(batch_sizes))
            toks = bs * int(rng.integers(64, 512)) if extend else bs
            work = (1.0 + 0.015 * bs) * (6.0 if extend else 1.0)
            factor = np.where(bs_scaled[:n], work, 1.0)
            noise = rng.lognormal(0.0, 0.06, (ranks, n))
            dur = np.rint(gpu_base[:n] * factor * noise * rank_scale[:, None])
            cpu = np.rint(cpu_base[:n] * rng.lognormal(0.0, 0.10, (ranks, n)))
            gap = np.rint(rng.uniform(800, 2500, (ranks, n)))
            # CPU side: H2D input copy first, then one cpu_op per kernel, back to back
            h2d_launch = step_start + 30_000
            cpu_begin = h2d_launch + 12_000
            cpu_start = cpu_begin[:, None] + np.concatenate([np.zeros((ranks, 1)), np.cumsum(cpu, axis=1)[:, :-1]], axis=1)
            rt_start = cpu_start + np.rint(np.minimum(2_500, cpu * 0.3))
            rt_dur = np.rint(np.minimum(cpu * 0.5, 6_000))
            ready = rt_start + 0.7 * rt_dur
            h2d_start = h2d_launch + 6_000
            h2d_dur = 1_500.0 + bs * 8
            g = np.empty((ranks, n))
            gd = dur.copy()
            g0 = h2d_start + h2d_dur + 1_000
            ar_idx = np.flatnonzero(is_ar[:n])
            lo = 0
            for a in list(ar_idx) + [n]:
                if a > lo:
                    g[:, lo:a] = _segment_times(ready[:, lo:a], dur[:, lo:a], gap[:, lo:a], g0)
                    g0 = g[:, a - 1] + dur[:, a - 1] + gap[:, a - 1]
                if a < n:  # all-reduce: every rank of a TP group ends together
                    s = np.maximum(g0, ready[:, a])
                    transfer = float(np.rint(gpu_base[a] * (1.0 + 0.004 * bs) * rng.lognormal(0.0, 0.05)))
                    grp_max = np.full(ranks // tp, -np.inf)
                    np.maximum.at(grp_max, group_of, s)
                    end = grp_max[group_of] + transfer
                    g[:, a] = s
                    gd[:, a] = end - s
                    g0 = end + gap[:, a]
                lo = a + 1
            gpu_end = g[:, n - 1] + gd[:, n - 1]
            cpu_end = cpu_start[:, n - 1] + cpu[:, n - 1]
            d2h_launch = cpu_end + 2_000
            d2h_start = np.maximum(gpu_end + 1_000, d2h_launch + 5_000)
            d2h_dur = 1_800.0
            sync_start = d2h_launch + 9_000
            sync_end = np.maximum(sync_start + 3_000, d2h_start + d2h_dur + 4_000)
            step_end = sync_end + 8_000
            for r, w in enumerate(writers):
                w.write(_format_step(
                    w, step, extend, bs, toks, n, step_start[r], step_end[r], cpu_begin[r], sync_start[r],
                    sync_end[r], h2d_launch[r], h2d_start[r], h2d_dur, d2h_launch[r], d2h_start[r], d2h_dur,
                    g[r], gd[r], cpu_start[r], cpu[r], rt_start[r], rt_dur[r], is_ar[:n], tpls, ext_json, cpu_json,
                    geo, bs,
                ))
            n_ar_total += int(is_ar[:n].sum())
            written += n
            sched = rng.uniform(150_000, 400_000)
            step_start = np.rint(np.full(ranks, step_end.max() + sched) + rng.uniform(0, 20_000, ranks))
            step += 1
    finally:
        for w in writers:
            w.close()
    return SyntheticSpec(
        paths=[w.path for w in writers], ranks=ranks, tp_size=tp, kernels_per_rank=kernels_per_rank, steps=step,
        allreduces_per_rank=n_ar_total, base_time_ns=BASE_TIME_NS, seconds=time.perf_counter() - t_start,
    )


def _us(ns: float) -> str:
    return f"{round(ns) / 1000.0:.3f}"


def _format_step(
    w: _RankWriter, step: int, extend: bool, bs: int, toks: int, n: int, st: float, en: float, cpu_begin: float,
    sync_s: float, sync_e: float, h2d_l: float, h2d_s: float, h2d_d: float, d2h_l: float, d2h_s: float, d2h_d: float,
    g: np.ndarray, gd: np.ndarray, cs: np.ndarray, cd: np.ndarray, rs: np.ndarray, rd: np.ndarray,
    ar: np.ndarray, tpls: list[_Tpl], kjson: list[str], cjson: list[str], geo: list[str], nelems_bs: int,
) -> str:
    pid, tid, dev = w.pid, w.tid, w.device
    out: list[str] = []
    ap = out.append
    ext = w.ext
    span = "step[EXTEND bs=%d toks=%d]" % (bs, toks) if extend else "step[DECODE bs=%d]" % bs
    ap(f'{{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#{step}", "pid": {pid}, "tid": {tid}, '
       f'"ts": {_us(st)}, "dur": {_us(en - st)}, "args": {{"External id": {ext}, "Record function id": 0}}}}')
    ap(f'{{"ph": "X", "cat": "user_annotation", "name": "{span}", "pid": {pid}, "tid": {tid}, '
       f'"ts": {_us(cpu_begin - 40_000)}, "dur": {_us(sync_e - cpu_begin + 42_000)}, '
       f'"args": {{"External id": {ext + 1}, "Record function id": 0}}}}')
    gpu_first = min(h2d_s, float(g[0]))
    gpu_last = max(d2h_s + d2h_d, float(g[n - 1] + gd[n - 1]))
    ap(f'{{"ph": "X", "cat": "gpu_user_annotation", "name": "{span}", "pid": {dev}, "tid": 7, '
       f'"ts": {_us(gpu_first)}, "dur": {_us(gpu_last - gpu_first)}, "args": {{"External id": {ext + 1}}}}}')
    ext += 2
    corr = w.corr
    # input ids HtoD
    nbytes = 8 * max(bs, toks)
    ap(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": {pid}, "tid": {tid}, "ts": {_us(h2d_l - 2_000)}, '
       f'"dur": {_us(9_000)}, "args": {{"External id": {ext}, "Record function id": 0}}}}')
    ap(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": {pid}, "tid": {tid}, '
       f'"ts": {_us(h2d_l)}, "dur": {_us(5_000)}, "args": {{"External id": {ext}, "cbid": 41, "correlation": {corr}}}}}')
    ap(f'{{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)", "pid": {dev}, "tid": 7, '
       f'"ts": {_us(h2d_s)}, "dur": {_us(h2d_d)}, "args": {{"External id": {ext}, "device": {dev}, "context": 1, '
       f'"stream": 7, "correlation": {corr}, "bytes": {nbytes}, "memory bandwidth (GB/s)": '
       f'{nbytes / h2d_d:.3f}}}}}')
    ext += 1
    corr += 1
    # integer ns on both ends, so back-to-back events never overlap by a rounding ns
    g_s, c_s, r_s = np.rint(g), np.rint(cs), np.rint(rs)
    gl, csl, rsl = g_s.tolist(), c_s.tolist(), r_s.tolist()
    gdl = (np.rint(g + gd) - g_s).tolist()
    cdl = (np.rint(cs + cd) - c_s).tolist()
    rdl = (np.rint(rs + rd) - r_s).tolist()
    arl = ar.tolist()
    comm = w._comm_args
    nel = 6144 * (toks if extend else nelems_bs)
    for i in range(n):
        c0, r0, k0 = csl[i], rsl[i], gl[i]
        if arl[i]:
            ap(f'{{"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": {pid}, "tid": {tid}, '
               f'"ts": {c0 / 1000.0:.3f}, "dur": {cdl[i] / 1000.0:.3f}, "args": {{"External id": {ext}, '
               f'"Record function id": 0, {comm}, "In msg nelems": {nel}, "Out msg nelems": {nel}, '
               f'"Rank": {w.rank}}}}}')
            ap(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernelExC", "pid": {pid}, "tid": {tid}, '
               f'"ts": {r0 / 1000.0:.3f}, "dur": {rdl[i] / 1000.0:.3f}, "args": {{"External id": {ext}, '
               f'"cbid": 430, "correlation": {corr}}}}}')
            ap(f'{{"ph": "X", "cat": "kernel", "name": {kjson[i]}, "pid": {dev}, "tid": 7, "ts": {k0 / 1000.0:.3f}, '
               f'"dur": {gdl[i] / 1000.0:.3f}, "args": {{"External id": {ext}, "queued": 0, "device": {dev}, '
               f'"context": 1, "stream": 7, "correlation": {corr}, {geo[i]}, {comm}, "In msg nelems": {nel}, '
               f'"Out msg nelems": {nel}}}}}')
        else:
            ap(f'{{"ph": "X", "cat": "cpu_op", "name": {cjson[i]}, "pid": {pid}, "tid": {tid}, '
               f'"ts": {c0 / 1000.0:.3f}, "dur": {cdl[i] / 1000.0:.3f}, '
               f'"args": {{"External id": {ext}, "Record function id": 0}}}}')
            ap(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": {pid}, "tid": {tid}, '
               f'"ts": {r0 / 1000.0:.3f}, "dur": {rdl[i] / 1000.0:.3f}, "args": {{"External id": {ext}, '
               f'"cbid": 211, "correlation": {corr}}}}}')
            ap(f'{{"ph": "X", "cat": "kernel", "name": {kjson[i]}, "pid": {dev}, "tid": 7, "ts": {k0 / 1000.0:.3f}, '
               f'"dur": {gdl[i] / 1000.0:.3f}, "args": {{"External id": {ext}, "queued": 0, "device": {dev}, '
               f'"context": 1, "stream": 7, "correlation": {corr}, {geo[i]}}}}}')
        ext += 1
        corr += 1
    # next-token DtoH + stream sync that blocks the CPU until the GPU drains
    ap(f'{{"ph": "X", "cat": "cpu_op", "name": "aten::copy_", "pid": {pid}, "tid": {tid}, "ts": {_us(d2h_l - 1_000)}, '
       f'"dur": {_us(7_000)}, "args": {{"External id": {ext}, "Record function id": 0}}}}')
    ap(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": {pid}, "tid": {tid}, '
       f'"ts": {_us(d2h_l)}, "dur": {_us(4_000)}, "args": {{"External id": {ext}, "cbid": 41, "correlation": {corr}}}}}')
    ap(f'{{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoH (Device -> Pinned)", "pid": {dev}, "tid": 7, '
       f'"ts": {_us(d2h_s)}, "dur": {_us(d2h_d)}, "args": {{"External id": {ext}, "device": {dev}, "context": 1, '
       f'"stream": 7, "correlation": {corr}, "bytes": {8 * bs}, "memory bandwidth (GB/s)": {8 * bs / d2h_d:.3f}}}}}')
    ext += 1
    corr += 1
    ap(f'{{"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": {pid}, "tid": {tid}, '
       f'"ts": {_us(sync_s)}, "dur": {_us(sync_e - sync_s)}, "args": {{"cbid": 131, "correlation": {corr}}}}}')
    corr += 1
    w.ext, w.corr = ext, corr
    return ",\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out_dir")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--kernels-per-rank", type=int, default=100_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=78)
    p.add_argument("--tp-size", type=int, default=None)
    p.add_argument("--moe-gemm-scale", type=float, default=1.0)
    p.add_argument("--straggler-rank", type=int, default=None)
    p.add_argument("--no-gzip", action="store_true", help="write plain .json (faster to write and parse)")
    a = p.parse_args(argv)
    spec = write_synthetic_kineto(
        a.out_dir, a.ranks, a.kernels_per_rank, a.seed, layers=a.layers, tp_size=a.tp_size,
        moe_gemm_scale=a.moe_gemm_scale, straggler_rank=a.straggler_rank, compress=not a.no_gzip,
    )
    size = sum(p.stat().st_size for p in spec.paths)
    print(f"wrote {spec.ranks} ranks x {spec.kernels_per_rank} kernels ({spec.steps} steps, "
          f"{spec.allreduces_per_rank} all-reduces/rank) = {size / 1e6:.1f} MB in {spec.seconds:.1f} s -> {a.out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
