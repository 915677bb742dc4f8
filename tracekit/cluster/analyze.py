"""``analyze --cluster``: the per-rank work of :func:`tracekit.analysis.stage.pipeline.run_analysis` as Dask tasks.

The same driver, the same functions; only where they run changes (:class:`ClusterRunner`, a
:class:`~tracekit.analysis.stage.pipeline.RankRunner`):

1. **overview**, one task per rank (:func:`_overview_task`): the rank's aggregate row, its small rows (collective
   kernels and steps) and its profiler-window bounds (:func:`tracekit.core.window.span_bounds`); the client
   concatenates them (:func:`tracekit.core.window.overview_of`, :func:`~tracekit.core.window.combine_bounds`);
2. window and cross-rank plan on the client, from those small rows only (collective matching, clock offsets,
   stall plan);
3. **map**, one task per rank (:func:`_rank_task`): the rank's rows read by the worker from the trace
   (a ``trace.parquet`` or a dataset: a path every worker can read), :func:`~tracekit.analysis.stage.pipeline.analyze_rank`
   with the plan — broadcast once to every worker without the per-rank tables, plus the rank's own instance
   and wait rows — and back comes the rank's small :class:`~tracekit.analysis.stage.pipeline.RankPart`;
4. reduce on the client as the parts arrive (exact, as locally: :class:`~tracekit.analysis.stage.pipeline._Reduce`); the stages after the finish (next win: a bounded replay sample)
   run as one task on a worker.

No kernel table ever reaches the client. A rank whose task fails is a one-line error naming the rank; under
``keep_going`` the analysis is run again without it (the answer is then ``analyze --ranks`` of the others, with a
``rank_failed`` flag). A worker that dies is replaced and its tasks rerun by Dask (the same answer); one that dies
on the same rank :data:`ALLOWED_FAILURES` + 1 times fails that rank.
"""

from __future__ import annotations

import dataclasses
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import polars as pl

from tracekit import _env, _interrupt
from tracekit._memory import release_memory
from tracekit._errors import RankError, TracekitError, UsageError
from tracekit.analysis.plan import CrossRankPlan
from tracekit.analysis.result import AnalysisResult
from tracekit.analysis.stage.pipeline import (AfterFinish, FinishedRun, RankPart, ScanSource, StageOutput, analyze_rank, sections_for,
                                              unreadable)
from tracekit.core.window import Overview, Window, combine_bounds, overview_of, rank_overview, span_bounds
from tracekit.schema import trace_ranks
from tracekit.trace_check import first_line

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["ClusterRunner", "analyze_cluster", "RankFailed"]

#: Dask's default ``distributed.scheduler.allowed-failures``: a task whose workers die more often than this fails
ALLOWED_FAILURES = 3


class RankFailed(RankError):
    """A rank's task failed; ``rank`` names it (-1: the stage after the finish); ``--keep-going`` leaves it out."""


def _source(path: str, ranks: Sequence[int] | None) -> ScanSource:
    """The trace as a task reads it: a dataset's partitions of ``ranks`` only, read and checked
    (:func:`tracekit.schema.open_trace`; the client checked the whole trace and holds its quality flags)."""
    from tracekit.analysis.stage.pipeline import ranks_filter
    from tracekit.schema import open_trace

    return ScanSource(path, ranks_filter(open_trace(path, ranks)[0], ranks))


def _maybe_die(rank: int) -> None:
    """Fault injection for the tests (:data:`tracekit._env.TEST_KILL_RANK`): this worker dies (SIGKILL) on ``rank``
    — once (a marker file records it) or, with ``always``, every time."""
    spec = _env.get(_env.TEST_KILL_RANK, "") or ""
    if not spec:
        return
    r, _, marker = spec.partition(":")
    if int(r) != rank:
        return
    if marker != "always":
        if os.path.exists(marker):
            return
        Path(marker).write_text("killed")
    os.kill(os.getpid(), signal.SIGKILL)


