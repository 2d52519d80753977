"""Start and stop a server process: its own process group, /health polling with a timeout, stop by
PID (SIGTERM to the group, SIGKILL after a grace period). Used by `ab` and the test fixtures."""
from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import httpx

from dsim.errors import InputError


def start(cmd, log_path=None, env: dict | None = None, cwd=None) -> subprocess.Popen:
    """Start ``cmd`` (a shell string or an argv list) in a new session (process group)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    log = open(log_path, "ab") if log_path else subprocess.DEVNULL
    try:
        if isinstance(cmd, str):
            return subprocess.Popen(["bash", "-c", "exec " + cmd], stdout=log, stderr=subprocess.STDOUT,
                                    env=full_env, cwd=cwd, start_new_session=True)
        return subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, env=full_env, cwd=cwd,
                                start_new_session=True)
    finally:
        if log is not subprocess.DEVNULL:
            log.close()


def wait_health(url: str, timeout_s: float, proc: subprocess.Popen | None = None,
                log_path=None) -> float:
    """Poll URL/health until 200; InputError on timeout or when the process exits first."""
    t0 = time.monotonic()
    while True:
        if proc is not None and proc.poll() is not None:
            tail = ""
            if log_path and Path(log_path).exists():
                tail = Path(log_path).read_text(errors="replace")[-600:].strip().replace("\n", " | ")
            raise InputError(f"server exited with code {proc.returncode} before {url}/health answered"
                             + (f": ...{tail}" if tail else ""))
        try:
            r = httpx.get(f"{url}/health", timeout=2.0)
            if r.status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        if time.monotonic() - t0 > timeout_s:
            raise InputError(f"{url}/health: no answer within {timeout_s:g}s")
        time.sleep(0.5)


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
    else:   # the leader is gone; children may remain in its group
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return proc.returncode
