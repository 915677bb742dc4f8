"""The Dask client behind ``--cluster ADDR``: where it connects, what it starts, how it ends.

``ADDR`` is one of

* ``local:N`` — a ``LocalCluster`` of N worker processes on this host, every socket of which (scheduler,
  nannies, workers, their HTTP endpoints) is bound to 127.0.0.1: nothing listens beyond loopback;
* a scheduler address (``tcp://host:8786``, ``tls://…``, ``host:8786``) or a scheduler file (``*.json``, as
  ``dask scheduler --scheduler-file`` writes it): tracekit connects to it as a client and listens on nothing.

:func:`cluster_client` yields a connected ``distributed.Client`` and always closes it (and the local cluster it
started). An unreachable scheduler is a one-line :class:`~tracekit._errors.ClusterError` after
:data:`CONNECT_S` seconds; a scheduler without workers one after :data:`WORKERS_S`.
Each local worker gets ``threads`` polars / parse threads (default: this host's cores divided among the workers).
"""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from tracekit import _env
from tracekit._errors import ClusterError, UsageError, require

if TYPE_CHECKING:
    from distributed import Client

__all__ = ["Target", "parse_address", "probe", "cluster_client", "CONNECT_S", "WORKERS_S", "MAX_LOCAL_WORKERS", "require_dask"]

#: seconds to reach a scheduler before giving up (the whole command then ends well within 10 s)
CONNECT_S = 3.0
#: seconds to wait for a scheduler's first worker
WORKERS_S = 10.0
#: at most this many local workers (``local:N``)
MAX_LOCAL_WORKERS = 256
_LOCAL = re.compile(r"^local:(\d+)$")
_ADDR = re.compile(r"^(?:(tcp|tls|ws|wss|inproc|ucx)://)?\[?[A-Za-z0-9_.:-]+\]?:\d{1,5}$")


@dataclass(frozen=True)
class Target:
    """A parsed ``--cluster`` value: ``workers`` > 0 for ``local:N``, else ``address`` or ``scheduler_file``."""

    text: str
    workers: int = 0
    address: str | None = None
    scheduler_file: str | None = None


def parse_address(text: str) -> Target:
    """``local:N``, a scheduler address or a scheduler file; anything else is a :class:`UsageError`."""
    t = text.strip()
    m = _LOCAL.match(t)
    if m:
        n = int(m.group(1))
        if not 1 <= n <= MAX_LOCAL_WORKERS:
            raise UsageError(f"--cluster {text}: N must be 1..{MAX_LOCAL_WORKERS}")
        return Target(text, workers=n)
    if t.endswith(".json"):
        if not Path(t).is_file():
            raise UsageError(f"--cluster {text}: no such scheduler file; pass the file `dask scheduler --scheduler-file` wrote")
        return Target(text, scheduler_file=t)
    if _ADDR.match(t):
        return Target(text, address=t)
    raise UsageError(f"--cluster {text!r}: not local:N, a scheduler address (tcp://HOST:PORT) or a scheduler file (*.json)")


