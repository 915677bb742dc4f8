"""How far replay's predictions were from changes actually made: the accuracy table of the what-if truth set.

Measured by ``tests/replay/truth/pairs.py`` on one H200 and three H100s (the CUDA-graph knob pairs, the built-in and
Qwen3-30B pairs again, and two runs profiled after all their unprofiled rounds; ``docs/replay.md``, "Accuracy": what-if × model ×
measured × predicted × error × noise); ``tests/replay/test_truth.py`` recomputes the table and fails when these
figures no longer match it. The fabric row comes from the 2 × H200 acceptance (``tracekit.replay.acceptance``: NCCL
over NVLink ↔ host memory, knob and oracle). Errors are of the predicted step ratio against the measured one.

Next win prints the row of each change as its confidence (:func:`confidence`).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ACCURACY", "Accuracy", "confidence", "kind_of"]


@dataclass(frozen=True)
class Accuracy:
    """Errors of one what-if kind over the truth pairs: median and largest |error|, pair count, the noise seen."""

    kind: str
    error_median: float
    error_max: float
    pairs: int
    noise_max: float  # largest same-run noise (baseline repeat) among those pairs

    def text(self) -> str:
        n = f"{self.pairs} measured change{'s' if self.pairs != 1 else ''}"
        return f"replay within {self.error_max:.0%} on {n} (median {self.error_median:.0%})"


#: kind -> accuracy (tests/replay/truth; see the module doc)
ACCURACY: dict[str, Accuracy] = {a.kind: a for a in (
    Accuracy("knob", 0.0194, 0.152, 13, 0.402),
    Accuracy("cuda-graph", 0.0616, 0.161, 5, 0.288),
    Accuracy("no-host-sync", 0.0425, 0.092, 5, 0.262),
    Accuracy("no-host-sync+cuda-graph", 0.0424, 0.111, 5, 0.262),
    Accuracy("grouped-experts", 0.0733, 0.231, 13, 0.321),
    Accuracy("fabric", 0.052, 0.068, 4, 0.035),
)}


def kind_of(spec: str) -> str:
    """The accuracy kind of a what-if spec: ``grouped-experts``, ``no-host-sync``, ``cuda-graph``, their
    combinations, ``fabric`` (collective=bw:…/preset) or ``knob`` (target=factor)."""
    parts = [p.strip().lower() for p in spec.split("+") if p.strip()]
    names = []
    for p in parts:
        if p.startswith(("cuda-graph", "cudagraph", "graph")):
            names.append("cuda-graph")
        elif p in ("no-host-sync", "no-sync", "remove-syncs", "nosync"):
            names.append("no-host-sync")
        elif p.startswith("grouped"):
            names.append("grouped-experts")
        else:
            rhs = p.partition("=")[2]
            names.append("knob" if _is_number(rhs) else "fabric")
    return "+".join(dict.fromkeys(names))


def _is_number(s: str) -> bool:
    try:
        float(s.lstrip("x×"))
    except ValueError:
        return False
    return True


def confidence(spec: str) -> Accuracy | None:
    """The accuracy row of a spec's kind; a combination without its own row takes its least accurate part's."""
    k = kind_of(spec)
    if k in ACCURACY:
        return ACCURACY[k]
    rows = [ACCURACY[p] for p in k.split("+") if p in ACCURACY]
    return max(rows, key=lambda a: a.error_max) if rows else None
