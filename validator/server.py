"""Start and stop a server process: its own process group, /health polling with a timeout, stop by
PID (SIGTERM to the group, SIGKILL after a grace period). Used by `ab` and the test fixtures.

Placement on a small machine (cpu_layout, set_affinity, set_autogroup_nice): a vLLM CPU server is
three processes, the API server (HTTP, detokenizing, streaming), the engine core (scheduler) and
the worker (the model, its OpenMP threads bound to the cores vLLM picks, one core kept "reserved"
for the rest). Left alone, the engine core floats over every core, and it busy-polls (sched_yield)
for the worker's output during each step and for a second after: on the 2-core test machine it
took 60-75% of a core, ran on the reserved core next to the API server and the client, and their
streams stalled (half of the C=6 requests delivered in bursts, steps 7-9 ms). Started on the model
core, with the API server moved to the other one, the engine core's polling only yields to the
worker it waits for: steps 4-5 ms, no stalls (measured, see validator/README.md).

Under Linux autogroup scheduling (``/proc/sys/kernel/sched_autogroup_enabled``) every session is
one scheduling group and a process's nice value only counts inside its own group: a server started
in its own session (as here) at nice -10 still gets only an equal share against another session's
busy job. ``set_autogroup_nice`` gives the whole group the priority (root)."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from dsim.errors import InputError

if TYPE_CHECKING:
    from collections.abc import Iterable, Sequence


def start(
    cmd: str | Sequence[str],
    log_path: str | Path | None = None,
    env: dict | None = None,
    cwd: str | Path | None = None,
    cpus: Iterable[int] | None = None,
) -> subprocess.Popen:
    """Start ``cmd`` (a shell string or an argv list) in a new session (process group); with
    ``cpus``, the process (and what it starts) runs on those CPUs only."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    pre = None
    if cpus:
        cpu_set = set(int(c) for c in cpus)
        pre = lambda: os.sched_setaffinity(0, cpu_set)  # noqa: E731
    try:
        if isinstance(cmd, str):
            return subprocess.Popen(
                ["bash", "-c", "exec " + cmd],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=full_env,
                cwd=cwd,
                start_new_session=True,
                preexec_fn=pre,
            )
        return subprocess.Popen(
            list(cmd),
            stdout=log,
            stderr=subprocess.STDOUT,
            env=full_env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=pre,
        )
    finally:
        if log is not subprocess.DEVNULL:
            log.close()


def cpu_layout(cpus: Iterable[int] | None = None) -> dict | None:
    """Split the CPUs this process may use: ``engine`` (all but the last: the model's OpenMP threads
    and vLLM's engine core) and ``front`` (the last: API server and measuring client). None with
    fewer than 2 CPUs or without affinity control."""
    if cpus is None:
        if not hasattr(os, "sched_getaffinity"):
            return None
        cpus = os.sched_getaffinity(0)
    cpus = sorted(int(c) for c in cpus)
    if len(cpus) < 2:
        return None
    return {"engine": cpus[:-1], "front": cpus[-1:]}


def set_affinity(pid: int, cpus: Iterable[int]) -> int:
    """Move every thread of process ``pid`` to ``cpus``; returns the number of threads moved."""
    moved = 0
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        tids = [str(pid)]
    for tid in tids:
        try:
            os.sched_setaffinity(int(tid), set(int(c) for c in cpus))
            moved += 1
        except OSError:  # a thread that just exited
            pass
    return moved


def autogroup_nice(pid: int = 0) -> int | None:
    """The nice value of the autogroup (session scheduling group) of ``pid`` (0: this process), or
    None when autogroup scheduling is off or unknown here."""
    try:
        if open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() != "1":
            return None
        txt = open(f"/proc/{pid or 'self'}/autogroup").read()
        return int(txt.rsplit("nice", 1)[1])
    except (OSError, ValueError, IndexError):
        return None


def set_autogroup_nice(pid: int, nice: int) -> int | None:
    """Set the nice value of ``pid``'s autogroup (0: this process's); returns the value now in force,
    or None (autogroup off, or not allowed: a negative value needs root)."""
    if autogroup_nice(pid) is None:
        return None
    try:
        with open(f"/proc/{pid or 'self'}/autogroup", "w") as f:
            f.write(str(int(nice)))
    except OSError:
        pass
    return autogroup_nice(pid)


# How long one /health request may take, whole (connect, headers): httpx's own timeouts bound
# each read, so a server trickling a byte at a time would hold a request forever.
HEALTH_REQUEST_S = 2.0


def health_status(url: str, timeout_s: float = HEALTH_REQUEST_S) -> tuple[int | None, str]:
    """One GET of URL/health with a deadline on the whole of it: (status code, '') or (None, why)."""
    import asyncio

    async def get() -> int:
        async with httpx.AsyncClient(timeout=timeout_s) as client:
            # the status line and headers are enough: the body (whatever its size) is never read
            async with client.stream("GET", f"{url}/health") as r:
                return r.status_code

    from validator.stops import run_stoppable  # (a stop cancels the request, then is raised)

    try:
        return run_stoppable(asyncio.wait_for(get(), timeout_s)), ""
    except asyncio.TimeoutError:
        return None, f"no whole answer within {timeout_s:.3g} s"
    except httpx.TimeoutException as e:
        return None, f"{type(e).__name__} after {timeout_s:.3g} s"
    except (httpx.HTTPError, OSError) as e:
        msg = str(e).strip().splitlines()[0][:160] if str(e).strip() else ""
        return None, f"{type(e).__name__}" + (f": {msg}" if msg else "")


def wait_health(
    url: str, timeout_s: float, proc: subprocess.Popen | None = None, log_path: str | Path | None = None
) -> float:
    """Poll URL/health until 200; InputError when ``timeout_s`` has passed (every request counted
    in it, a trickling answer included) or when the process exits first. Returns the seconds it took."""
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    last = "no request made"
    while True:
        if proc is not None and proc.poll() is not None:
            tail = ""
            if log_path and Path(log_path).exists():
                tail = Path(log_path).read_text(errors="replace")[-600:].strip().replace("\n", " | ")
            raise InputError(
                f"server exited with code {proc.returncode} before {url}/health answered"
                + (f": ...{tail}" if tail else "")
            )
        left = deadline - time.monotonic()
        if left <= 0:
            raise InputError(f"{url}/health: server not healthy within {timeout_s:g} s (last try: {last})")
        cut = left < HEALTH_REQUEST_S  # the last request gets what is left
        code, why = health_status(url, max(left, 0.05) if cut else HEALTH_REQUEST_S)
        if code == 200:
            return time.monotonic() - t0
        if code is not None or not cut or last == "no request made":  # (not a shortened try's timeout)
            last = f"HTTP {code}" if code is not None else why
        time.sleep(max(min(0.5, deadline - time.monotonic()), 0.0))


def stop(proc: subprocess.Popen, grace_s: float = 20.0) -> int | None:
    """SIGTERM the process group of ``proc`` (by its PID), then SIGKILL after ``grace_s``."""
    if proc is None:
        return None
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)
    else:  # the leader is gone; children may remain in its group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return proc.returncode
