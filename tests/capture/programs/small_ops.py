"""A CPU program of small ops: each step is one record_function("forward#i") range of ~60 tiny ops.

Runs for ``--seconds`` of wall time (default 30) and prints ``steps=N elapsed_s=T`` at the end.
"""

import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=30.0)
ap.add_argument("--label", default="forward#{i}")
a = ap.parse_args()
torch.set_num_threads(1)
x = torch.randn(16, 16)
t0 = time.time()
i = 0
while time.time() - t0 < a.seconds:
    with torch.profiler.record_function(a.label.format(i=i)):
        y = x
        for _ in range(20):
            y = torch.relu(y + 1.0) * 0.5
    i += 1
print(f"steps={i} elapsed_s={time.time() - t0:.2f}", flush=True)