def _overview_task(path: str, ranks: Sequence[int] | None, rank: int, windows: list[list[int]] | None
                   ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame, pl.DataFrame | None]:
    """Task: one rank's aggregate row, small rows, step rows and (windowed capture) profiler-window bounds; a read
    that fails is a :class:`~tracekit._errors.RankError` naming the rank and its file."""
    _maybe_die(rank)
    lf = _source(path, [rank]).lazy()
    try:
        agg, small, steps = rank_overview(lf, rank)
        bounds = None
        if windows and len(windows) >= 2:
            cpu = bool(agg["has_cpu_dev"][0]) and not bool(agg["has_gpu"][0])
            bounds = span_bounds(lf.filter(pl.col("rank") == rank), windows, cpu_ranks=[rank] if cpu else [])
    except TracekitError:
        raise
    except Exception as e:  # noqa: BLE001 - a damaged partition or row group
        raise unreadable(path, e, rank) from None
    return agg, small, steps, bounds


def _rank_task(path: str, ranks: Sequence[int] | None, rank: int, win: Window, plan: CrossRankPlan | None,
               inst: pl.DataFrame | None, waits: pl.DataFrame | None, split: bool) -> RankPart:
    """Task: :func:`analyze_rank` of one rank, the plan completed with the rank's own instance and wait rows."""
    _maybe_die(rank)
    src = _source(path, [rank])
    if plan is not None and inst is not None and waits is not None:
        plan = dataclasses.replace(plan, inst=inst, waits=waits)
    (rs, df), = src.parts([rank])
    return analyze_rank(df, rs, win, plan, split, src.host(rs) if plan is not None else None)


def _after_task(stage: AfterFinish, path: str, ranks: Sequence[int] | None, ov: Overview, meta: Any, sections: Any,
                plan: CrossRankPlan) -> StageOutput:
    return stage(FinishedRun(_source(path, ranks), ov, meta, sections, plan))


def _slim(plan: CrossRankPlan, *, view: bool = False) -> CrossRankPlan:
    """What every worker needs of the plan: all but the per-rank tables (sent with each rank's task) and the
    finish-only summaries; ``view``: with the matched instances' view (the stages after the finish read it)."""
    empty = pl.DataFrame()
    return dataclasses.replace(plan, inst=plan.inst.clear(), waits=plan.waits.clear(), groups=empty, per_rank=empty,
                               view=plan.view if view else None)


class ClusterRunner:
    """A :class:`~tracekit.analysis.stage.pipeline.RankRunner` on a Dask client (module docstring)."""

    def __init__(self, client: "Client", path: str, ranks: Sequence[int] | None) -> None:
        self.client, self.path, self.ranks = client, path, (list(ranks) if ranks is not None else None)

    def _as_done(self, futs: list[Any], ranks: list[int]) -> Iterator[tuple[int, Any]]:
        """(index, result) of every future as its task ends, each fetched at once (a result kept on a worker that
        dies later would be lost and recomputed) and released; once all have ended, the first failure in rank
        order is a :class:`RankFailed`."""
        import time

        got: set[int] = set()
        bad: dict[int, Any] = {}
        while len(got) + len(bad) < len(futs):  # short sleeps: a Ctrl-C is heard between them
            _interrupt.check("analyze")
            busy = True
            for i, f in enumerate(futs):
                if i in got or i in bad or not f.done():
                    continue
                busy = False
                if f.status == "finished":
                    try:
                        res = f.result()
                        f.release()
                    except Exception:  # noqa: BLE001 - its result was lost with a worker: it is being recomputed
                        continue
                    got.add(i)
                    yield i, res
                    del res
                else:
                    bad[i] = f
            if busy:
                time.sleep(0.05)
        if bad:
            i = min(bad, key=lambda i: ranks[i])
            raise _failure(bad[i], ranks[i])

    def _gather(self, futs: list[Any], ranks: list[int]) -> list[Any]:
        """Every future's result, in order (:meth:`_as_done`)."""
        got = dict(self._as_done(futs, ranks))
        return [got[i] for i in range(len(futs))]

    def overview(self, source: Any, profiler_windows: list[list[int]] | None) -> tuple[Overview, pl.DataFrame | None]:
        present = [r for r in trace_ranks(self.path) if self.ranks is None or r in self.ranks]  # no partition read here
        futs = [self.client.submit(_overview_task, self.path, self.ranks, r, profiler_windows, pure=False, key=f"tk-overview-{r}-{_tag()}")
                for r in present]
        got = self._gather(futs, present)
        agg = pl.concat([a for a, _, _, _ in got]) if got else source.lazy().group_by("rank").agg(pl.len().alias("rows")).collect()
        ov = overview_of(agg, pl.concat([s for _, s, _, _ in got]) if got else pl.DataFrame(),
                         pl.concat([s for _, _, s, _ in got]) if got else pl.DataFrame())
        bounds = [b for _, _, _, b in got if b is not None]
        del got
        release_memory()  # the tasks' results, now concatenated: their heap pages go back before the plan
        return ov, combine_bounds(bounds) if bounds else None

    def map(self, source: Any, ranks: list[int], win: Window, plan: CrossRankPlan | None, split: bool) -> Iterator[RankPart]:
        common = self.client.scatter(_slim(plan), broadcast=True) if plan is not None else None  # type: ignore[no-untyped-call]
        inst_of = _by_rank(plan.inst) if plan is not None else {}
        waits_of = _by_rank(plan.waits) if plan is not None else {}
        futs = []
        for r in ranks:
            inst = inst_of.get(r, plan.inst.clear()) if plan is not None else None
            waits = waits_of.get(r, plan.waits.clear()) if plan is not None else None
            futs.append(self.client.submit(_rank_task, self.path, self.ranks, r, win, common, inst, waits, split, pure=False,
                                           key=f"tk-rank-{r}-{_tag()}"))
        for _i, part in self._as_done(futs, ranks):  # as each task ends: the reduce folds them as they come
            yield part

    def after(self, stage: AfterFinish, run: FinishedRun) -> StageOutput:
        # scattered, not in the task: the sections and the instances' view of many ranks are megabytes (a task
        # graph that large draws a warning from Dask and is held by the scheduler)
        args = self.client.scatter([run.overview, run.meta, sections_for(stage, run.sections), _slim(run.plan, view=True)])  # type: ignore[no-untyped-call]
        fut = self.client.submit(_after_task, stage, self.path, self.ranks, *args, pure=False, key=f"tk-after-{_tag()}")
        out: StageOutput = self._gather([fut], [-1])[0]
        return out


