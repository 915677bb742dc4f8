"""The typed result tree: one frozen msgspec Struct per section of ``tracekit analyze --json``.

:class:`Sections` is the whole ``analyze --json`` object (docs/analyze_json.md, ``schemas/analyze_v1.json``): its
fields are the JSON's keys in the JSON's order, each typed down to the leaves. ``tracekit.analysis.result`` encodes
it (:func:`encode`); views (terminal, HTML, diff, replay) read these fields, never a dict.

Conventions: times are int ns (``*_ns``), rates carry their unit in the name; a field typed ``X | UnsetType`` is
absent from the JSON where the analysis has nothing to say (it is never written as ``null``); ``None`` is a
stated "unknown". Every Struct forbids unknown fields, so a producer that adds a key without adding it here fails
at once (:func:`build` validates), instead of the key vanishing from the JSON.

Where a producer hands a JSON-ready dict, :func:`build` converts it (strict: an int stays an int, a float a
float; ``int | float`` where an analysis emits either); a producer may hand the Struct itself.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec
from msgspec import UNSET, Struct, UnsetType

__all__ = [
    "Node", "QualityItem", "WindowInfo", "RankBreakdown", "Overall", "TopKernel", "UncategorizedKernel",
    "Stall", "ClockAlignment", "CollectiveGroup", "CollectiveRank", "StallSummary", "StallThresholds", "Collectives",
    "IdleCauses", "IdleGap", "PciePhase", "PowerRank", "SpinWait", "SpinWaits", "Power",
    "StepRow", "StepSummary", "StepTimeNode", "UnprofiledSteps", "Steps", "KernelEfficiency", "MoeShape", "MoeGemmRank",
    "MoeGemm", "MoeDetection", "ExpertLayer", "ExpertWorst", "ExpertLoad", "Interconnect", "Replayed", "NextWinBaseline",
    "Confidence", "NextWinRow",
    "Skipped", "NextWin", "Sections", "build", "schema_doc", "SCHEMA_VERSION", "ANALYSIS_FIELDS", "UNSET", "UnsetType",
]

Num = int | float


class Node(Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Base of every node of the tree (frozen, no unknown fields)."""


# ---------------------------------------------------------------- pipeline sections
class QualityItem(Node, frozen=True, kw_only=True):
    """A data-quality flag (``tracekit._errors.Quality``): stable ``code``, a sentence, ``info``/``warning``."""

    code: str
    message: str
    severity: str
    rank: int | UnsetType = UNSET
    details: dict[str, Any] | UnsetType = UNSET


class WindowInfo(Node, frozen=True, kw_only=True):
    """The analysis window (absolute ns; ``None``: each rank's own extent) and why it was chosen."""

    start_ns: int | None
    end_ns: int | None
    reason: str
    trimmed_transient_ns: int
    skipped_steps: int


class RankBreakdown(Node, frozen=True, kw_only=True):
    """One rank's exclusive split: ``time_ns`` (bucket → ns) sums exactly to ``window_ns``."""

    rank: int
    window_start_ns: int
    window_ns: int
    gpu_busy_ns: int
    time_ns: dict[str, int]


class Overall(Node, frozen=True, kw_only=True):
    """Sums over the ranks (rank·ns)."""

    window_ns: int
    gpu_busy_ns: int
    time_ns: dict[str, int]


class TopKernel(Node, frozen=True, kw_only=True):
    name: str
    count: int
    total_ns: int
    mean_ns: int


class UncategorizedKernel(Node, frozen=True, kw_only=True):
    name: str
    count: int
    total_ns: int


# ---------------------------------------------------------------- collectives and stalls
class Stall(Node, frozen=True, kw_only=True):
    """One stall: ``waiting_rank`` waited ``wait_ns`` at ``ts_ns`` for ``late_rank`` (docs/metrics.md)."""

    waiting_rank: int
    late_rank: int
    wait_ns: int
    ts_ns: int
    step: int | None
    collective: str
    cause: str
    detail: str | None


