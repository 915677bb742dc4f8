#!/usr/bin/env python3
"""Install tracekit with its capture extra into the running Python (a venv), picking the right torch.

    python install.py                 # what the README's main command runs
    python install.py --extras capture,dev --dry-run

* torch already importable: it is kept as it is (a CUDA or ROCm build stays; nothing replaces it).
* no torch, an NVIDIA GPU present (``nvidia-smi -L`` lists one, or ``/dev/nvidia0`` exists): pip installs the
  default torch from the package index, the CUDA build.
* no torch, no GPU: a CPU-only build, so no CUDA libraries are downloaded (about 1 GB installed instead of
  about 5 GB): the newest ``+cpu`` build that pip's configured sources already offer (a mirror or a local
  wheel directory), else the one on ``--torch-index`` (default: PyTorch's CPU index). When neither is
  reachable it stops and says what to do (never a silent 5 GB download).

``--cpu`` / ``--gpu`` override the detection. Then ``pip install -e ".[EXTRAS]"``: the extra asks for
``torch>=2.4``, which the torch above satisfies, so pip leaves it alone. Standard library only.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent
#: PyTorch's own index of CPU-only builds (the documented way to install torch without CUDA)
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: the oldest torch the capture extra accepts (pyproject.toml: torch>=2.4)
MIN_TORCH = (2, 4)


def torch_installed(python: str) -> str | None:
    """The version of the torch ``python`` imports, or None."""
    r = subprocess.run([python, "-c", "import torch, sys; sys.stdout.write(torch.__version__)"],
                       capture_output=True, text=True)
    return (r.stdout.strip() or None) if r.returncode == 0 else None


def nvidia_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU with a driver (what the CUDA build of torch needs)."""
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
            if r.returncode == 0 and "GPU" in r.stdout:
                return True
        except (OSError, subprocess.TimeoutExpired):
            pass
    return Path("/dev/nvidia0").exists()


def _version_key(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v.split("+", 1)[0])[:3])


def newest_cpu_build(versions: list[str]) -> str | None:
    """The newest ``+cpu`` version (at least MIN_TORCH) among ``versions``."""
    cpu = [v for v in versions if v.endswith("+cpu") and _version_key(v)[:2] >= MIN_TORCH]
    return max(cpu, key=_version_key) if cpu else None


def offered_versions(python: str, index: str | None = None) -> list[str]:
    """The torch versions pip's configured sources offer (index, extra indexes, find-links), or ``index``'s."""
    extra = ["--index-url", index] if index else []
    try:
        r = subprocess.run([python, "-m", "pip", "index", "versions", "torch", *extra], capture_output=True, text=True,
                           timeout=300)
    except subprocess.TimeoutExpired:
        return []
    m = re.search(r"Available versions:\s*(.+)", r.stdout)
    return [v.strip() for v in m.group(1).split(",")] if m else []


def plan(*, have_torch: str | None, gpu: bool, offered: list[str], index_offered: list[str], extras: str,
         torch_index: str) -> list[str] | None:
    """The arguments of the one ``pip install`` that installs tracekit (module docstring); None when no CPU-only
    torch can be had. ``offered``: versions pip's sources offer; ``index_offered``: those of ``torch_index``."""
    project = ["-e", f"{ROOT}[{extras}]" if extras else str(ROOT)]
    if have_torch or gpu or "capture" not in extras.split(","):
        return project
    build = newest_cpu_build(offered)
    if build:  # one resolution: the pinned CPU build satisfies the extra's torch>=2.4
        return [f"torch=={build}", *project]
    build = newest_cpu_build(index_offered)
    if build:  # the CPU index for torch only: a +cpu version exists nowhere else
        return [f"torch=={build}", *project, "--extra-index-url", torch_index]
    return None


def _pip(python: str, args: list[str], dry_run: bool) -> int:
    cmd = [python, "-m", "pip", "install", *(["--dry-run"] if dry_run else []), *args]
    print("install.py: " + " ".join(cmd[1:]), flush=True)
    return subprocess.run(cmd).returncode


def _size(prefix: Path) -> str:
    total = 0
    for dirpath, _dirs, files in os.walk(prefix):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return f"{total / 1e9:.2f} GB"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--extras", default="capture", help="extras of the project to install (default: capture)")
    dev = ap.add_mutually_exclusive_group()
    dev.add_argument("--cpu", action="store_true", help="install a CPU-only torch even if a GPU is present")
    dev.add_argument("--gpu", action="store_true", help="install the default (CUDA) torch even without a GPU")
    ap.add_argument("--torch-index", default=CPU_INDEX, help=f"index of CPU-only torch builds (default {CPU_INDEX})")
    ap.add_argument("--dry-run", action="store_true", help="only show what pip would install")
    a = ap.parse_args(argv)
    python = sys.executable
    if sys.prefix == sys.base_prefix and not os.environ.get("VIRTUAL_ENV"):
        print("install.py: note: not in a virtual environment; installing into " + sys.prefix, file=sys.stderr)
    have = torch_installed(python)
    gpu = a.gpu or (not a.cpu and nvidia_gpu())
    need_cpu = not have and not gpu and "capture" in a.extras.split(",")
    offered = offered_versions(python) if need_cpu else []
    index_offered = offered_versions(python, a.torch_index) if need_cpu and not newest_cpu_build(offered) else []
    args = plan(have_torch=have, gpu=gpu, offered=offered, index_offered=index_offered, extras=a.extras,
                torch_index=a.torch_index)
    if have:
        print(f"install.py: keeping the installed torch {have}")
    elif gpu:
        print("install.py: NVIDIA GPU found: torch from the package index (CUDA build)")
    elif need_cpu:
        print("install.py: no GPU and no torch: a CPU-only torch (no CUDA libraries)")
    if args is None:
        print(f"install.py: error: no CPU-only torch is offered by pip's sources or {a.torch_index}; install torch "
              "first (e.g. pip install torch --index-url URL-of-a-mirror), or pass --gpu to take the default build "
              "with its CUDA libraries (about 5 GB), then rerun", file=sys.stderr)
        return 1
    if _pip(python, args, a.dry_run) != 0:
        return 1
    if not a.dry_run:
        print(f"install.py: done; {sys.prefix} holds {_size(Path(sys.prefix))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
