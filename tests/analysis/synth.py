"""Hand-built multi-rank traces with planted faults and known answers.

Model of one TP decode step on every rank: a ``step`` row (CPU range), then
``layers`` × (compute kernel of ``compute_ns``, allreduce). Each rank's allreduce
kernel starts when that rank arrives; all end at last arrival + ``transfer_ns``
(what real collectives do). Every kernel is launched ``launch_lead_ns`` before it
starts, except where a fault says otherwise. Steps are ``step_gap_ns`` apart.

Faults:
* ``delay={rank: (every_k, delay_ns)}``: that rank's host sleeps before the step
  starts on every k-th step (its step range and first kernel start late).
* ``host_sync={rank: (layer, cpu_after_ns)}``: in every step, after that layer's
  compute kernel the rank calls ``cudaStreamSynchronize`` and spends
  ``cpu_after_ns`` on the CPU before launching again.
* ``launch_gap={rank: (layer, gap_ns)}``: the compute kernel of that layer is
  launched ``gap_ns`` after the GPU drained (launch-bound gap).
* ``skew={rank: ns}``: clock offset added to every timestamp of the rank.
* ``counters``: per rank list of (name, ts_ns, value) samples appended as counter rows.
"""

from __future__ import annotations

from typing import Any

from tracekit.schema import frame_from_rows

AR = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
GEMM = "nvjet_sm90_tst_128x216_64x4_2x1_v_bz_coopA_NNT"
MOE = "fused_moe_kernel"


def build(
    *,
    ranks: int = 2,
    steps: int = 6,
    layers: int = 4,
    compute_ns: int = 200_000,
    transfer_ns: int = 20_000,
    launch_lead_ns: int = 30_000,
    step_gap_ns: int = 500_000,
    delay: dict[int, tuple[int, int]] | None = None,
    host_sync: dict[int, tuple[int, int]] | None = None,
    launch_gap: dict[int, tuple[int, int]] | None = None,
    skew: dict[int, int] | None = None,
    nelems: int = 6144 * 8,
    custom_allreduce: bool = False,
    t0: int = 1_700_000_000_000_000_000,
) -> tuple[Any, dict[str, Any]]:
    delay = delay or {}
    host_sync = host_sync or {}
    launch_gap = launch_gap or {}
    skew = skew or {}
    rows: list[dict[str, Any]] = []
    corr = [0]
    seq = {r: 0 for r in range(ranks)}

    def kernel(r: int, name: str, cat: str, fam: str, start: int, dur: int, launch: int, step: int, **kw: Any) -> None:
        corr[0] += 1
        rows.append(dict(rank=r, kind="kernel", ts_ns=start, dur_ns=dur, name=name, category=cat, family=fam, stream=7,
                         device=r, correlation=corr[0], launch_ts_ns=launch, launch_dur_ns=5_000, launch_tid=1,
                         launch_name="cudaLaunchKernel", step_id=step, **kw))
        rows.append(dict(rank=r, kind="runtime", ts_ns=launch, dur_ns=5_000, name="cudaLaunchKernel", correlation=corr[0],
                         tid=1, pid=100 + r, step_id=step))

    base = t0
    for s in range(steps):
        # CPU: step starts at base (+ delay); first kernel starts launch_lead after.
        cur = {}
        for r in range(ranks):
            d = 0
            if r in delay and s % delay[r][0] == 0:
                d = delay[r][1]
            cur[r] = base + d  # CPU time the step starts on rank r
        step_start = dict(cur)
        gpu_free = {r: cur[r] + launch_lead_ns for r in range(ranks)}
        for li in range(layers):
            arrivals = {}
            for r in range(ranks):
                launch = gpu_free[r] - launch_lead_ns
                start = gpu_free[r]
                if r in launch_gap and launch_gap[r][0] == li:
                    launch = gpu_free[r] + launch_gap[r][1]
                    start = launch + 8_000
                if r in host_sync and host_sync[r][0] == li and li > 0:
                    # sync issued while the previous allreduce runs; returns when the GPU drains
                    rows.append(dict(rank=r, kind="runtime", ts_ns=gpu_free[r] - 15_000, dur_ns=15_000 + 2_000,
                                     name="cudaStreamSynchronize", tid=1, pid=100 + r, step_id=s))
                    launch = gpu_free[r] + 2_000 + host_sync[r][1]
                    start = launch + 8_000
                cname, cat, fam = (MOE, "moe_gemm", "moe_gemm.triton") if li % 2 else (GEMM, "dense_gemm", "gemm.dense")
                kernel(r, cname, cat, fam, start, compute_ns, launch, s)
                arrivals[r] = start + compute_ns + 2_000
            last = max(arrivals.values())
            for r in range(ranks):
                a = arrivals[r]
                end = last + transfer_ns
                if custom_allreduce:
                    kernel(r, "void sglang::cross_device_reduce_1stage<__nv_bfloat16, 2>(...)", "communication",
                           "allreduce.custom_v1", a, end - a, a - launch_lead_ns, s)
                else:
                    kernel(r, AR, "communication", "allreduce.nccl", a, end - a, a - launch_lead_ns, s,
                           coll_name="allreduce", coll_in_nelems=nelems, coll_out_nelems=nelems, coll_dtype="BFloat16",
                           coll_group_size=ranks, pg_name="0", pg_ranks=str(list(range(ranks))), coll_seq=seq[r])
                seq[r] += 1
                gpu_free[r] = end + 3_000
        step_end = max(gpu_free.values())
        for r in range(ranks):
            rows.append(dict(rank=r, kind="step", ts_ns=step_start[r], dur_ns=step_end - step_start[r], name="step[DECODE bs=8]",
                             step_id=s, step_mode="DECODE", batch_size=8, tokens=8, profiled=True, tid=1, pid=100 + r))
        base = step_end + step_gap_ns
    for row in rows:
        off = skew.get(row["rank"], 0)
        row["ts_ns"] += off
        if row.get("launch_ts_ns") is not None:
            row["launch_ts_ns"] += off
    df = frame_from_rows(rows)
    meta = {"world_size": ranks, "ranks": [{"rank": r, "device_name": "NVIDIA H200", "power_limit_w": 700.0,
                                             "link_gen": 5, "link_width": 16} for r in range(ranks)]}
    return df, meta


def counter_rows(rank: int, name: str, t_start: int, t_end: int, period_ns: int, value_fn) -> list[dict[str, Any]]:
    """Counter samples every ``period_ns`` in [t_start, t_end); value_fn(ts) -> float."""
    return [dict(rank=rank, kind="counter", ts_ns=t, dur_ns=0, name=name, value=float(value_fn(t)))
            for t in range(t_start, t_end, period_ns)]
