"""The forward hook, installed the way SGLang installs it (entry point -> HookRegistry AROUND)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tracekit.capture import sglang_plugin


def _calls_with_ranges(monkeypatch):
    """Record NVTX push/pop and record_function names instead of calling real NVTX."""
    log: list[tuple[str, str | None]] = []

    class _RF:
        def __init__(self, name):
            self.name = name

        def __enter__(self):
            log.append(("rf_enter", self.name))

        def __exit__(self, *exc):
            log.append(("rf_exit", self.name))

    st = sglang_plugin._STATE
    st.torch_ready = True
    st.record_function = _RF
    st.ranges = (lambda m: log.append(("push", m)), lambda: log.append(("pop", None)))
    return log


def test_register_is_noop_without_env(fake_sglang, monkeypatch):
    monkeypatch.delenv("TRACEKIT_SGLANG_HOOK", raising=False)
    from sglang.srt.plugins import load_plugins
    from sglang.srt.model_executor import model_runner

    original = model_runner.ModelRunner.forward
    assert "tracekit" in load_plugins()  # discovered through the real entry point of tracekit's metadata
    assert model_runner.ModelRunner.forward is original


def test_plugin_wraps_forward_and_writes_step_records(fake_sglang, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEKIT_SGLANG_HOOK", "1")
    monkeypatch.setenv("TRACEKIT_STEP_DIR", str(tmp_path))
    log = _calls_with_ranges(monkeypatch)
    from sglang.srt.plugins import load_plugins

    assert load_plugins() == ["tracekit"]
    from sglang.srt.model_executor.forward_batch_info import DeviceTensor, ForwardMode, make_batch
    from sglang.srt.model_executor.model_runner import ModelRunner, ModelRunnerOutput

    runner = ModelRunner(tp_rank=3)
    draft = ModelRunner(tp_rank=3, is_draft_worker=True)
    touched0 = DeviceTensor.touched
    out1 = runner.forward(make_batch(ForwardMode.EXTEND, 4, extend_num_tokens=1234))
    out2 = runner.forward(make_batch(ForwardMode.DECODE, 96), None, None, reinit_attn_backend=True, split_forward_count=2)
    out3 = draft.forward(forward_batch=make_batch(ForwardMode.TARGET_VERIFY, 8, draft_token_num=4))
    assert DeviceTensor.touched == touched0  # no GPU tensor was read
    # passthrough: results and arguments unchanged
    assert isinstance(out1, ModelRunnerOutput) and out1.logits_output == ("logits", 1)
    assert out2.can_run_graph is False and out3.can_run_graph is True
    assert runner.calls[1][1:] == (None, None, True, 2)
    labels = [m for k, m in log if k == "push"]
    assert labels == [
        "tk.fwd[EXTEND bs=4 tok=1234]",
        "tk.fwd[DECODE bs=96 tok=96]",
        "tk.fwd[TARGET_VERIFY bs=8 tok=32 draft]",
    ]
    assert [m for k, m in log if k == "rf_enter"] == labels
    # ranges are balanced and the record_function sits inside the NVTX range
    assert [k for k, _ in log[:4]] == ["push", "rf_enter", "rf_exit", "pop"]

    sglang_plugin._flush(close=True)
    files = sorted(tmp_path.glob("steps-rank*.jsonl"))
    assert [f.name.split("-pid")[0] for f in files] == ["steps-rank3"]  # no dist: tp_rank is the rank
    recs = [json.loads(line) for line in files[0].read_text().splitlines()]
    assert [(r["mode"], r["bs"], r["tokens"], r["draft"], r["forward_pass_id"], r["can_run_graph"]) for r in recs] == [
        ("EXTEND", 4, 1234, False, 1, False),
        ("DECODE", 96, 96, False, 2, False),
        ("TARGET_VERIFY", 8, 32, True, 1, True),
    ]
    assert all(r["end_ns"] >= r["start_ns"] > 1_600_000_000 * 10**9 for r in recs)


def test_hook_survives_errors_and_keeps_ranges_balanced(fake_sglang, monkeypatch):
    monkeypatch.setenv("TRACEKIT_SGLANG_HOOK", "1")
    monkeypatch.delenv("TRACEKIT_STEP_DIR", raising=False)
    log = _calls_with_ranges(monkeypatch)
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.model_executor.model_runner import ModelRunner

    class Boom(Exception):
        pass

    def bad_forward(self, forward_batch, *a, **k):
        raise Boom

    # an unlabelable batch (no forward_mode) and a raising forward
    runner = ModelRunner()
    orig = ModelRunner.forward
    wrapped_bad = lambda *a, **k: sglang_plugin.forward_hook(bad_forward, *a, **k)  # noqa: E731
    with pytest.raises(Boom):
        wrapped_bad(runner, object())
    assert [k for k, _ in log] == ["push", "rf_enter", "rf_exit", "pop"]
    assert log[0][1] == "tk.fwd[UNKNOWN bs=? tok=?]"
    assert orig is ModelRunner.forward
    # the hook is usable again after the exception (re-entrancy flag was reset)
    from sglang.srt.model_executor.forward_batch_info import ForwardMode, make_batch

    runner.forward(make_batch(ForwardMode.IDLE, 0))
    assert log[-4][1] == "tk.fwd[IDLE bs=0 tok=0]"


def test_autopatch_import_hook_wraps_on_import(fake_sglang, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEKIT_STEP_DIR", str(tmp_path))
    log = _calls_with_ranges(monkeypatch)
    from tracekit.capture import sglang_autopatch

    assert sglang_autopatch.install() == "armed"
    mr = importlib.import_module("sglang.srt.model_executor.model_runner")
    assert sglang_autopatch.is_patched(mr)
    from sglang.srt.model_executor.forward_batch_info import ForwardMode, make_batch

    out = mr.ModelRunner(tp_rank=1).forward(make_batch(ForwardMode.MIXED, 5, extend_num_tokens=700))
    assert out.logits_output == ("logits", 1)
    assert [m for k, m in log if k == "push"] == ["tk.fwd[MIXED bs=5 tok=700]"]
    assert sglang_autopatch.patch_module(mr) is False  # idempotent


def test_plugin_plus_autopatch_records_once(fake_sglang, monkeypatch, tmp_path):
    monkeypatch.setenv("TRACEKIT_SGLANG_HOOK", "1")
    log = _calls_with_ranges(monkeypatch)
    from tracekit.capture import sglang_autopatch

    sglang_autopatch.install()
    from sglang.srt.plugins import load_plugins

    load_plugins()
    from sglang.srt.model_executor.forward_batch_info import ForwardMode, make_batch
    from sglang.srt.model_executor.model_runner import ModelRunner

    ModelRunner().forward(make_batch(ForwardMode.DECODE, 2))
    assert [k for k, _ in log] == ["push", "rf_enter", "rf_exit", "pop"]


def test_sitecustomize_bootstrap_in_fresh_interpreter(tmp_path):
    """A spawned interpreter with the bootstrap dir first on PYTHONPATH hooks forward on import."""
    from tracekit.capture.sglang_autopatch import write_bootstrap

    fake_pkgs = Path(__file__).parent / "fake_pkgs"
    boot = write_bootstrap(tmp_path / "boot")
    other = tmp_path / "other"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['CHAINED_SITECUSTOMIZE'] = 'yes'\n")
    steps = tmp_path / "steps"
    prog = textwrap.dedent(
        """
        import os, multiprocessing as mp

        def rank_main(rank):
            from sglang.srt.model_executor.model_runner import ModelRunner
            from sglang.srt.model_executor.forward_batch_info import ForwardMode, make_batch
            r = ModelRunner(tp_rank=rank)
            for _ in range(3):
                r.forward(make_batch(ForwardMode.DECODE, 16))

        if __name__ == "__main__":
            assert os.environ.get("CHAINED_SITECUSTOMIZE") == "yes"
            ctx = mp.get_context("spawn")
            ps = [ctx.Process(target=rank_main, args=(r,)) for r in range(2)]
            [p.start() for p in ps]
            [p.join() for p in ps]
            assert all(p.exitcode == 0 for p in ps)
        """
    )
    (tmp_path / "prog.py").write_text(prog)
    import os

    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join([str(boot), str(other), str(fake_pkgs)]),
        TRACEKIT_SGLANG_HOOK="1",
        TRACEKIT_STEP_DIR=str(steps),
    )
    r = subprocess.run([sys.executable, str(tmp_path / "prog.py")], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    df = sglang_plugin.load_step_records(steps)
    assert sorted(df["rank"].unique().to_list()) == [0, 1]
    assert df.height == 6
    assert df["name"].unique().to_list() == ["tk.fwd[DECODE bs=16 tok=16]"]
