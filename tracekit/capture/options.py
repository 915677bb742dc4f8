"""Options of a built-in workload capture (picklable; shared by parent and ranks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tracekit._errors import UsageError

__all__ = ["CaptureOptions", "host_cores", "default_cpu_ranks", "MAX_DEFAULT_CPU_RANKS"]

#: the built-in workload's default CPU rank count is at most this (more ranks add collectives, not insight)
MAX_DEFAULT_CPU_RANKS = 8


def host_cores() -> int:
    """CPU cores this process may run on (its affinity mask; all cores where that is unknown)."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def default_cpu_ranks(cores: int) -> int:
    """Default gloo ranks on ``cores`` cores: one per 2 cores (a rank's forward thread and its gloo worker
    each want a core), at least 2 (a tensor-parallel run needs two ranks for any collective) and at most
    :data:`MAX_DEFAULT_CPU_RANKS`. On 2 cores: 2 ranks, so no rank waits for a core that another holds."""
    return max(2, min(MAX_DEFAULT_CPU_RANKS, cores // 2))


@dataclass
class CaptureOptions:
    """Everything a rank needs to run and record the built-in workload.

    ``device``: ``cuda`` or ``cpu`` (resolved by the parent). ``world``: ranks.
    Model/serving fields left ``None`` take the device's defaults
    (full GLM-5 widths on GPUs, small on CPU).
    """

    duration_s: float = 30.0
    device: str = "cpu"
    world: int = 8
    moe_impl: str = "grouped"
    host_sync: bool = False
    cuda_graphs: bool = False
    layers: int | None = None
    hidden: int | None = None
    experts: int | None = None
    max_batch: int | None = None
    prompt_len: int | None = None
    delay_rank: int | None = None
    delay_ms: float = 0.0
    delay_every: int = 1
    warmup_steps: int = 8
    #: steps recorded before the first profiler window; None: 80 with an explicit --profile-steps, else ~3 s of
    #: steps (8 to 80); the steps between windows are unprofiled too (replay calibrates on 2 x 40 of them)
    unprofiled_steps: int | None = None
    #: steps per profiler window and the period in steps; None (default): windows by time, ~1 s each, holding
    #: about a third of the wall time (``profiler.AutoWindows``; rank 0 decides, every rank applies)
    profile_steps: int | None = None
    profile_every: int | None = None
    max_windows: int = 0
    min_steps: int = 0  # keep running past the duration until this many measured steps
    record_shapes: bool = False
    telemetry: bool = True
    telemetry_period_s: float = 0.05
    control_every: int = 4  # steps between stop checks (a tiny gloo allreduce)
    seed: int = 1234
    timeout_s: float = 300.0  # collective timeout
    crash_rank: int | None = None  # testing: this rank dies at crash_step
    crash_step: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> "CaptureOptions":
        if self.duration_s <= 0:
            raise UsageError(f"--duration {self.duration_s}: must be > 0")
        if self.world < 1:
            raise UsageError(f"--ranks {self.world}: must be >= 1")
        if self.moe_impl not in ("loop", "grouped"):
            raise UsageError(f"--moe-impl {self.moe_impl!r}: choose loop or grouped")
        if self.delay_rank is not None and not (0 <= self.delay_rank < self.world):
            raise UsageError(f"--delay-rank {self.delay_rank}: no such rank in a world of {self.world}")
        if self.cuda_graphs and self.device != "cuda":
            raise UsageError("--cuda-graphs needs GPUs; drop it for a CPU run")
        if self.cuda_graphs and (self.moe_impl != "grouped" or self.host_sync):
            raise UsageError("--cuda-graphs needs --moe-impl grouped without --host-sync (graphs cannot hold host syncs)")
        if self.unprofiled_steps is not None and self.unprofiled_steps < 0:
            raise UsageError(f"--unprofiled-steps {self.unprofiled_steps}: must be >= 0")
        if self.profile_steps is not None and self.profile_steps < 0:
            raise UsageError(f"--profile-steps {self.profile_steps}: must be >= 0 (0: no profiler)")
        if self.profile_every is not None and self.profile_every < 1:
            raise UsageError(f"--profile-every {self.profile_every}: must be >= 1")
        if self.profile_every is not None and self.profile_steps is None:
            raise UsageError("--profile-every needs --profile-steps (without both, windows follow the step time)")
        if self.profile_steps and self.profile_every is not None and self.profile_every < self.profile_steps:
            raise UsageError("--profile-every must be >= --profile-steps")
        return self

    @property
    def profiling(self) -> bool:
        """Whether the ranks open profiler windows at all (``--profile-steps 0``: no)."""
        return self.profile_steps is None or self.profile_steps > 0

    def with_(self, **kw: Any) -> "CaptureOptions":
        return replace(self, **kw)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
