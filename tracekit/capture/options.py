"""Options of a built-in workload capture (picklable; shared by parent and ranks)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from tracekit._errors import UsageError

__all__ = ["CaptureOptions"]


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
    unprofiled_steps: int = 80  # recorded before the first profiler window (2 x 40 for replay calibration)
    profile_steps: int = 5
    profile_every: int = 200
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
        if self.profile_steps > 0 and self.profile_every < self.profile_steps:
            raise UsageError("--profile-every must be >= --profile-steps")
        return self

    def with_(self, **kw: Any) -> "CaptureOptions":
        return replace(self, **kw)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
