"""The ``capture`` extra keeps a user's own torch: ``pip install -e ".[capture]"`` over a preinstalled torch.

A fresh venv gets fake distributions (``*.dist-info`` only) of torch 2.5.0 (a version other than
CI's 2.13.0, standing for a user's CUDA build; below any local ``torch<=`` cap in pip's
constraints) and of every other requirement, so pip has nothing to fetch but the build backend.
pip's install report must not list torch, and the fake must be the only torch afterwards. With
the old pin (``torch==2.13.0``) pip installs torch and the test fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def _fake_dist(site: Path, name: str, version: str) -> None:
    d = site / f"{name.replace('-', '_')}-{version}.dist-info"
    d.mkdir()
    (d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (d / "INSTALLER").write_text("fake\n")
    (d / "RECORD").write_text("")


def _requirements() -> list[tuple[str, str]]:
    meta = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = list(meta["dependencies"]) + list(meta["optional-dependencies"]["capture"])
    out = []
    for r in reqs:
        m = re.match(r"^([A-Za-z0-9_.-]+)\s*(?:(>=|==|~=)\s*([0-9][0-9.]*))?", r)
        assert m, r
        out.append((m.group(1), m.group(3) or "1.0"))
    return out


def test_capture_extra_keeps_a_preinstalled_torch(tmp_path: Path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               check=True, capture_output=True, text=True).stdout.strip())
    for name, version in _requirements():
        _fake_dist(site, name, "2.5.0" if name == "torch" else version)
    report = tmp_path / "report.json"
    r = subprocess.run([str(py), "-m", "pip", "install", "-q", "--disable-pip-version-check", "--report", str(report),
                        "-e", f"{REPO}[capture]"], capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    installed = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert installed == {"tracekit": "0.1.0"}, installed  # nothing replaced, torch least of all
    assert [p.name for p in site.glob("torch-*.dist-info")] == ["torch-2.5.0.dist-info"]
    ver = subprocess.run([str(py), "-c", "import importlib.metadata as m; print(m.version('torch'), m.version('tracekit'))"],
                         check=True, capture_output=True, text=True).stdout.split()
    assert ver == ["2.5.0", "0.1.0"], ver