class ClockAlignment(Node, frozen=True, kw_only=True):
    offsets_ns: dict[str, int]
    residual_ns: int | None
    residual_before_ns: int | None
    instances_used: int
    applied: bool


class CollectiveGroup(Node, frozen=True, kw_only=True):
    """Per process group and collective: kernel time split into wait (for the last rank) and transfer."""

    pg: str
    coll_name: str
    count: int
    ranks: tuple[int, ...]
    kernel_ns: int
    wait_ns: int
    transfer_ns: int
    wait_share: float | None
    bytes_p50: float | None
    bus_bw_p50_bytes_per_s: float | None
    algos: tuple[str, ...]
    not_ok: int


class CollectiveRank(Node, frozen=True, kw_only=True):
    rank: int
    kernel_ns: int
    wait_ns: int
    transfer_ns: int


class StallSummary(Node, frozen=True, kw_only=True):
    late_rank: int
    cause: str
    count: int
    lost_ns: int
    waiting_ranks: tuple[int, ...]
    top_detail: str | None


class StallThresholds(Node, frozen=True, kw_only=True):
    min_wait_ns: int
    min_rel_step: float


class Collectives(Node, frozen=True, kw_only=True):
    clock_alignment: ClockAlignment
    instances: int
    groups: tuple[CollectiveGroup, ...]
    per_rank: tuple[CollectiveRank, ...]
    stall_count: int
    stall_summary: tuple[StallSummary, ...]
    lost_by_rank: dict[str, int]
    thresholds: StallThresholds


# ---------------------------------------------------------------- idle, PCIe, power
class IdleCauses(Node, frozen=True, kw_only=True):
    """GPU idle time of one rank by cause (ns; docs/metrics.md)."""

    between_steps: int
    host_sync: int
    launch_bound: int
    host_idle: int
    other: int
    waiting_on_peer: int


class IdleGap(Node, frozen=True, kw_only=True):
    start_ns: int
    end_ns: int
    dur_ns: int
    cause: str
    step_id: int | None
    next_name: str | None
    detail: str | None


class PciePhase(Node, frozen=True, kw_only=True):
    rank: int
    start_ns: int
    dur_ns: int
    direction: str
    achieved_bytes_per_s: Num | None
    pct_of_link: Num | None
    source: str
    during: tuple[str, ...] | None


class PowerRank(Node, frozen=True, kw_only=True):
    rank: int
    busy_frac: float | None
    power_busy_w: float | None
    power_mean_w: float | None
    power_limit_w: float | None
    power_frac: float | None
    sm_active_pct: float | None
    samples: int
    verdict_code: str
    verdict: str


class SpinWait(Node, frozen=True, kw_only=True):
    rank: int
    start_ns: int
    dur_ns: int
    name: str
    power_w: float | None
    power_frac: float | None


class SpinWaits(Node, frozen=True, kw_only=True):
    count: int
    total_ns: int
    largest: tuple[SpinWait, ...]


class Power(Node, frozen=True, kw_only=True):
    has_counters: bool
    per_rank: tuple[PowerRank, ...]
    spin_waits: SpinWaits
    verdicts: tuple[str, ...]


# ---------------------------------------------------------------- steps
class StepRow(Node, frozen=True, kw_only=True):
    """One (rank, step): host range ``dur_ns``, GPU span, ``step_ns`` (the step's time: the larger of the two),
    summed kernel time per category (not exclusive)."""

    rank: int
    step_id: int
    mode: str | None
    batch_size: int | None
    tokens: int | None
    start_ns: int
    dur_ns: int
    profiled: bool | None
    moe_gemm_ns: int | None
    moe_routing_ns: int | None
    attention_ns: int | None
    communication_ns: int | None
    dense_gemm_ns: int | None
    other_compute_ns: int | None
    memory_ns: int | None
    gpu_ops: int
    gpu_span_ns: int | None
    step_ns: int
    comm_wait_ns: int | UnsetType = UNSET
    no_gpu: bool


