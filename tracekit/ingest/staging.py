"""Convert's part directories next to the output, and the cleanup of those a killed conversion left.

A conversion stages its parts in ``.tracekit-parts-<pid>-<host>-<random>`` beside the output
(same filesystem: the finished file is renamed into place). A conversion killed by SIGKILL or the
OOM killer cannot remove it; the next conversion into that directory does, when it is sure the owner
is gone, and never touches a live process's directory:

* this host, pid not running: gone, removed;
* this host, pid running but started after the directory was made: the pid was reused, removed;
* this host, pid running since before: kept (a conversion running in parallel);
* another host (a shared filesystem): kept, its pid cannot be checked here;
* an older name without pid or host (``.tracekit-parts-<random>``, tracekit before the pid was in the
  name): removed only when nothing in it changed for :data:`LEGACY_STALE_S` and no process on this
  host has a file in it open (``/proc``); kept when that cannot be told.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import tempfile
import time
from pathlib import Path

__all__ = ["PARTS_PREFIX", "LEGACY_STALE_S", "make_part_dir", "remove_part_dir", "remove_stale_parts", "host_tag"]

#: temporary part directories next to the output: ``.tracekit-parts-<pid>-<host>-<random>``
PARTS_PREFIX = ".tracekit-parts-"
#: a part directory without pid in its name is stale when nothing in it changed for this long (s)
LEGACY_STALE_S = 3600.0

_NAME = re.compile(r"^(?P<pid>\d+)-(?:(?P<host>[A-Za-z0-9-]+)-)?(?P<rand>[a-z0-9_]+)$")


def host_tag() -> str:
    """This host's name as it appears in part directory names (letters, digits, dashes; at most 40)."""
    h = re.sub(r"[^A-Za-z0-9-]", "-", socket.gethostname().split(".")[0]) or "host"
    return h[:40]


def make_part_dir(out_dir: str) -> str:
    """A fresh part directory in ``out_dir`` named after this process (raises OSError)."""
    return tempfile.mkdtemp(prefix=f"{PARTS_PREFIX}{os.getpid()}-{host_tag()}-", dir=out_dir)


def remove_part_dir(path: str, tries: int = 20, pause_s: float = 0.1) -> bool:
    """Remove this conversion's part directory; True when it is gone. Never raises.

    Tasks of the conversion may still run on other processes (a cluster cannot stop a running task): one that
    creates a file while the directory is being removed makes that pass fail, so it is retried (``tries``
    passes, ``pause_s`` apart). Once the directory is gone no task can write there again: tasks create files
    only in directories that exist (never their parents)."""
    for i in range(tries):
        shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            return True
        time.sleep(pause_s)
    return False


def remove_stale_parts(out_dir: str) -> list[str]:
    """Remove the part directories of dead conversions in ``out_dir`` (see the module docstring);
    returns the names removed. Never raises."""
    try:
        names = [n for n in os.listdir(out_dir) if n.startswith(PARTS_PREFIX)]
    except OSError:
        return []
    removed = []
    me = host_tag()
    for n in names:
        path = os.path.join(out_dir, n)
        try:
            if not os.path.isdir(path) or os.path.islink(path):
                continue
            if _stale(path, n[len(PARTS_PREFIX):], me):
                shutil.rmtree(path, ignore_errors=True)
                if not os.path.exists(path):
                    removed.append(n)
        except OSError:
            continue
    return removed


def _stale(path: str, rest: str, me: str) -> bool:
    m = _NAME.match(rest)
    if m is None:  # an older name without pid: by age and open files only
        return _legacy_stale(path)
    host = m.group("host")
    if host is not None and host != me:
        return False  # another host's conversion (shared filesystem): its pid means nothing here
    pid = int(m.group("pid"))
    if pid == os.getpid():
        return False
    started = _process_start(pid)
    if started is None:
        return _pid_gone(pid)
    # running: the owner only if it started before the directory last changed (it made it after it started):
    # a process that started later reuses the pid of a dead owner
    return started > os.stat(path).st_mtime + 1.0


def _pid_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # EPERM: another user's live process
        return False
    return False


def _process_start(pid: int) -> float | None:
    """When process ``pid`` started (epoch seconds), from /proc; None if it does not run or /proc cannot tell."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        ticks = int(stat.rsplit(")", 1)[1].split()[19])  # field 22, after the command name
        btime = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines() if ln.startswith("btime "))
        return btime + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


def _newest_mtime(path: str) -> float:
    times = [os.stat(path).st_mtime]
    for e in os.scandir(path):
        try:
            times.append(e.stat(follow_symlinks=False).st_mtime)
        except OSError:
            pass
    return max(times)


def _legacy_stale(path: str) -> bool:
    if time.time() - _newest_mtime(path) < LEGACY_STALE_S:
        return False
    held = _held_open(path)
    return held is False


def _held_open(path: str) -> bool | None:
    """Whether some process on this host has a file inside ``path`` open; None when /proc cannot tell."""
    real = os.path.realpath(path) + os.sep
    # a part directory is private (0700): when it is ours, other users' processes (whose fds we cannot
    # read) cannot have opened files in it
    ours = os.stat(path).st_uid == os.geteuid()
    try:
        pids = [d for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except FileNotFoundError:
            continue  # exited meanwhile
        except OSError:
            if ours:
                continue
            return None
        for fd in fds:
            try:
                if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(real):
                    return True
            except OSError:
                continue
    return False
