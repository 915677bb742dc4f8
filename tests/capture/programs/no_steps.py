"""A CPU program that marks no steps: plain small ops for ``--seconds``."""

import argparse
import time

import torch

ap = argparse.ArgumentParser()
ap.add_argument("--seconds", type=float, default=5.0)
ap.add_argument("--sleep", type=float, default=0.001, help="host pause per iteration (s)")
a = ap.parse_args()
torch.set_num_threads(1)
x = torch.randn(8, 8)
t0 = time.time()
n = 0
while time.time() - t0 < a.seconds:
    y = torch.mm(x, x).relu()
    time.sleep(a.sleep)
    n += 1
print(f"iters={n}", flush=True)
