"""The captured program's stderr, relayed to tracekit's own until tracekit stops the program.

``tracekit capture -- PROGRAM`` stops the program once its trace is on disk (``--after stop``): a SIGINT to
its process group. What the program and its launcher write after that is their reaction to the stop that
tracekit chose, not something the user did: the program's KeyboardInterrupt traceback, torchrun's
"Received 2 death signal" lines and its SignalException traceback, a peer's "Connection closed" error.
:class:`StderrRelay` passes the program's stderr through as it comes (chunks, so progress bars still
draw) and, from :meth:`StderrRelay.mute` on, keeps it instead (the last ``keep_bytes``), for
``--keep-raw``. When tracekit's stderr is a terminal the program writes to a pseudo-terminal, so it still
sees a terminal (colours, progress bars); otherwise to a pipe. A Ctrl-C the user sends is passed on
without muting: the program's reaction is then shown.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["StderrRelay"]


class StderrRelay:
    """Create it, pass :attr:`child_fd` as the program's stderr, call :meth:`started` after the spawn,
    :meth:`mute` when stopping the program, :meth:`close` after it ended."""

    def __init__(self, keep_bytes: int = 1 << 20) -> None:
        self.keep_bytes = keep_bytes
        self.held = bytearray()
        self.muted = False
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        try:
            self._out = sys.stderr.fileno()
        except (AttributeError, OSError, ValueError):
            self._out = 2
        self._read_fd, self.child_fd = self._open(os.isatty(self._out))

    @staticmethod
    def _open(tty: bool) -> tuple[int, int]:
        if tty:
            try:
                import pty
                import termios

                master, slave = pty.openpty()
                attrs = termios.tcgetattr(slave)
                attrs[1] &= ~termios.OPOST  # bytes as written: no \n -> \r\n on the way through
                termios.tcsetattr(slave, termios.TCSANOW, attrs)
                return master, slave
            except (ImportError, OSError):
                pass
        r, w = os.pipe()
        return r, w

    def started(self) -> None:
        """The program holds its end now: close ours and start relaying."""
        os.close(self.child_fd)
        self._thread = threading.Thread(target=self._pump, name="tracekit-stderr", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        while True:
            try:
                chunk = os.read(self._read_fd, 65536)
            except OSError:  # a pseudo-terminal whose last writer closed reads EIO
                break
            if not chunk:
                break
            with self._lock:
                if self.muted:
                    self.held += chunk
                    del self.held[: max(0, len(self.held) - self.keep_bytes)]
                    continue
            self._write(chunk)

    def _write(self, data: bytes) -> None:
        try:
            sys.stderr.flush()
            while data:
                data = data[os.write(self._out, data):]
        except (OSError, ValueError):
            pass

    def mute(self) -> None:
        """From now on keep what the program writes instead of showing it."""
        with self._lock:
            self.muted = True

    def close(self, timeout_s: float = 2.0) -> None:
        """Wait (briefly: a process the program left behind may hold its end) for the rest, then stop."""
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                return  # still read by the daemon thread: left to the process' exit
        try:
            os.close(self._read_fd)
        except OSError:
            pass

    def save(self, path: Path) -> Path | None:
        """Write what was kept after :meth:`mute` to ``path`` (nothing kept: no file)."""
        if not self.held:
            return None
        path.write_bytes(bytes(self.held))
        return path

    def popen_kwargs(self) -> dict[str, Any]:
        return {"stderr": self.child_fd}
