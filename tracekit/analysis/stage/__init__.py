"""The drivers: the cross-rank stage (:mod:`.crossrank`: plan, parts, finishes, findings) and the streaming
analysis (:mod:`.pipeline`: overview, window, per-rank map, exact reduce) that returns the result.
"""