def _by_rank(df: pl.DataFrame) -> dict[int, pl.DataFrame]:
    return {int(k[0]): v for k, v in df.partition_by("rank", as_dict=True).items()} if df.height else {}


def _tag() -> str:
    return os.urandom(4).hex()


def _failure(fut: Any, rank: int) -> TracekitError:
    """The one-line error of a failed task (``rank`` -1: the stage after the finish)."""
    from distributed import KilledWorker

    where = f"rank {rank}" if rank >= 0 else "the next-win replay"
    try:
        exc = fut.exception()
    except Exception as e:  # noqa: BLE001 - cancelled, or the scheduler is gone
        exc = e
    if isinstance(exc, KilledWorker):  # it carries the scheduler's own allowed-failures (a remote one's may differ)
        n = int(getattr(exc, "allowed_failures", ALLOWED_FAILURES)) + 1
        return RankFailed(f"{where}: the worker running it died {n} times (killed: out of memory?); "
                          "give the workers more memory, or pass --keep-going to analyze the other ranks", rank, 5)
    if isinstance(exc, TracekitError):
        msg = str(exc)
        return RankFailed(msg if f"rank {rank}" in msg else f"{where}: {msg}", rank, exc.exit_code)
    if exc is None or fut.status == "cancelled":
        return RankFailed(f"{where}: the task was cancelled (the scheduler lost it); run the command again", rank, 5)
    return RankFailed(f"{where}: the task failed ({first_line(exc)})", rank, 2)


def analyze_cluster(client: "Client", path: str | Path, *, keep_going: bool = False, **opts: Any) -> AnalysisResult:
    """``tracekit.api.analyze_result(path, **opts)`` with the per-rank work on ``client`` (module docstring).

    ``path`` must be readable by every worker (a shared filesystem path). ``keep_going``: a failed rank is left
    out and flagged ``rank_failed`` (:func:`tracekit.api.analyze_kept`, as without a cluster); otherwise its
    error is raised."""
    from tracekit.api import analyze_kept, analyze_result

    if opts.get("steps_from") is not None:
        raise UsageError("--steps-from re-derives the steps of the whole trace in one process; drop --cluster or --steps-from")
    full = str(Path(path).absolute())
    if keep_going:
        return analyze_kept(full, runner_for=lambda ranks: ClusterRunner(client, full, ranks), **opts)
    return analyze_result(full, runner=ClusterRunner(client, full, opts.pop("ranks", None)), **opts)
