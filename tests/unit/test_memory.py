"""Allocator tuning (tracekit/_memory.py): set by the CLI entry before polars loads, defaults only, never
overriding the user; importing tracekit changes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

import pytest

from tracekit import _memory
from tracekit._memory import POLARS_JEMALLOC_CONF, POLARS_JEMALLOC_CONF_ANALYZE, cli_command

#: runs tracekit.cli.main() for ``argv`` with the command replaced by a probe: the variable as the command would see
#: it, and whether polars was loaded before main() set it
_PROBE = ("import sys, os; sys.argv = {argv!r}; import tracekit.cli as c; loaded = 'polars' in sys.modules; "
          "c._run = lambda: print(os.environ.get('_RJEM_MALLOC_CONF', ''), loaded); c.main()")


def _run(code: str, env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout.strip()


def _clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}, **extra}


def test_importing_tracekit_sets_nothing() -> None:
    code = "import os, tracekit, tracekit.cli; print(repr(os.environ.get('_RJEM_MALLOC_CONF')))"
    assert _run(code, _clean_env()) == "None"


def test_the_cli_sets_the_decay_before_polars_loads() -> None:
    out = _run(_PROBE.format(argv=["/venv/bin/tracekit", "convert", "x.json"]), _clean_env())
    conf, loaded = out.split()
    assert loaded == "False"  # importing the CLI and its commands loads no polars: the setting still takes effect
    assert POLARS_JEMALLOC_CONF == "dirty_decay_ms:100,muzzy_decay_ms:0"
    assert conf.startswith(POLARS_JEMALLOC_CONF + ",narenas:")
    assert int(conf.rsplit(":", 1)[1]) >= 1


@pytest.mark.parametrize("command,conf", [("analyze", POLARS_JEMALLOC_CONF_ANALYZE), ("diff", POLARS_JEMALLOC_CONF_ANALYZE),
                                          ("convert", POLARS_JEMALLOC_CONF), ("capture", POLARS_JEMALLOC_CONF)])
def test_analysis_commands_get_the_longer_decay(command: str, conf: str) -> None:
    out = _run(_PROBE.format(argv=["/venv/bin/tracekit", command, "t.parquet"]), _clean_env())
    assert out.split()[0].startswith(conf + ",narenas:")


def test_cli_command() -> None:
    assert cli_command(["/venv/bin/tracekit", "analyze", "t.parquet"]) == "analyze"
    assert cli_command(["/venv/bin/tracekit", "-q", "convert", "x.json"]) == "convert"
    assert cli_command(["-m", "timeline", "t.parquet"]) == "timeline"
    assert cli_command(["/x/tracekit/cli.py", "replay", "t.parquet"]) == "replay"
    assert cli_command(["/usr/bin/pytest", "analyze"]) is None  # another program: the default


def test_user_setting_wins() -> None:
    out = _run(_PROBE.format(argv=["/venv/bin/tracekit", "analyze", "t"]), _clean_env(_RJEM_MALLOC_CONF="dirty_decay_ms:10000"))
    assert out.split()[0] == "dirty_decay_ms:10000"


def test_library_use_opts_in() -> None:
    code = "import os, tracekit; print(tracekit.configure_env(), os.environ['_RJEM_MALLOC_CONF'])"
    ok, conf = _run(code, _clean_env()).split()
    assert ok == "True" and conf.startswith(POLARS_JEMALLOC_CONF + ",narenas:")
    # polars already loaded (it sets its own default as it loads): too late, nothing changes
    late = ("import os, polars, tracekit; v = os.environ.get('_RJEM_MALLOC_CONF'); "
            "print(tracekit.configure_env(), os.environ.get('_RJEM_MALLOC_CONF') == v)")
    assert _run(late, _clean_env()) == "False True"


def test_tune_runtime_sets_the_arrow_decay_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import pyarrow as pa

    calls: list[int] = []
    monkeypatch.setattr(pa, "jemalloc_set_decay_ms", calls.append)
    monkeypatch.setenv("TRACEKIT_ARROW_DECAY_MS", "250")
    _memory.tune_runtime.cache_clear()
    try:
        _memory.tune_runtime()
        _memory.tune_runtime()
        assert calls == [250]
        monkeypatch.delenv("TRACEKIT_ARROW_DECAY_MS")
        _memory.tune_runtime.cache_clear()
        _memory.tune_runtime()
        assert calls == [250, _memory.ARROW_DECAY_MS]
    finally:
        _memory.tune_runtime.cache_clear()


def test_release_memory_trims_the_heap(monkeypatch: pytest.MonkeyPatch) -> None:
    trims: list[int] = []

    class Lib:
        def malloc_trim(self, pad: int) -> int:
            trims.append(pad)
            return 1

    lib: Any = Lib()
    monkeypatch.setattr(_memory, "_libc", lambda: lib)
    _memory.release_memory()
    assert trims == [0]
    monkeypatch.setattr(_memory, "_libc", lambda: None)  # no C library to trim: nothing happens, nothing fails
    _memory.release_memory()
    assert trims == [0]


#: like _PROBE, printing the client's allocator setting, its polars threads and what a local cluster's workers get
_CLUSTER_PROBE = ("import sys, os; sys.argv = {argv!r}; import tracekit.cli as c; "
                  "from tracekit import _env; from tracekit._memory import user_env; "
                  "c._run = lambda: print(os.environ.get('_RJEM_MALLOC_CONF', ''), os.environ.get('POLARS_MAX_THREADS', '-'), "
                  "user_env(_env.JEMALLOC_CONF), user_env(_env.POLARS_MAX_THREADS)); c.main()")


def _clean_cluster_env(**extra: str) -> dict[str, str]:
    drop = {"_RJEM_MALLOC_CONF", "POLARS_MAX_THREADS", "TRACEKIT_CLIENT_DEFAULTS"}
    return {**{k: v for k, v in os.environ.items() if k not in drop}, **extra}


@pytest.mark.parametrize("flag", [["--cluster", "local:2"], ["--cluster=local:2"]])
def test_a_cluster_client_gets_few_threads_and_no_decay(flag: list[str]) -> None:
    out = _run(_CLUSTER_PROBE.format(argv=["/venv/bin/tracekit", "analyze", "t", *flag]), _clean_cluster_env())
    conf, threads, worker_conf, worker_threads = out.split()
    assert conf == _memory.CLUSTER_CLIENT_JEMALLOC_CONF and threads == str(_memory.CLUSTER_CLIENT_THREADS)
    # the client's own defaults are not the user's: a local cluster's workers get the command's setting and their cores
    assert worker_conf == "None" and worker_threads == "None"


def test_a_cluster_client_keeps_the_users_settings() -> None:
    env = _clean_cluster_env(_RJEM_MALLOC_CONF="dirty_decay_ms:5", POLARS_MAX_THREADS="3")
    out = _run(_CLUSTER_PROBE.format(argv=["/venv/bin/tracekit", "convert", "x", "-o", "d", "--cluster", "local:2"]), env)
    assert out.split() == ["dirty_decay_ms:5", "3", "dirty_decay_ms:5", "3"]


def test_without_cluster_nothing_changes_for_threads() -> None:
    out = _run(_CLUSTER_PROBE.format(argv=["/venv/bin/tracekit", "analyze", "t"]), _clean_cluster_env())
    conf, threads, _, _ = out.split()
    assert conf.startswith(POLARS_JEMALLOC_CONF_ANALYZE) and threads == "-"


def test_polars_own_default_from_a_parent_process_is_not_the_users() -> None:
    """A parent that imported polars (a notebook, a benchmark's controller) passes polars' own default on: the
    command still gets its setting (the cluster client measured 437 MB instead of 363 at 512 ranks without this)."""
    parent = _run("import os, polars; print(os.environ['_RJEM_MALLOC_CONF'])", _clean_cluster_env())
    assert parent.startswith("dirty_decay_ms:500")  # what this polars writes; if it changes, so must _POLARS_OWN_JEMALLOC
    out = _run(_CLUSTER_PROBE.format(argv=["/venv/bin/tracekit", "analyze", "t", "--cluster", "local:2"]),
               _clean_cluster_env(_RJEM_MALLOC_CONF=parent))
    conf, threads, worker_conf, _ = out.split()
    assert conf == _memory.CLUSTER_CLIENT_JEMALLOC_CONF and worker_conf == "None"
    out = _run(_PROBE.format(argv=["/venv/bin/tracekit", "analyze", "t"]), _clean_env(_RJEM_MALLOC_CONF=parent))
    assert out.split()[0].startswith(POLARS_JEMALLOC_CONF_ANALYZE + ",narenas:")
    # the user's own value after polars' defaults still wins
    out = _run(_PROBE.format(argv=["/venv/bin/tracekit", "analyze", "t"]), _clean_env(_RJEM_MALLOC_CONF=parent + ",dirty_decay_ms:7"))
    assert out.split()[0] == parent + ",dirty_decay_ms:7"


def test_an_analysis_of_a_profiler_trace_gets_the_conversions_decay(tmp_path) -> None:
    """``tracekit analyze trace.json.gz`` converts first (tracekit.commands._source): the conversion's short decay, so its
    freed pages do not add to the analysis' peak; a trace.parquet or a dataset keeps the analysis' longer one."""
    import gzip

    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes(gzip.compress(b'{"traceEvents": []}'))
    pq = tmp_path / "t.parquet"
    pq.write_bytes(b"PAR1" + bytes(16) + b"PAR1")
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    dataset = tmp_path / "ds"
    dataset.mkdir()
    (dataset / "_common_metadata").write_bytes(b"PAR1")
    html = tmp_path / "old.html"
    html.write_text("<html></html>")
    for args, conf in (([gz], POLARS_JEMALLOC_CONF), ([ranks], POLARS_JEMALLOC_CONF), ([pq], POLARS_JEMALLOC_CONF_ANALYZE),
                       ([dataset], POLARS_JEMALLOC_CONF_ANALYZE), ([pq, "--html", html], POLARS_JEMALLOC_CONF_ANALYZE),
                       ([gz, "--html", html], POLARS_JEMALLOC_CONF)):
        argv = ["/venv/bin/tracekit", "analyze", *map(str, args)]
        assert _memory.converts_input(argv) == (conf == POLARS_JEMALLOC_CONF)
        out = _run(_PROBE.format(argv=argv), _clean_env())
        assert out.split()[0].startswith(conf + ",narenas:"), (args, out)
