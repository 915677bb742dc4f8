"""Allocator tuning (tracekit/_memory.py): defaults only, never overriding the user."""

from __future__ import annotations

import subprocess
import sys


def _env_after_import(env: dict[str, str]) -> str:
    code = "import os, tracekit; print(os.environ.get('_RJEM_MALLOC_CONF', ''))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def test_polars_allocator_default_is_set_before_polars_loads(monkeypatch) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    from tracekit._memory import POLARS_JEMALLOC_CONF

    conf = _env_after_import(env)
    assert POLARS_JEMALLOC_CONF == "dirty_decay_ms:100,muzzy_decay_ms:0"
    assert conf.startswith(POLARS_JEMALLOC_CONF + ",narenas:")
    assert int(conf.rsplit(":", 1)[1]) >= 1


def test_analysis_commands_get_the_longer_decay() -> None:
    import os

    from tracekit._memory import POLARS_JEMALLOC_CONF, POLARS_JEMALLOC_CONF_ANALYZE, cli_command

    assert cli_command(["/venv/bin/tracekit", "analyze", "t.parquet"]) == "analyze"
    assert cli_command(["/venv/bin/tracekit", "-q", "convert", "x.json"]) == "convert"
    assert cli_command(["-m", "timeline", "t.parquet"]) == "timeline"
    assert cli_command(["/usr/bin/pytest", "analyze"]) is None  # another program: the default
    env = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    code = "import sys; sys.argv = ['/venv/bin/tracekit', '{}', 't.parquet']; import os, tracekit; print(os.environ['_RJEM_MALLOC_CONF'])"
    run = lambda cmd: subprocess.run([sys.executable, "-c", code.format(cmd)], env=env, capture_output=True, text=True,  # noqa: E731
                                     check=True).stdout.strip()
    assert run("analyze").startswith(POLARS_JEMALLOC_CONF_ANALYZE + ",narenas:")
    assert run("diff").startswith(POLARS_JEMALLOC_CONF_ANALYZE + ",narenas:")
    assert run("convert").startswith(POLARS_JEMALLOC_CONF + ",narenas:")
    assert run("capture").startswith(POLARS_JEMALLOC_CONF + ",narenas:")


def test_user_setting_wins() -> None:
    import os

    env = dict(os.environ, _RJEM_MALLOC_CONF="dirty_decay_ms:10000")
    assert _env_after_import(env) == "dirty_decay_ms:10000"


def test_runtime_knobs_are_idempotent_and_safe() -> None:
    from tracekit._memory import release_memory, tune_runtime

    tune_runtime()
    tune_runtime()
    release_memory()
