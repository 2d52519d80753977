"""Says on stderr when dsim's compiled kernels are being compiled, and nothing when they are not.

The kernels (numba, ``cache=True``) are compiled on a process's first call of each, unless
numba's on-disk cache holds them (the ``__pycache__`` beside each module, or $NUMBA_CACHE_DIR): a first run after an
install or upgrade compiles them for about a minute, later runs load them in about two seconds.
``install()`` (the ``dsim`` command calls it) listens to numba's compile events: each kernel that
Python calls and that has to be compiled is announced as it starts, with the kernels it calls
that are compiled with it (numba compiles a callee on its caller's first compile), their place
in the count of kernels this process has compiled or is compiling, and the time since the first
compile; when the process ends, one line gives the total. Loading from the cache raises no
compile event: a warm run prints nothing.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time
from typing import IO

_installed: Notice | None = None


def _is_dsim(disp) -> bool:
    return getattr(getattr(disp, "py_func", None), "__module__", "").startswith("dsim.")


def _cached(disp) -> bool:
    """Whether `disp` has code in memory or an entry in numba's on-disk cache for its source
    as it is now (numba's cache index; any failure to read it counts as absent)."""
    if disp.overloads:
        return True
    try:
        return bool(disp._cache._cache_file._load_index())
    except Exception:  # (no cache, another numba version's layout)
        return False


def _callees(disp) -> list:
    """The dsim kernels that compiling `disp` compiles with it: the compiled functions it calls,
    directly or through inlined ones (``inline="always"``: inlined, not compiled apart), that
    are neither in memory nor in the on-disk cache. Found by the global names its code reads."""
    from numba.core.dispatcher import Dispatcher

    seen, out, todo = {id(disp)}, [], [disp]
    while todo:
        f = todo.pop().py_func
        for name in f.__code__.co_names:
            g = f.__globals__.get(name)
            if not isinstance(g, Dispatcher) or id(g) in seen or not _is_dsim(g):
                continue
            seen.add(id(g))
            todo.append(g)
            if g.targetoptions.get("inline") != "always" and not _cached(g):
                out.append(g)
    return out


class Notice:
    """The numba compile-event listener behind install(); `stream` receives the lines."""

    def __init__(self, stream: IO | None = None, clock=time.perf_counter):
        self.stream = stream
        self.clock = clock
        self.t0: float | None = None
        self._compiled: set[int] = set()  # dsim kernels compiled or compiling
        self.known = 0  # dsim kernels announced (those compiling now and those they bring with them)
        self._counted: set[int] = set()
        self._lock = threading.Lock()

    def _write(self, text: str) -> None:
        stream = self.stream if self.stream is not None else sys.stderr
        try:
            stream.write(text + "\n")
            stream.flush()
        except (OSError, ValueError):  # (a closed or broken stream: the run goes on silently)
            pass

    def _begin(self, disp, now: float) -> None:
        """The first line, at the first compile."""
        if self.t0 is not None:
            return
        self.t0 = now
        cache = os.environ.get("NUMBA_CACHE_DIR") or os.path.join(
            os.path.dirname(disp.py_func.__code__.co_filename), "__pycache__"
        )
        self._write(
            f"dsim: compiling the simulator's kernels (a first run: numba keeps them in {cache}, later runs load "
            "them in seconds)"
        )

    def on_start(self, disp) -> None:
        if not _is_dsim(disp):
            return
        with self._lock:
            now = self.clock()
            self._begin(disp, now)
            self._compiled.add(id(disp))
            if id(disp) in self._counted:  # (announced with the kernel that calls it)
                return
            self._counted.add(id(disp))
            more = [g for g in _callees(disp) if id(g) not in self._counted]
            self._counted.update(id(g) for g in more)
            first = self.known + 1
            self.known += 1 + len(more)
            span = f"kernel {first}" if not more else f"kernels {first}-{self.known}"
            calls = f" and {len(more)} it calls" if more else ""
            self._write(
                f"dsim:   {span} of {self.known} so far: {disp.py_func.__name__}{calls} ({now - self.t0:.1f} s elapsed)"
            )

    def summary(self) -> None:
        if self._compiled:
            self._write(f"dsim: compiled {len(self._compiled)} kernels in {self.clock() - self.t0:.1f} s")


def install(stream: IO | None = None) -> Notice | None:
    """Announce dsim's kernel compiles on `stream` (stderr) for the rest of this process, and
    their total at its exit. Once per process; returns the listener (None if numba is absent or
    it was installed before)."""
    global _installed
    if _installed is not None:
        return None
    try:
        from numba.core import event
    except ImportError:  # (numba absent: nothing is compiled)
        return None
    notice = Notice(stream)

    class _Listener(event.Listener):
        def on_start(self, ev):
            notice.on_start(ev.data["dispatcher"])

        def on_end(self, ev):
            pass

    event.register("numba:compile", _Listener())
    atexit.register(notice.summary)
    _installed = notice
    return notice


def note(disp, text: str) -> None:
    """One line about `disp` compiled elsewhere (a background process, started only where the
    cache lacks it: a first run), where this process announces compiles; nothing otherwise."""
    if _installed is not None:
        with _installed._lock:
            _installed._begin(disp, _installed.clock())
            _installed._write(f"dsim:   {text}")
