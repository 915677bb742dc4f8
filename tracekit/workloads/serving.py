"""Continuous-batching decode loop over :class:`~tracekit.workloads.moe.TPMoEModel`.

Plain PyTorch and Python; knows nothing of tracekit. The schedule is
deterministic (same seed on every rank), so all TP ranks run the same shapes
in the same order without talking to each other, like SGLang's TP workers
after the scheduler's broadcast.

Each :meth:`ServingLoop.step` runs one forward: a prefill (``EXTEND``) of a few
waiting requests every ``prefill_every`` steps while slots are free, otherwise
a decode (``DECODE``) of every running request. The step ends with the host
reading the sampled tokens back (one sync per step, as a server does).
Callers may replace :attr:`ServingLoop.forward` with a wrapped version of
itself (that is how capture instruments it).
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import torch

from tracekit.workloads.moe import TPMoEModel

__all__ = ["ServeConfig", "DelayInjector", "ServingLoop"]


@dataclass
class ServeConfig:
    max_batch: int = 64
    prompt_len: int = 256
    out_len_min: int = 64
    out_len_max: int = 256
    prefill_every: int = 16
    prefill_max_seqs: int = 4
    cuda_graphs: bool = False
    seed: int = 99

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class DelayInjector:
    """Straggler injector: sleep ``delay_ms`` before every ``every``-th forward on ``rank``.

    ``events`` keeps the ground truth: ``(step, start_ns, dur_ns)`` with
    CLOCK_REALTIME ns.
    """

    rank: int
    delay_rank: int | None = None
    delay_ms: float = 0.0
    every: int = 1
    events: list[tuple[int, int, int]] = field(default_factory=list)

    @property
    def active(self) -> bool:
        return self.delay_rank is not None and self.delay_rank == self.rank and self.delay_ms > 0

    def __call__(self, step: int) -> None:
        if self.active and step % max(1, self.every) == 0:
            t0 = time.time_ns()
            time.sleep(self.delay_ms / 1e3)
            self.events.append((step, t0, time.time_ns() - t0))


class ServingLoop:
    """Deterministic continuous batching; ``step()`` returns ``(mode, n_seqs, tokens)``."""

    def __init__(self, model: TPMoEModel, cfg: ServeConfig, delay: DelayInjector | None = None) -> None:
        self.model, self.cfg, self.delay = model, cfg, delay
        self.dev = model.device
        self.rng = random.Random(cfg.seed)
        self.running: list[int] = []  # remaining output tokens per running request
        self.step_index = 0
        self.tokens_done = 0
        self.last = torch.zeros(cfg.max_batch, dtype=torch.int64, device=self.dev)
        gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
        pool = cfg.prefill_max_seqs * cfg.prompt_len
        self.prompt_pool = torch.randint(0, model.cfg.vocab, (pool,), generator=gen).to(self.dev)
        self.graphs: dict[int, tuple[Any, torch.Tensor, torch.Tensor]] = {}
        self.forward: Callable[[torch.Tensor, str, int], list[int]] = self._forward_and_read

    # -- one forward + host readback -------------------------------------
    def _forward_and_read(self, tokens: torch.Tensor, mode: str, n_seqs: int) -> list[int]:
        if self.delay is not None:
            self.delay(self.step_index)
        if mode == "DECODE" and self.graphs:
            bucket = self._bucket(n_seqs)
            graph, static_in, static_out = self.graphs[bucket]
            static_in[:n_seqs].copy_(tokens)
            graph.replay()
            out = static_out[:n_seqs]
        else:
            out = self.model(tokens, mode, n_seqs)
        if n_seqs:
            self.last[: min(n_seqs, self.cfg.max_batch)].copy_(out[: self.cfg.max_batch])
        return out.tolist()  # the sampler's readback: one sync per step

    def _bucket(self, n: int) -> int:
        b = 1
        while b < n:
            b *= 2
        return min(b, self.cfg.max_batch)

    def capture_graphs(self) -> int:
        """Capture one CUDA graph per decode bucket (powers of two up to max_batch)."""
        if self.dev.type != "cuda":
            raise RuntimeError("CUDA graphs need a CUDA device")
        if self.model.cfg.moe_impl != "grouped" or self.model.cfg.host_sync:
            raise RuntimeError("CUDA graphs need --moe-impl grouped without --host-sync (no host syncs)")
        buckets = sorted({self._bucket(n) for n in range(1, self.cfg.max_batch + 1)}, reverse=True)
        pool = torch.cuda.graph_pool_handle()
        s = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        for b in buckets:
            static_in = torch.zeros(b, dtype=torch.int64, device=self.dev)
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    self.model(static_in, "DECODE", b)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                static_out = self.model(static_in, "DECODE", b)
            self.graphs[b] = (graph, static_in, static_out)
        torch.cuda.synchronize()
        return len(self.graphs)

    # -- scheduling --------------------------------------------------------
    def _plan(self) -> tuple[str, int]:
        cfg = self.cfg
        free = cfg.max_batch - len(self.running)
        if free > 0 and (not self.running or self.step_index % cfg.prefill_every == 0):
            return "EXTEND", min(free, cfg.prefill_max_seqs)
        return "DECODE", len(self.running)

    def step(self) -> tuple[str, int, int]:
        """Run one forward; returns (mode, n_seqs, tokens processed)."""
        cfg = self.cfg
        mode, n = self._plan()
        if mode == "EXTEND":
            tokens = self.prompt_pool[: n * cfg.prompt_len]
            self.forward(tokens, mode, n)
            self.running.extend(self.rng.randint(cfg.out_len_min, cfg.out_len_max) for _ in range(n))
            ntok = n * cfg.prompt_len
        else:
            tokens = self.last[:n]
            self.forward(tokens, mode, n)
            self.running = [r - 1 for r in self.running if r > 1]
            ntok = n
        self.step_index += 1
        self.tokens_done += ntok
        return mode, n, ntok
