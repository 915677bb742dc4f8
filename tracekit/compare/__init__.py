"""Compare: two analysis results side by side (``tracekit diff``). Above analysis; renders nothing."""
