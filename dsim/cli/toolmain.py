"""The exit contract of the profile builders (dsim.profiling.compose_cli, .aic_tables, .deepep_tables:
``dsim profile compose|aic|deepep`` or ``python3 -m``) and the GPU tools, the same as the ``dsim``
command's:

- bad input (InputError) or a file the OS refuses (OSError): one line ``PROG: error: ...`` on
  stderr, exit code 2, no traceback;
- Ctrl-C (once or twice): ``PROG: interrupted``, exit code 130; SIGTERM: ``PROG: terminated``,
  exit code 143. Both unwind through the ``with`` blocks that stage outputs (dsim.outputs), so
  nothing half-written is left; a second Ctrl-C while unwinding is held off until the staged
  files are gone.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
import threading
from collections.abc import Callable

from dsim.errors import InputError


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that staged outputs are removed on the way out."""


def startup_guard(prog: str) -> None:
    """Until ``run_tool`` takes over: a stop while the modules load (numpy, numba: seconds) ends
    the process at once, quietly, with 130/143 (nothing is written yet). Called first thing in a
    module run as ``__main__``, before its heavy imports."""
    if threading.current_thread() is not threading.main_thread():
        return

    def stop(sig, frame):
        msg, rc = ("interrupted", 130) if sig == signal.SIGINT else ("terminated", 143)
        os.write(2, f"{prog}: {msg}\n".encode())
        os._exit(rc)

    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)


def release_startup_guard() -> None:
    """Python's own Ctrl-C and SIGTERM handling back (for a main that installs its own)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


def run_tool(prog: str, body: Callable[[], int | None]) -> int:
    """Run ``body`` under the contract above; returns the exit code (``body``'s, else 0)."""
    from dsim.outputs import clear_stop, note_stop, raise_if_stopped

    def on_term(sig, frame):
        raise note_stop(Terminated())

    def on_int(sig, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the second press: the unwinding goes on
        raise note_stop(KeyboardInterrupt())

    main = threading.current_thread() is threading.main_thread()
    old = (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) if main else None
    clear_stop()
    if main:
        signal.signal(signal.SIGTERM, on_term)
        signal.signal(signal.SIGINT, on_int)
    try:
        rc = body()
        raise_if_stopped()
        return int(rc or 0)
    except InputError as e:
        print(f"{prog}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"{prog}: terminated", file=sys.stderr)
        return 143
    except OSError as e:
        if e.errno == errno.EPIPE:  # piped into a closed reader: not an error
            return 1
        what = f"{e.filename}: " if e.filename else ""
        print(f"{prog}: error: {what}{e.strerror or e}", file=sys.stderr)
        return 2
    finally:
        if old is not None:
            signal.signal(signal.SIGINT, old[0])
            signal.signal(signal.SIGTERM, old[1])


def exit_tool(prog: str, body: Callable[[], int | None]) -> None:
    """``sys.exit(run_tool(...))`` for a module's ``__main__``; flushes and ends at once after a
    stop (interpreter finalization with compiled kernels loaded was seen to die by the signal)."""
    rc = run_tool(prog, body)
    if rc in (130, 143):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(rc)
    sys.exit(rc)
