"""A progress bar for plan, sweep and ab: simulations done / total on stderr, only on a terminal.

The total is what has been submitted plus what is still to come (``ahead``): a sweep knows its
points up front, the node-count search only an upper bound on the simulations it may still ask
for, which shrinks as verdicts come in. Completions are counted as they happen (the executors'
done callbacks, which may run on other threads), so the bar moves for out-of-order results too.
When the stream is not a terminal nothing is created and nothing is written.
"""

from __future__ import annotations

import sys
import threading
from concurrent.futures import Future
from typing import IO


def is_terminal(stream) -> bool:
    """Whether the bar is drawn on `stream`: only on a terminal."""
    isatty = getattr(stream, "isatty", None)
    return bool(isatty and isatty())


class Progress:
    """`submitted()` / `finished()` count simulations; `ahead(key=n)` declares work to come."""

    def __init__(self, desc: str, *, stream: IO | None = None, enabled: bool | None = None, unit: str = "sim"):
        stream = sys.stderr if stream is None else stream
        if enabled is None:
            enabled = is_terminal(stream)
        self.enabled = enabled
        self.submitted_n = 0
        self.done_n = 0
        self._ahead: dict[str, int] = {}
        self._lock = threading.Lock()
        self.bar = None
        if enabled:
            from tqdm import tqdm

            self.bar = tqdm(
                total=0,
                desc=desc,
                unit=unit,
                file=stream,
                leave=False,
                dynamic_ncols=True,
                bar_format="{desc}: {n_fmt}/{total_fmt} {unit}s |{bar}| {elapsed}<{remaining}{postfix}",
            )

    @property
    def total(self) -> int:
        return self.submitted_n + sum(self._ahead.values())

    def _redraw(self) -> None:
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.n = self.done_n
            self.bar.refresh()

    def ahead(self, **counts: int) -> None:
        """Work not yet submitted, by key (each replaces that key's earlier figure), in one redraw."""
        with self._lock:
            for key, n in counts.items():
                self._ahead[key] = max(0, int(n))
            self._redraw()

    def submitted(self, n: int = 1, claim: str | None = None) -> None:
        """n more submitted; `claim`: they were declared ahead under that key (taken off it)."""
        with self._lock:
            self.submitted_n += n
            if claim in self._ahead:
                self._ahead[claim] = max(0, self._ahead[claim] - n)
            self._redraw()

    def finished(self, n: int = 1) -> None:
        with self._lock:
            self.done_n += n
            self._redraw()

    def track(self, fut: Future, claim: str | None = None) -> Future:
        """Count `fut` as submitted now (claiming one declared under `claim`) and as finished when
        it completes (any thread)."""
        self.submitted(1, claim)
        fut.add_done_callback(lambda _f: self.finished())
        return fut

    def note(self, text: str) -> None:
        """What is being worked on (the plan's methods and node counts)."""
        with self._lock:
            if self.bar is not None:
                self.bar.set_postfix_str(text, refresh=False)
                self._redraw()

    def close(self) -> None:
        with self._lock:
            if self.bar is not None:
                self.bar.close()
                self.bar = None

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
