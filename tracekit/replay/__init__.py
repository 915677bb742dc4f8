"""Dependency-graph replay and what-if prediction (see ``docs/replay.md``)."""

from tracekit.replay.api import Prediction, Replayer, ReplayResult, replay

__all__ = ["replay", "ReplayResult", "Prediction", "Replayer"]