class StepSummary(Node, frozen=True, kw_only=True):
    """Per (mode, batch size), over the job steps ``step_time`` counts (the slowest rank's): percentiles of the host
    range (``p50_ns``...) and of the step time (``step_p50_ns``...), tokens per step over ``step_p50_ns``."""

    mode: str | None
    batch_size: int | None
    steps: int
    p50_ns: Num | None
    p90_ns: Num | None
    max_ns: int | None
    gpu_span_p50_ns: Num | None
    step_p50_ns: Num | None
    step_p90_ns: Num | None
    tokens_per_s: float | None


class StepTimeNode(Node, frozen=True, kw_only=True):
    """The trace's step time (:mod:`tracekit.analysis.steptime`, the one every view prints): the primary shape's
    job-step p50/p90 and tokens/s."""

    mode: str | None
    tokens: int | None
    n_steps: int
    step_ns_p50: Num
    step_ns_p90: Num
    tokens_per_s: float | None
    n_job_steps: int


class UnprofiledSteps(Node, frozen=True, kw_only=True):
    """The program clock's unprofiled steps of the primary shape, matched to the profiled ones
    (:func:`tracekit.analysis.unprofiled.matched_timing`: what replay calibrates to)."""

    mode: str | None
    tokens: int | None
    n_steps: int
    step_ns_p50: Num
    noise: float | None
    tokens_per_s: float | None


class Steps(Node, frozen=True, kw_only=True):
    count: int
    step_time: StepTimeNode | None
    unprofiled: UnprofiledSteps | None
    summary: tuple[StepSummary, ...]
    steps: tuple[StepRow, ...]
    without_gpu: int
    quality: tuple[QualityItem, ...]


# ---------------------------------------------------------------- verdicts
class KernelEfficiency(Node, frozen=True, kw_only=True):
    rank: int
    op: str
    input_dims: str | None
    dtype: str | None
    kernel: str
    category: str | None
    count: int
    gpu_ns: int
    tflops_per_s: float | None
    gb_per_s: float | None
    flops_per_byte: float | None
    peak_flops_per_s: float | None
    ceiling_flops_per_s: float | None
    efficiency: float | None
    flag: str | None
    bound: bool | None


class MoeShape(Node, frozen=True, kw_only=True):
    hidden: int
    inter: int
    experts: int
    top_k: int
    layers: int
    dtype: str
    impl: str | None


class MoeGemmRank(Node, frozen=True, kw_only=True):
    rank: int
    steps: int
    tokens: int
    gpu_ns: int
    launches: int
    launches_per_layer_step: float
    top_kernel: str | None
    tile: str | None
    tflops_per_s: float
    flops: float
    bytes_bound: float
    device: str | UnsetType = UNSET
    peak_flops_per_s: float | UnsetType = UNSET
    pct_of_peak: float | UnsetType = UNSET
    weight_gb_per_s_max: float | UnsetType = UNSET
    hbm_gb_per_s: float | UnsetType = UNSET
    at_memory_limit: bool | UnsetType = UNSET
    roofline_pct_max: float | None | UnsetType = UNSET


class MoeGemm(Node, frozen=True, kw_only=True):
    """The MoE GEMM verdict: ``status`` ``ok`` (with ``shape`` and ``ranks``) or why there is no figure
    (``no_moe_gemm_kernels``, ``shape_unknown`` or ``no_token_counts``, the last two with ``needs``)."""

    status: str
    needs: str | UnsetType = UNSET
    shape: MoeShape | UnsetType = UNSET
    ranks: tuple[MoeGemmRank, ...] | UnsetType = UNSET
    bytes_are_bound: bool | UnsetType = UNSET


