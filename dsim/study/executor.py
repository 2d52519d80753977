"""Where simulations run: local processes or a Ray cluster, behind one interface.

``make_executor("local", jobs)`` runs each call inline (jobs=1) or in a process pool;
``make_executor("ray", jobs, address)`` runs each call as a Ray task. Both hand back
``concurrent.futures.Future`` objects, so callers (dsim.study.capacity.Runner, the node-count search, the
sweep) wait on them the same way and get the same results: a call's result depends only on its
arguments, never on where it ran.

Ray specifics:

- the cluster is the one at ``address`` (the ``--ray-address`` flag), else the one named by the
  ``RAY_ADDRESS`` environment variable, else a local Ray started for the run (``jobs`` CPUs, all
  by default) and stopped at the end; a Ray already initialised in this process is used as it is
  and left running;
- a joined cluster gets this dsim package with the job (Ray's runtime_env py_modules), so its
  workers run the driver's code; the nodes need dsim's dependencies (numpy, pandas, ...) and ray;
- large arguments are shipped once: a dataclass argument (a simulation point) is sent field by
  field, and every field that is itself a dataclass (the workload, the profile, the method's
  configuration) is put into the object store once per object; the tasks take the references;
- a cluster that cannot be reached, or ray not installed, is an InputError (one line, exit 2);
- closing after an error or Ctrl-C cancels every unfinished task before shutting Ray down.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import signal
import socket
import threading
from collections.abc import Callable
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any, Protocol

from dsim.errors import InputError

EXECUTORS = ("local", "ray")
RAY_INSTALL_HINT = "pip install -e '.[ray]'"
# How long the reachability probe of --ray-address waits: ray.init itself retries an unreachable
# cluster for minutes.
CONNECT_TIMEOUT_S = 5.0


class Executor(Protocol):
    """Runs fn(*args, **kwargs) somewhere; the Future holds its result or its exception."""

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future: ...

    def close(self, cancel: bool = False) -> None: ...


# ---- local ------------------------------------------------------------------------------------


def _worker_init() -> None:
    """A pool worker leaves Ctrl-C to the main process: a terminal's Ctrl-C reaches the whole
    process group, and a worker's own KeyboardInterrupt would print its traceback. The main
    process stops the workers (``LocalExecutor.close(cancel=True)``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class LocalExecutor:
    """Inline (jobs=1) or a process pool of `jobs` workers."""

    def __init__(self, jobs: int):
        self.jobs = jobs
        self.pool = ProcessPoolExecutor(max_workers=jobs, initializer=_worker_init) if jobs > 1 else None

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        if self.pool is not None:
            return self.pool.submit(fn, *args, **kwargs)
        f: Future = Future()
        try:
            f.set_result(fn(*args, **kwargs))
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - surfaced by .result()
            f.set_exception(e)
        return f

    def close(self, cancel: bool = False) -> None:
        """Wait for the workers to finish; with ``cancel`` (an error, Ctrl-C, SIGTERM) end them at
        once instead: waiting for a running simulation would hold the stop for its whole length,
        and a second Ctrl-C during that wait would leave them running on their own."""
        pool, self.pool = self.pool, None
        if pool is None:
            return
        if not cancel:
            pool.shutdown(cancel_futures=True)
            return
        procs = list((getattr(pool, "_processes", None) or {}).values())
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        try:  # (a further Ctrl-C waits until every worker is gone)
            for p in procs:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    p.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
            for p in procs:
                with contextlib.suppress(OSError, ValueError, AttributeError):
                    p.join(5)
                    if p.is_alive():
                        p.kill()
                        p.join(5)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, old)


# ---- ray --------------------------------------------------------------------------------------