def _host_port(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of a TCP-based scheduler address (None for other transports)."""
    proto, sep, rest = address.rpartition("://")
    if sep and proto not in ("tcp", "tls", "ws", "wss"):
        return None
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


def probe(text: str) -> Target:
    """Parse ``--cluster text`` and, for a scheduler address (or file), open and close one TCP connection to it
    (at most :data:`CONNECT_S` s), before anything heavy is imported: an unreachable scheduler fails at once, in
    one line (:class:`ClusterError`)."""
    import json
    import socket

    target = parse_address(text)
    addr = target.address
    if target.scheduler_file is not None:
        try:
            addr = str(json.loads(Path(target.scheduler_file).read_text())["address"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ClusterError(f"--cluster {text}: not a readable scheduler file ({type(e).__name__}); pass the file "
                               "`dask scheduler --scheduler-file` wrote") from None
    hp = _host_port(addr) if addr is not None else None
    if hp is not None:
        try:
            socket.create_connection(hp, timeout=CONNECT_S).close()
        except OSError as e:
            why = f"no answer within {CONNECT_S:g} s" if isinstance(e, TimeoutError) else (e.strerror or type(e).__name__)
            raise ClusterError(f"--cluster {text}: cannot reach the scheduler at {hp[0]}:{hp[1]} ({why}); "
                               "check the address and that the scheduler is running") from None
    return target


def require_dask() -> None:
    """One-line error naming the extra when Dask distributed is not installed (:func:`tracekit._errors.require`)."""
    require("distributed", "cluster", "--cluster")


def _local_threads(workers: int, threads: int | None) -> int:
    from tracekit.ingest._workers import worker_threads

    return threads if threads else worker_threads(workers)


def _start_local(target: Target, threads: int | None) -> Any:
    from distributed import LocalCluster

    from tracekit._memory import cli_command, polars_jemalloc_conf, user_env

    k = str(_local_threads(target.workers, threads))
    # the workers read the trace: the command's own allocator setting and their share of the cores, not the
    # client's (tracekit._memory.configure_env), unless the user set them
    env = {_env.POLARS_MAX_THREADS: user_env(_env.POLARS_MAX_THREADS) or k,
           _env.PARSE_THREADS: _env.get(_env.PARSE_THREADS, k) or k,
           _env.JEMALLOC_CONF: user_env(_env.JEMALLOC_CONF) or polars_jemalloc_conf(cli_command())}
    import dask

    # one task per worker thread at a time: a worker that dies is blamed on the task it ran, not on queued ones
    dask.config.set({"distributed.scheduler.worker-saturation": 1.0})
    try:
        return LocalCluster(n_workers=target.workers, threads_per_worker=1, processes=True, host="127.0.0.1",  # type: ignore[no-untyped-call]
                            dashboard_address="127.0.0.1:0", worker_dashboard_address="127.0.0.1:0",
                            silence_logs=logging.CRITICAL, env=env)
    except Exception as e:  # noqa: BLE001 - one line: the local cluster could not start
        raise ClusterError(f"--cluster {target.text}: the local cluster did not start ({type(e).__name__}: {e})") from None


def _connect(target: Target, cluster: Any) -> "Client":
    from distributed import Client

    try:
        if cluster is not None:
            return Client(cluster, set_as_default=False)  # type: ignore[no-untyped-call]
        if target.scheduler_file is not None:
            return Client(scheduler_file=target.scheduler_file, timeout=CONNECT_S, set_as_default=False)  # type: ignore[no-untyped-call]
        return Client(target.address, timeout=CONNECT_S, set_as_default=False)  # type: ignore[no-untyped-call]
    except (OSError, TimeoutError) as e:
        raise ClusterError(f"--cluster {target.text}: cannot reach the scheduler within {CONNECT_S:.0f} s "
                           f"({type(e).__name__}); check the address and that the scheduler is running") from None
    except Exception as e:  # noqa: BLE001
        raise ClusterError(f"--cluster {target.text}: cannot connect ({type(e).__name__}: {e})") from None


def _wait_workers(client: "Client", target: Target) -> None:
    try:
        client.wait_for_workers(1, timeout=WORKERS_S)
    except (TimeoutError, OSError):
        raise ClusterError(f"--cluster {target.text}: the scheduler has no workers after {WORKERS_S:.0f} s; start workers "
                           "(`dask worker ADDR`) that can read the trace files") from None


@contextlib.contextmanager
def cluster_client(text: str, *, threads: int | None = None) -> Iterator["Client"]:
    """A connected client for ``--cluster text`` (module docstring); closed, with its local cluster, on exit."""
    target = parse_address(text)
    require_dask()
    quiet = [logging.getLogger(n) for n in ("distributed", "tornado")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:  # a worker's restart or a refused connection is reported by tracekit, in one line
        lg.setLevel(logging.CRITICAL)
    cluster = _start_local(target, threads) if target.workers else None
    client = None
    try:
        client = _connect(target, cluster)
        _wait_workers(client, target)
        yield client
    finally:
        with contextlib.suppress(Exception):
            if client is not None:
                client.close(timeout=5)  # type: ignore[no-untyped-call]
        with contextlib.suppress(Exception):
            if cluster is not None:
                cluster.close(timeout=10)
        for lg, lv in zip(quiet, levels):
            lg.setLevel(lv)