class MoeDetection(Node, frozen=True, kw_only=True):
    """How the MoE split was found (``tracekit.analysis.passes.moe_detection``): ``status`` ``detected`` / ``dense``
    (no MoE, a model's layers seen: a measured 0 %) / ``not_detected`` (no MoE and nothing recognizable: unknown, not
    0 %); ``sources``: % of GPU-op time made MoE by ``kernel_names``, ``launch_pattern``, ``module_context``;
    ``ambiguous_pct``: GEMMs inside an MoE block (or a loop like one) the pattern cannot attribute, counted dense;
    ``moe_gemm_range_pct``: MoE GEMM % with none and with all of them (None when there are none)."""

    status: str
    sources: dict[str, float]
    moe_gemm_pct: float
    ambiguous_pct: float
    moe_gemm_range_pct: tuple[float, float] | None


class ExpertLayer(Node, frozen=True, kw_only=True):
    rank: int
    layer: int
    steps: int
    max_tokens: int
    mean_tokens: float
    max_over_mean: float
    active_experts_mean: float


class ExpertWorst(Node, frozen=True, kw_only=True):
    rank: int
    step_id: int
    layer: int
    max_tokens: int
    active: int
    pairs: int
    tokens: int
    mean_tokens: float
    max_over_mean: float


class ExpertLoad(Node, frozen=True, kw_only=True):
    status: str
    needs: str | UnsetType = UNSET
    source: str | UnsetType = UNSET
    top_k: int | UnsetType = UNSET
    n_experts: int | None | UnsetType = UNSET
    mean_basis: str | UnsetType = UNSET
    layers: tuple[ExpertLayer, ...] | UnsetType = UNSET
    worst: ExpertWorst | UnsetType = UNSET
    per_rank_max_over_mean: dict[str, float] | UnsetType = UNSET


class Interconnect(Node, frozen=True, kw_only=True):
    """Per collective group: measured bus bandwidth against the path models, the likely path, the savings."""

    pg: str | None
    coll_name: str | None
    bytes_p50: float | UnsetType = UNSET
    bus_bw_p50_bytes_per_s: float | UnsetType = UNSET
    model_bus_bw_bytes_per_s: dict[str, float] | UnsetType = UNSET
    path: str | None
    fraction_of_best: float | UnsetType = UNSET
    best_path: str | UnsetType = UNSET
    transfer_ns: int
    transfer_share: float
    saving_ns: int | UnsetType = UNSET
    calls_per_step: float | None | UnsetType = UNSET
    fusion_saving_ns_per_step: int | UnsetType = UNSET
    saving_ns_max: int | UnsetType = UNSET
    needs: str | UnsetType = UNSET


# ---------------------------------------------------------------- next win
class Replayed(Node, frozen=True, kw_only=True):
    """What next win replayed: the whole trace, or ``steps`` of ``of_steps`` job steps in ``stretches``; and, when one
    job step of every rank is over the sample's budget, only ``ranks`` of ``of_ranks`` (whole coupled groups)."""

    whole: bool
    why: str | UnsetType = UNSET
    steps: int | UnsetType = UNSET
    of_steps: int | UnsetType = UNSET
    stretches: tuple[tuple[int, int], ...] | UnsetType = UNSET
    rows: int | UnsetType = UNSET
    ranks: tuple[int, ...] | UnsetType = UNSET
    of_ranks: int | UnsetType = UNSET


class NextWinBaseline(Node, frozen=True, kw_only=True):
    """``step_ns_p50``: the calibrated replay's (on the program's clock when calibrated), which rows compare to;
    ``profiled_step_ns_p50``: the trace's step time (``steps.step_time``)."""

    step_ns_p50: Num
    tokens_per_s: float | None
    calibrated: bool
    measured_step_ns_p50: Num | None
    profiled_step_ns_p50: Num | None
    replayed: Replayed


class Confidence(Node, frozen=True, kw_only=True):
    """How far replay was from changes of this kind actually made (:mod:`tracekit.replay.accuracy`)."""

    kind: str
    error_median: float
    error_max: float
    pairs: int