def import_ray():
    """The ray module, or an InputError saying how to install it. A stop during the import (seconds)
    is delivered once it is done: raised inside the import of one of Ray's compiled modules, it was
    swallowed there with a printed traceback and the run went on."""
    try:
        with _stops_held():
            import ray
    except ImportError:
        raise InputError(f"--executor ray: ray is not installed ({RAY_INSTALL_HINT})") from None
    return ray


def resolve_address(address: str | None) -> str | None:
    """The cluster to join: the flag, else RAY_ADDRESS, else None (start a local Ray)."""
    a = (address or "").strip() or os.environ.get("RAY_ADDRESS", "").strip()
    return a or None


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a 'host:port' or 'ray://host:port' address; None for 'auto'/'local'."""
    a = address.removeprefix("ray://")
    if a in ("auto", "local"):
        return None
    host, sep, port = a.rpartition(":")
    if not sep or not host:
        raise InputError(f"--ray-address: {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    try:
        p = int(port)
    except ValueError:
        raise InputError(f"--ray-address: {address!r}: port {port!r} is not a number") from None
    if not 0 < p < 65536:
        raise InputError(f"--ray-address: {address!r}: port {p} out of range")
    return host.strip("[]"), p


# HTTP/2's client connection preface and an empty SETTINGS frame (RFC 9113 3.4, 6.5)
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def probe_address(address: str, timeout_s: float = CONNECT_TIMEOUT_S) -> None:
    """Fail fast (InputError) when nothing listens at the cluster's address, or what listens
    is not Ray: Ray's GCS and its client server are gRPC services, so they answer HTTP/2's
    connection preface with a SETTINGS frame; anything else (an HTTP/1 server, a silent port)
    would leave ray.init retrying for minutes."""
    hp = _host_port(address)
    if hp is None:
        return
    try:
        with socket.create_connection(hp, timeout=timeout_s) as s:
            s.settimeout(timeout_s)
            s.sendall(_H2_PREFACE)
            head = b""
            while len(head) < 9:
                got = s.recv(9 - len(head))
                if not got:
                    break
                head += got
    except TimeoutError:
        raise InputError(
            f"--ray-address: {address} does not answer as a Ray cluster (no gRPC answer within {timeout_s:g} s)"
        ) from None
    except OSError as e:
        why = e.strerror or type(e).__name__
        raise InputError(f"--ray-address: no Ray cluster reachable at {address} ({why})") from None
    if len(head) < 9 or head[3] != 0x04:
        raise InputError(f"--ray-address: {address} is not a Ray cluster (it does not speak gRPC)")


def check_executor(kind: str, address: str | None = None) -> None:
    """Validate the executor flags before any work: unknown kind, --ray-address without ray,
    ray missing, a cluster address nobody answers at."""
    if kind not in EXECUTORS:
        raise InputError(f"--executor: must be local or ray, got {kind!r}")
    if kind == "local":
        if address:
            raise InputError("--ray-address: only with --executor ray")
        return
    import_ray()
    a = resolve_address(address)
    if a is not None:
        probe_address(a)


@dataclasses.dataclass(frozen=True)
class _Ref:
    """Placeholder in a packed argument: the index of an object-store reference among the
    task's positional arguments (Ray resolves those before the task runs)."""

    index: int


@dataclasses.dataclass(frozen=True)
class _Packed:
    """A dataclass argument sent field by field."""

    cls: type
    fields: dict


def _unpack(x, objs):
    if isinstance(x, _Ref):
        return objs[x.index]
    if isinstance(x, _Packed):
        return x.cls(**{k: _unpack(v, objs) for k, v in x.fields.items()})
    return x


def _ray_call(fn, args, kwargs, *objs):
    """Body of every Ray task: rebuild the arguments around the shipped objects and call fn."""
    return fn(*(_unpack(a, objs) for a in args), **{k: _unpack(v, objs) for k, v in kwargs.items()})


def _shippable(v) -> bool:
    return dataclasses.is_dataclass(v) and not isinstance(v, type)


def _packable(v) -> bool:
    return _shippable(v) and all(f.init for f in dataclasses.fields(v))


