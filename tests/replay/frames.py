"""Hand-built trace frames for replay tests (times in µs → ns)."""

from __future__ import annotations

from typing import Any

from tracekit.schema import frame_from_rows

US = 1000


class TraceBuilder:
    """Tiny DSL: runtime calls on the launching thread, GPU ops launched by them, step rows."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.corr = 0

    def call(self, rank: int, ts: float, dur: float, name: str = "cudaLaunchKernel", tid: int = 1,
             step_id: int | None = None) -> int:
        self.corr += 1
        self.rows.append(dict(rank=rank, kind="runtime", ts_ns=int(ts * US), dur_ns=int(dur * US), name=name, tid=tid,
                              pid=100 + rank, correlation=self.corr, step_id=step_id))
        return self.corr

    def op(self, rank: int, ts: float, dur: float, corr: int | None, *, name: str = "k", category: str = "other_compute",
           family: str = "other", stream: int = 7, kind: str = "kernel", step_id: int | None = None, **extra: Any) -> None:
        launch = next((r for r in self.rows if r["kind"] == "runtime" and r["correlation"] == corr and r["rank"] == rank),
                      None) if corr is not None else None
        self.rows.append(dict(rank=rank, kind=kind, ts_ns=int(ts * US), dur_ns=int(dur * US), name=name,
                              category=category, family=family, stream=stream, device=rank, correlation=corr,
                              launch_ts_ns=launch["ts_ns"] if launch else None,
                              launch_dur_ns=launch["dur_ns"] if launch else None,
                              launch_tid=launch["tid"] if launch else None,
                              launch_name=launch["name"] if launch else None, step_id=step_id, **extra))

    def launch(self, rank: int, ts: float, dur: float, op_ts: float, op_dur: float, **kw: Any) -> int:
        c = self.call(rank, ts, dur, name=kw.pop("launch_name", "cudaLaunchKernel"), step_id=kw.get("step_id"))
        self.op(rank, op_ts, op_dur, c, **kw)
        return c

    def sync(self, rank: int, ts: float, dur: float, name: str = "cudaStreamSynchronize", stream: int | None = 7,
             sync_name: str = "Stream Sync", step_id: int | None = None) -> int:
        c = self.call(rank, ts, dur, name=name, step_id=step_id)
        if stream is not None:
            self.rows.append(dict(rank=rank, kind="sync", ts_ns=int(ts * US), dur_ns=int(dur * US), name=sync_name,
                                  stream=stream, correlation=c, tid=-1))
        return c

    def step(self, rank: int, ts: float, dur: float, step_id: int, *, profiled: bool = True, tokens: int = 8,
             tid: int | None = 1, src: str = "user_annotation") -> None:
        self.rows.append(dict(rank=rank, kind="step", ts_ns=int(ts * US), dur_ns=int(dur * US),
                              name=f"step[DECODE bs={tokens}]", step_id=step_id, profiled=profiled, tokens=tokens,
                              step_mode="DECODE", tid=tid, src=src))

    def frame(self):
        return frame_from_rows(self.rows)
