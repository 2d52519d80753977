"""How a validator command stops: Ctrl-C and SIGTERM unwind the same way (every ``except
KeyboardInterrupt`` cleanup runs), and the command ends 130 or 143.

``Terminated`` is SIGTERM's KeyboardInterrupt; ``terminate_as_interrupt()`` raises it for SIGTERM
inside a block; ``run_stoppable(coro)`` is asyncio.run with a stop turned into a cancel of the run,
raised after it. Imports nothing of the validator's, so the driver, the launcher and the server
client can all use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
from collections.abc import Iterator

from dsim.cli import toolmain
from dsim.outputs import note_stop


class Terminated(KeyboardInterrupt, toolmain.Terminated):
    """SIGTERM: unwinds as Ctrl-C does (every ``except KeyboardInterrupt`` cleanup runs); the
    command then ends with 143 instead of 130 (recorded with dsim.outputs.note_stop, so dsim's
    main tells it from a Ctrl-C where typer has turned either into 130)."""


def stop_exit_code(e: BaseException) -> int:
    """130 for Ctrl-C, 143 for SIGTERM."""
    return 143 if isinstance(e, Terminated) else 130


def _sigterm(signum, frame):
    raise note_stop(Terminated(f"signal {signum}"))


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Inside: SIGTERM raises Terminated, a KeyboardInterrupt (in the main thread), so cleanup runs
    as for Ctrl-C."""
    try:
        old = signal.signal(signal.SIGTERM, _sigterm)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_stoppable(coro):
    """asyncio.run, with Ctrl-C and SIGTERM turned into a cancel of the run (its requests cancelled
    and awaited, the file discarded) and raised after it: KeyboardInterrupt, or Terminated for
    SIGTERM. Raised by a signal handler wherever the loop happened to be, the stop hit the HTTP client
    mid-connect and asyncio printed the half-finished requests' tracebacks on its way out."""
    if threading.current_thread() is not threading.main_thread():
        return asyncio.run(coro)
    stops = {signal.SIGINT, signal.SIGTERM}
    got: list[int] = []
    old = {sig: signal.getsignal(sig) for sig in stops}

    async def main():
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None

        def on_stop(sig: int) -> None:
            got.append(sig)
            task.cancel()

        for sig in stops:
            loop.add_signal_handler(sig, on_stop, sig)
        try:
            return await coro
        finally:  # held from here until the caller's handlers are back (the loop resets them to default)
            signal.pthread_sigmask(signal.SIG_BLOCK, stops)

    mask = signal.pthread_sigmask(signal.SIG_BLOCK, set())
    result = None
    try:
        result = asyncio.run(main())
    except BaseException:
        if not got:  # (stopped, the run ends as stopped whatever it raised on the way)
            raise
    finally:
        for sig, h in old.items():
            if h is not None:
                signal.signal(sig, h)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)  # (a stop held meanwhile is raised here)
    if got:
        from dsim.outputs import note_stop

        raise note_stop(Terminated(f"signal {got[0]}") if got[0] == signal.SIGTERM else KeyboardInterrupt())
    return result