def _package_dir() -> str:
    """This dsim package's directory: shipped to a joined cluster (runtime_env py_modules) so its
    workers run the driver's code, whatever the nodes have installed."""
    from pathlib import Path

    return str(Path(__file__).resolve().parents[1])


def _join_failure(e: BaseException, log: str) -> str:
    """Why ray.init could not join, in one line (its own message is only 'Failed to connect')."""
    text = log
    last = e
    cur: BaseException | None = e
    while cur is not None:
        text += "\n" + str(cur)
        last = cur
        cur = cur.__cause__
    if "InvalidAuthToken" in text or "AuthenticationError" in text:
        return (
            "the cluster uses token authentication and this process has no valid token (set "
            "RAY_AUTH_MODE=token and the cluster's token, e.g. RAY_AUTH_TOKEN)"
        )
    lines = [x.strip() for x in str(last).strip().splitlines() if x.strip()]
    line = lines[-1] if lines else type(last).__name__
    return line if len(line) <= 240 else line[:237] + "..."


class _Captured:
    """What a block wrote to file descriptor 2 (read when the block ends)."""

    text = ""

    def getvalue(self) -> str:
        return self.text


@contextlib.contextmanager
def _stderr_captured():
    """File descriptor 2 into a temporary file for the block (native code's logs included)."""
    import sys
    import tempfile

    out = _Captured()
    with tempfile.TemporaryFile() as f:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            out.text = f.read().decode(errors="replace")


_held: list[bool] = []  # _stops_held is active in the main thread
_fork_hook: list[bool] = []  # the at-fork hook below is registered (once per process)


def _child_of_a_held_start() -> None:
    """In a process forked while stops are held (Ray's GCS, raylet, agents): a process group of its
    own, so that a stop sent to the run's whole group (``timeout``, ``kill -- -PGID``, a terminal's
    Ctrl-C) reaches only this process, which cancels the tasks and shuts Ray down in order (stopped
    directly, Ray's GCS died first and the driver waited a minute for it, then exited 1); and
    SIGTERM unblocked, so ray.shutdown's SIGTERM ends it at once (blocked, each waits out Ray's
    grace second and gets SIGKILL: 5.2 s against 1.7 s for a local Ray)."""
    if _held:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)


