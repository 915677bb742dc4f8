"""The README's install step (issue 30, item 1): `python install.py` in a fresh venv on a machine without a GPU
installs a CPU-only torch (no CUDA libraries), never replaces a torch that is there, and takes the default
(CUDA) build where an NVIDIA GPU is."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("tk_install", ROOT / "install.py")
assert spec and spec.loader
inst = importlib.util.module_from_spec(spec)
spec.loader.exec_module(inst)

CPU_IDX = "https://example.invalid/cpu"


def _plan(**kw: object) -> list[str] | None:
    base: dict[str, object] = {"have_torch": None, "gpu": False, "offered": [], "index_offered": [], "extras": "capture",
                               "torch_index": CPU_IDX}
    return inst.plan(**{**base, **kw})


def test_plan_keeps_an_installed_torch():
    assert _plan(have_torch="2.11.0+cu130", offered=["2.13.0+cpu"]) == ["-e", f"{ROOT}[capture]"]


def test_plan_gpu_takes_the_default_build():
    assert _plan(gpu=True, offered=["2.13.0+cpu", "2.15.0"]) == ["-e", f"{ROOT}[capture]"]


def test_plan_cpu_pins_the_newest_cpu_build_pip_offers():
    assert _plan(offered=["2.15.0", "2.13.0+cpu", "2.12.0+cpu", "2.3.1+cpu"]) == ["torch==2.13.0+cpu", "-e", f"{ROOT}[capture]"]


def test_plan_cpu_from_the_cpu_index_when_pip_offers_none():
    assert _plan(offered=["2.15.0", "2.14.1"], index_offered=["2.15.0+cpu", "2.14.1+cpu"]) == [
        "torch==2.15.0+cpu", "-e", f"{ROOT}[capture]", "--extra-index-url", CPU_IDX]


def test_plan_cpu_none_reachable_is_refused_not_a_5gb_download():
    assert _plan(offered=["2.15.0"], index_offered=[]) is None
    assert inst.newest_cpu_build(["2.3.1+cpu", "2.2.0+cpu"]) is None  # older than the extra's torch>=2.4


def test_plan_without_the_capture_extra_installs_no_torch():
    assert _plan(extras="dev") == ["-e", f"{ROOT}[dev]"]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_fresh_venv_without_gpu_resolves_a_cpu_torch(tmp_path: Path):
    """A fresh venv (no torch), this machine (no GPU): what pip would install has no CUDA libraries.

    A plain `pip install -e ".[capture]"` resolved the CUDA build of torch and its nvidia-* wheels here."""
    if inst.nvidia_gpu():
        pytest.skip("this machine has an NVIDIA GPU")
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = venv / "bin" / "python"
    r = subprocess.run([str(py), str(ROOT / "install.py"), "--dry-run"], capture_output=True, text=True, timeout=800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    m = re.search(r"^Would install (.+)$", r.stdout, re.M)
    assert m, r.stdout[-3000:]
    pkgs = m.group(1).split()
    torch = [p for p in pkgs if p.startswith("torch-")]
    assert torch and torch[0].endswith("+cpu"), pkgs
    cuda = [p for p in pkgs if p.startswith(("nvidia-", "triton-", "cuda-")) and not p.startswith("nvidia-ml-py")]
    assert not cuda, cuda  # nvidia-ml-py (NVML bindings, pure Python) is the capture extra's own
    assert "no GPU and no torch: a CPU-only torch" in r.stdout
