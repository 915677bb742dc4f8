"""Advice: what the analysis suggests, checked with replay (the next win). Above analysis and replay."""
