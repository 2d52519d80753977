"""Helpers for tests that start servers (the fake OpenAI server, a real vLLM server): a free port
and a stop that waits for a run's own finished requests. Not a test module."""

from __future__ import annotations

import socket
import threading
import time


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS's pick)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StopAfterFinished:
    """Stops a server once ``n`` requests of a run have finished well (the run's own records,
    driver.RunOptions.on_request), or after ``timeout_s`` without them. A fixed delay before the
    stop raced the first requests on a loaded machine: no request had finished when it came."""

    def __init__(self, n: int, stop, timeout_s: float = 60.0):
        self.n, self.ok, self.reached = n, 0, threading.Event()
        self.stopped_at: float | None = None

        def wait_then_stop():
            self.reached.wait(timeout_s)
            self.stopped_at = time.monotonic()
            stop()

        self.thread = threading.Thread(target=wait_then_stop, daemon=True)
        self.thread.start()

    def on_request(self, rec: dict) -> None:
        self.ok += bool(rec.get("ok"))
        if self.ok >= self.n:
            self.reached.set()

    def join(self) -> None:
        self.thread.join()