@contextlib.contextmanager
def _stops_held(restore_term=None):
    """SIGINT and SIGTERM blocked (held pending) for the block, delivered when it ends. Used while
    Ray is imported, starts and stops: a stop in the middle of ray.init or ray.shutdown leaves
    Ray's processes running, and ray.init installs SIGTERM handlers of its own (Python's
    sys.exit(15), then a native one that aborts with a stack dump). The processes started meanwhile
    leave the run's process group (``_child_of_a_held_start``); Ray itself starts them with SIGINT
    blocked. With ``restore_term``, that SIGTERM handler is put back over Ray's before the signals
    are let through."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if not _fork_hook:
        os.register_at_fork(after_in_child=_child_of_a_held_start)
        _fork_hook.append(True)
    old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    _held.append(True)
    try:
        yield
    finally:
        _held.pop()
        if restore_term is not None and signal.getsignal(signal.SIGTERM) is not restore_term:
            signal.signal(signal.SIGTERM, restore_term)
        signal.pthread_sigmask(signal.SIG_SETMASK, old)  # a held stop is raised here


class RayExecutor:
    """Each call a Ray task (1 CPU); big dataclass fields put into the object store once."""

    def __init__(self, jobs: int | None, address: str | None = None):
        ray = import_ray()
        self.ray = ray
        self.owned = False  # we connected (local Ray started, or a cluster joined)
        self.started_local = False
        # the caller's SIGTERM handler (the CLI's ends the run as stopped: exit 143, tasks cancelled,
        # staged outputs removed), put back over Ray's once ray.init returns
        term = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        if ray.is_initialized():  # the caller's Ray (e.g. a test's local cluster)
            self.address = "already initialised in this process"
        else:
            a = resolve_address(address)
            quiet = {"include_dashboard": False, "logging_level": logging.ERROR, "log_to_driver": False}
            if a is None:
                try:
                    with _stops_held(restore_term=term):
                        ray.init(num_cpus=jobs or os.cpu_count() or 1, **quiet)
                except BaseException:  # a stop held during the start, or a failed start
                    self._shutdown()
                    raise
                self.started_local = True
                self.address = "local Ray started for this run"
            else:
                probe_address(a)
                try:
                    with (
                        _stops_held(restore_term=term),
                        _stderr_captured() as log,
                    ):  # Ray's C++ client logs each retry to fd 2
                        ray.init(address=a, runtime_env={"py_modules": [_package_dir()]}, **quiet)
                except (ConnectionError, RuntimeError, ValueError) as e:
                    self._shutdown()
                    why = _join_failure(e, log.getvalue())
                    raise InputError(f"--ray-address: cannot join the Ray cluster at {a}: {why}") from None
                except BaseException:
                    self._shutdown()
                    raise
                self.address = a
            self.owned = True
        self._task = ray.remote(num_cpus=1, max_retries=0)(_ray_call)
        self._store: dict[int, tuple[object, object]] = {}  # id(obj) -> (obj, ref): kept alive
        self._pending: dict[object, Future] = {}  # ref -> future, unfinished tasks
        self._lock = threading.Lock()

    def _put(self, obj, refs: list) -> _Ref:
        hit = self._store.get(id(obj))
        if hit is None:
            hit = (obj, self.ray.put(obj))
            self._store[id(obj)] = hit
        refs.append(hit[1])
        return _Ref(len(refs) - 1)

    def _pack(self, x, refs: list):
        if _packable(x):
            return _Packed(
                type(x),
                {
                    f.name: (self._put(v, refs) if _shippable(v) else v)
                    for f in dataclasses.fields(x)
                    for v in (getattr(x, f.name),)
                },
            )
        return x

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        refs: list = []
        pa = tuple(self._pack(a, refs) for a in args)
        pk = {k: self._pack(v, refs) for k, v in kwargs.items()}
        ref = self._task.remote(fn, pa, pk, *refs)
        out: Future = Future()
        with self._lock:
            self._pending[ref] = out
        ref.future().add_done_callback(lambda rf, ref=ref: self._settle(ref, rf))
        return out

    def _settle(self, ref, rf: Future) -> None:
        with self._lock:
            out = self._pending.pop(ref, None)
        if out is None or out.done():
            return
        e = rf.exception()
        if e is None:
            out.set_result(rf.result())
            return
        # a task's own exception (e.g. an InputError) reaches the caller as itself, not wrapped
        cause = getattr(e, "cause", None)
        out.set_exception(cause if isinstance(cause, BaseException) else e)

    def close(self, cancel: bool = False) -> None:
        ray = self.ray
        with self._lock:
            pending = list(self._pending.items())
            if cancel:
                self._pending.clear()
        if cancel:
            for ref, fut in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001, S110 - finished meanwhile, or the cluster is gone
                    pass
                fut.cancel()
        self._store.clear()
        if self.owned:
            self._shutdown()

    def _shutdown(self) -> None:
        """ray.shutdown, with Ctrl-C and SIGTERM held until it is done (then delivered)."""
        with _stops_held():
            self.ray.shutdown()  # (also ends the processes of a start that failed half-way)


def make_executor(kind: str, jobs: int, address: str | None = None) -> Executor:
    """An executor of `kind` ('local' or 'ray'); jobs: local workers, or a local Ray's CPUs."""
    check_executor(kind, address if kind == "local" else None)
    if kind == "ray":
        return RayExecutor(jobs, address)
    return LocalExecutor(jobs)
