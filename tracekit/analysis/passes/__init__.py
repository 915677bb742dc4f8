"""The per-rank passes: every module here registers its :class:`tracekit.analysis.registry.Analysis`
(the breakdown, a pipeline stage, declares its columns). :func:`tracekit.analysis.registry.analyses` imports
them all once, so a new analysis is one new module here.
"""