class NextWinRow(Node, frozen=True, kw_only=True):
    """A change that can be made as stated (``needs`` empty), or one that needs others first; ``then``: the
    changes that need this one (their prediction is of the whole sequence)."""

    spec: str
    what: str
    needs: tuple[str, ...]
    step_ns_p50: Num
    tokens_per_s: float | None
    change: float
    within_noise: bool | None
    confidence: Confidence | None
    then: tuple["NextWinRow", ...] | UnsetType = UNSET


class Skipped(Node, frozen=True, kw_only=True):
    what: str
    why: str


class NextWin(Node, frozen=True, kw_only=True):
    status: str
    why: str | UnsetType = UNSET
    baseline: NextWinBaseline | UnsetType = UNSET
    rows: tuple[NextWinRow, ...]
    skipped: tuple[Skipped, ...]


# ---------------------------------------------------------------- the whole object
class Sections(Node, frozen=True, kw_only=True):
    """``tracekit analyze --json`` (docs/analyze_json.md): the pipeline's sections, then every registered
    analysis' (absent without the cross-rank pass), findings, next win, quality."""

    schema_version: int
    trace_schema_version: int | None
    world_size: int | None
    device_mode: str
    window: WindowInfo
    buckets: tuple[str, ...]
    ranks: tuple[RankBreakdown, ...]
    overall: Overall
    top_kernels: dict[str, tuple[TopKernel, ...]]
    uncategorized_top: tuple[UncategorizedKernel, ...]
    stalls: tuple[Stall, ...] | UnsetType = UNSET
    collectives: Collectives | UnsetType = UNSET
    idle_causes_ns: dict[str, IdleCauses] | UnsetType = UNSET
    idle_gaps: dict[str, tuple[IdleGap, ...]] | UnsetType = UNSET
    pcie_phases: tuple[PciePhase, ...] | UnsetType = UNSET
    power: Power | UnsetType = UNSET
    steps: Steps | UnsetType = UNSET
    kernel_efficiency: tuple[KernelEfficiency, ...] | UnsetType = UNSET
    moe_gemm: MoeGemm | UnsetType = UNSET
    expert_load: ExpertLoad | UnsetType = UNSET
    moe_detection: MoeDetection | UnsetType = UNSET
    interconnect: tuple[Interconnect, ...] | UnsetType = UNSET
    findings: tuple[str, ...]
    next_win: NextWin | UnsetType = UNSET
    quality: tuple[QualityItem, ...]
    trace: str | UnsetType = UNSET


#: the sections an analysis of the registry fills, by JSON key (the others are the pipeline's own)
ANALYSIS_FIELDS: tuple[str, ...] = ("stalls", "collectives", "idle_causes_ns", "idle_gaps", "pcie_phases", "power", "steps",
                                    "kernel_efficiency", "moe_gemm", "expert_load", "moe_detection", "interconnect")

T = TypeVar("T")

#: version of the analyze JSON object (``Sections.schema_version``): bumped on an incompatible change; keys are only added
SCHEMA_VERSION = 1


def schema_doc() -> dict[str, Any]:
    """The JSON Schema of ``analyze --json`` (``schemas/analyze_v1.json``), generated from :class:`Sections`.

    Regenerate after changing the tree: ``python -c "from tracekit.analysis.sections import schema_doc; import json;
    print(json.dumps(schema_doc(), indent=1, sort_keys=True))" > schemas/analyze_v1.json``."""
    doc = msgspec.json.schema(Sections)
    return {"title": "tracekit analyze --json", "version": SCHEMA_VERSION,
            "description": "docs/analyze_json.md; generated from tracekit.analysis.sections.Sections", **doc}


def build(value: Any, typ: type[T]) -> T:
    """``value`` (a JSON-ready dict/list, or already the typed node) as ``typ``; strict, unknown keys refused.

    A :class:`msgspec.ValidationError` names the path of the offending field (``$.steps.steps[0].xyz``)."""
    if isinstance(value, Struct) and isinstance(value, typ):
        return value
    return msgspec.convert(value, typ, from_attributes=False)
