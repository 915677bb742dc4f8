"""Writing a directory dataset (``convert --layout dataset``): one partition per rank, the metadata once.

Layout: ``<out>/rank=<r>/part-0.parquet`` plus ``<out>/_common_metadata`` (:mod:`tracekit.schema`).

How it is built (:class:`DatasetBuild`), inside convert's part directory beside the output (same
filesystem, so every step below is a rename):

1. **stage** (:func:`tracekit.ingest.convert.stage_source`, a task: in-process, a worker process or a cluster worker): read and
   finalize one source and write each rank it holds, sorted by time, in the final format, to a staged
   file named after the source (a temporary name renamed into place when complete). A task that fails
   or is killed leaves at most a temporary file in the part directory, never a partition;
2. **commit**, per rank, once every rank is staged and the clocks are aligned: the staged file is
   renamed to ``data/rank=<r>/part-0.parquet`` when it is the partition as written (one part, its rank as
   staged, no clock offset, no capture rows to merge); otherwise :func:`rewrite_rank` (also a task)
   streams its parts into the partition with the offset and window shifts applied
   (:func:`tracekit.ingest.rankwrite.write_rank`), again through a temporary name;
3. **publish**: ``data/_common_metadata`` is written, then ``data`` is renamed to ``<out>``.

An error removes the part directory: no partition of a failed conversion is ever visible at ``<out>``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import polars as pl

from tracekit._errors import OutputError, os_reason
from tracekit.schema import TraceWriter, is_dataset, write_dataset_meta

__all__ = ["DatasetBuild", "rewrite_rank", "check_dataset_output"]


def check_dataset_output(out: Path, *, force: bool) -> None:
    """Refuse a dataset output that exists (without ``force``), is not a tracekit dataset, or has no parent."""
    if out.exists() or out.is_symlink():
        if not out.is_dir() or out.is_symlink():
            raise OutputError(f"{out}: exists and is not a directory; a dataset is a directory: choose another -o")
        if not is_dataset(out):
            if any(out.iterdir()):
                raise OutputError(f"{out}: is a directory that is not a tracekit dataset; refusing to replace it: choose another -o")
        elif not force:
            raise OutputError(f"{out}: exists; pass --force to overwrite")
    parent = out.parent if str(out.parent) else Path(".")
    if not parent.is_dir():
        raise OutputError(f"{out}: directory {parent} does not exist; create it first")


def sealed(parts: list[dict[str, Any]]) -> bytes:
    """``parts`` as one opaque task argument: Dask walks every list and dict of a task's arguments looking for keys,
    and a rank's staged metadata holds one entry per step (64 ranks x 28k steps: 2.4 s of the client's time in
    ``submit``); bytes it passes through whole, and the scheduler needs no tracekit class to hold them."""
    return pickle.dumps(parts, protocol=pickle.HIGHEST_PROTOCOL)


def rewrite_rank(dest: str, r: int, parts: list[dict[str, Any]] | bytes, offset: int, extra: pl.DataFrame | None,
                 out_label: str) -> tuple[int, int | None, int | None]:
    """Task: rank ``r``'s staged parts streamed into its partition ``dest`` (clock offset, window shifts,
    capture rows: :func:`tracekit.ingest.rankwrite.write_rank`); returns (rows, first ts, last end)."""
    from tracekit._memory import tune_runtime
    from tracekit.ingest.rankwrite import write_rank

    staged: list[dict[str, Any]] = pickle.loads(parts) if isinstance(parts, bytes) else parts  # noqa: S301 - our own sealed()
    tune_runtime()
    with contextlib.suppress(FileExistsError):  # never its parents: a removed part directory stays removed
        os.mkdir(os.path.dirname(dest))
    w = TraceWriter(dest, force=True, label=out_label, final=False, part_rank=r)
    try:
        res = write_rank(w, r, staged, offset, extra)
        w.close()
    except BaseException:
        w.abort()
        raise
    return res


@dataclasses.dataclass
class DatasetBuild:
    """A dataset being built in ``part_dir`` (module docstring) and published at ``out``."""

    out: Path
    part_dir: str

    def __post_init__(self) -> None:
        self.root = Path(self.part_dir) / "data"
        self.src = Path(self.part_dir) / "src"
        try:
            self.root.mkdir()
            self.src.mkdir()
        except OSError as e:
            raise OutputError(f"{self.out}: cannot create a directory in {self.part_dir} {os_reason(e, writing=True)}") from None

    def staged(self, i: int) -> str:
        """Prefix of the staged files of source number ``i``."""
        return str(self.src / f"src-{i}")

    def partition(self, r: int) -> Path:
        return self.root / f"rank={r}" / "part-0.parquet"

    def commit(self, metas: Sequence[dict[str, Any]], ranks: Sequence[int], offsets: Mapping[int, int],
               extra_of: Callable[[int], pl.DataFrame | None], submit: Callable[..., Any] | None) -> tuple[int, int | None, int | None]:
        """Every rank's partition (module docstring, step 2); rewrites run through ``submit`` (an executor's, to run
        them as tasks) unless they merge capture rows. Returns (rows, first ts, last end) of the whole dataset."""
        pending, done = [], []
        for r in ranks:
            parts = sorted((m for m in metas if m["rank"] == r), key=lambda m: (m.get("window") or 0, m.get("first_ts_ns") or 0))
            ex = extra_of(r)
            if len(parts) == 1 and not offsets.get(r) and ex is None and parts[0]["written_rank"] == r:
                self._rename(parts[0]["part"], self.partition(r))
                done.append((parts[0]["written_rows"], parts[0]["written_lo"], parts[0]["written_hi"]))
            elif submit is not None and ex is None:
                pending.append(submit(rewrite_rank, str(self.partition(r)), r, sealed(parts), int(offsets.get(r, 0)), None, str(self.out)))
            else:
                done.append(rewrite_rank(str(self.partition(r)), r, parts, int(offsets.get(r, 0)), ex, str(self.out)))
        done += [f.result() for f in pending]
        lo = [x[1] for x in done if x[1] is not None]
        hi = [x[2] for x in done if x[2] is not None]
        return sum(x[0] for x in done), min(lo, default=None), max(hi, default=None)

    def write_orphans(self, orphan: pl.DataFrame) -> int:
        """Capture rows of ranks the trace lacks (sorted by rank, time), one partition per rank."""
        for (r,), df in orphan.partition_by("rank", as_dict=True, maintain_order=True).items():
            dest = self.partition(int(r))
            dest.parent.mkdir(exist_ok=True)
            w = TraceWriter(dest, force=True, label=str(self.out), final=False, part_rank=int(r))
            try:
                w.write(df)
                w.close()
            except BaseException:
                w.abort()
                raise
        return orphan.height

    def _rename(self, staged: str, dest: Path) -> None:
        try:
            dest.parent.mkdir(exist_ok=True)
            os.replace(staged, dest)
        except OSError as e:
            raise OutputError(f"{self.out}: cannot write {os_reason(e, writing=True)}") from None

    def publish(self, meta: Mapping[str, Any], force: bool) -> None:
        """Write the metadata once, then move the dataset to ``out`` (replacing an old dataset under ``force``)."""
        from tracekit import _interrupt

        write_dataset_meta(self.root, meta)
        with _interrupt.committing():
            check_dataset_output(self.out, force=force)
            try:
                if self.out.exists():
                    old = Path(self.part_dir) / "old"
                    os.replace(self.out, old)  # the old dataset goes to the part directory, removed with it
                os.replace(self.root, self.out)
            except OSError as e:
                raise OutputError(f"{self.out}: cannot write {os_reason(e, writing=True)}") from None

