"""torchrun program (gloo, CPU): each step is a record_function("forward#i") range with one all_reduce."""

import argparse
import os
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=400)
a = ap.parse_args()
torch.set_num_threads(1)
dist.init_process_group("gloo")
x = torch.ones(64)
for i in range(a.steps):
    with torch.profiler.record_function(f"forward#{i}"):
        y = (x * 2.0).relu()
        dist.all_reduce(y)
        time.sleep(0.005)
dist.barrier()
print(f"rank={os.environ['RANK']} steps={a.steps}", flush=True)
dist.destroy_process_group()
