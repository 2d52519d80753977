"""A kernel that has a Python path with the same results, compiled in a background process when
numba's on-disk cache lacks it.

``dsim.engine.compiled_general_steps.run_general_steps`` runs consecutive general steps of a replica as one
compiled call; the engine's Python path runs the same steps with the same results, slower only
where one replica runs many general steps alone (a closed loop on one replica). Its compile is
about a fifth of a cold start, and the quick-start plan (eight replicas a node stepping in turn)
calls it about once a replica. So where the cache lacks it, the engine asks ``Deferred.usable()``
and takes its Python path meanwhile: a background process compiles the kernel into numba's cache
(the file numba writes for a later run as well), from the moment the kernels it shares with the
Python path are compiled here (they are then in the cache, loaded by the background process
rather than compiled twice), and the kernel is used from the step after that process ended.
One background compile at a time per cache entry (a lock file next to numba's index, holding the
compiling process's id); where it fails, the kernel is compiled here as before.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence

# The background process: compiles one kernel for one signature into numba's cache, then
# removes its lock file. argv: the pickle of (package root, module, function, signature), the lock.
_CHILD = r"""
import os, pickle, sys
job, lock = sys.argv[1], sys.argv[2]
try:
    with open(job, "rb") as f:
        root, module, name, sig = pickle.load(f)
    sys.path.insert(0, root)
    import importlib
    getattr(importlib.import_module(module), name).compile(sig)
finally:
    for p in (job, lock):
        try:
            os.unlink(p)
        except OSError:
            pass
"""


_children: list = []  # (launcher's pid, Popen, job file, lock file) of the background processes started here


def _alive(pid: int) -> bool:
    for parent, p, _, _ in _children:  # (this process's own: reaped, a zombie is not alive; a
        if p.pid == pid and parent == os.getpid():  # forked worker cannot wait for its parent's child)
            return p.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Deferred:
    """`disp` (a numba dispatcher with cache=True) compiled in the background where its cache
    entry is missing. `shared`: the kernels that compiling `disp` compiles with it and that the
    Python path compiles itself; the background process starts once they are compiled here."""

    POLL_S = 0.5  # how often (wall time) a process looks for the finished cache entry
    background = True  # False: compiled here on first use, as any kernel (the test suite's choice)

    def __init__(self, disp, shared: Callable[[], Sequence]):
        self.disp = disp
        self.shared = shared
        self.state = "unknown"  # -> "ready" | "waiting" (for the shared kernels) | "compiling"
        if not hasattr(disp, "overloads"):  # (a plain function: numba's JIT disabled)
            self.state = "ready"
        self._next_poll = 0.0

    def _index(self) -> dict:
        try:
            return self.disp._cache._cache_file._load_index()
        except Exception:  # (no on-disk cache for it: nothing to wait for)
            return {"": None}

    def _lock_path(self) -> str | None:
        try:
            base = self.disp._cache._cache_file._index_path
        except Exception:
            return None
        return base + ".compiling"

    def usable(self) -> bool:
        """Whether the engine should try the compiled call now (ready, or ready to be asked with
        the call's arguments); False while the background process compiles it."""
        if self.state == "ready":
            return True
        if self.disp.overloads or not self.background:
            self.state = "ready"
            return True
        if self.state != "compiling":
            return True
        now = time.monotonic()
        if now < self._next_poll:
            return False
        self._next_poll = now + self.POLL_S
        if self._index():
            self.state = "ready"  # (the call loads it from the cache)
            return True
        lock = self._lock_path()
        if lock is not None and self._lock_owner(lock) is not None:
            return False
        # the background process ended without a cache entry: compile here, as without it
        self.state = "ready"
        return True

    @staticmethod
    def _lock_owner(lock: str) -> int | None:
        """The id of the live process that holds the lock, else None (no lock, or its process
        died). A lock written a moment ago may not hold an id yet: it counts as held."""
        try:
            with open(lock) as f:
                text = f.read().strip()
            if not text:
                return -1 if time.time() - os.stat(lock).st_mtime < 60 else None
            pid = int(text)
        except (OSError, ValueError):
            return None
        return pid if _alive(pid) else None

    def ready(self, args: tuple) -> bool:
        """Whether to call the kernel on `args` now: True where it is compiled here or in the
        cache (or has no cache); else it starts (or waits for) the background compile and
        returns False, and the caller takes its Python path."""
        if not self.usable():
            return False
        if self.state == "ready":
            return True
        if self._index():
            self.state = "ready"
            return True
        if not all(d.overloads for d in self.shared()):
            self.state = "waiting"
            return False
        return self._start(args)

    def _start(self, args: tuple) -> bool:
        from numba import typeof

        lock = self._lock_path()
        if lock is None:
            self.state = "ready"
            return True
        sig = tuple(typeof(a) for a in args)
        f = self.disp.py_func
        package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        root = os.path.dirname(package)  # (where dsim is imported from)
        try:
            os.makedirs(os.path.dirname(lock), exist_ok=True)
            if self._lock_owner(lock) is None:  # (a lock left by a process that died: taken over)
                try:
                    os.unlink(lock)
                except OSError:
                    pass
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.write(fd, str(os.getpid()).encode())
            os.close(fd)
        except FileExistsError:  # (another process compiles it: wait for its cache entry)
            self.state = "compiling"
            return False
        except OSError:  # (the cache folder cannot be written: compile here)
            self.state = "ready"
            return True
        try:
            with tempfile.NamedTemporaryFile("wb", suffix=".dsim-compile", delete=False) as job:
                pickle.dump((root, f.__module__, f.__name__, sig), job)
            p = subprocess.Popen(
                [sys.executable, "-c", _CHILD, job.name, lock],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            _children.append((os.getpid(), p, job.name, lock))
            with open(lock + ".pid", "w") as out:  # (the compiling process's id, replacing ours at once)
                out.write(str(p.pid))
            os.replace(lock + ".pid", lock)
        except Exception:
            try:
                os.unlink(lock)
            except OSError:
                pass
            self.state = "ready"
            return True
        self.state = "compiling"
        self._next_poll = time.monotonic() + self.POLL_S
        from dsim.engine import compile_notice

        compile_notice.note(
            self.disp, f"{f.__name__}: compiling in a background process (meanwhile its steps run in Python)"
        )
        return False


def finish(wait_s: float, say: Callable[[str], None] | None = None) -> None:
    """Before the command exits: no background compile outlives it. Those this process started and
    still running are given up to `wait_s` seconds to finish filling numba's cache for later runs
    (`say` tells the user once that it waits), then ended, their job and lock files removed (an
    interrupted or failed command passes 0: they end at once)."""
    mine = [c for c in _children if c[0] == os.getpid()]
    running = [c for c in mine if c[1].poll() is None]
    if running and wait_s > 0:
        if say is not None:
            say(f"dsim: finishing a kernel compile for later runs (at most {wait_s:.0f} s; Ctrl-C skips it)")
        end = time.monotonic() + wait_s
        try:
            for c in running:
                c[1].wait(timeout=max(end - time.monotonic(), 0.0))
        except (subprocess.TimeoutExpired, KeyboardInterrupt):
            pass
    for c in mine:
        _, p, job, lock = c
        if p.poll() is None:
            p.kill()
            p.wait()
            for path in (job, lock):
                try:
                    os.unlink(path)
                except OSError:
                    pass
        _children.remove(c)
