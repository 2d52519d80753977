"""A replica's growing buffers: tables of rows appended in place (Columns: the step table, the
ITL samples), the waiting queue (WaitQueue) and a row buffer's larger copy (grown)."""

from __future__ import annotations

from array import array

import numpy as np


class Columns:
    """Rows of float64 columns appended in place (the step table, the ITL samples), stored
    column-major in blocks: ``a`` [columns, capacity] is the block being filled (``n`` rows so
    far); a full block is kept as it is and a new one, twice as large, started (nothing is ever
    copied to grow; the result tables read each column as one contiguous run per block). Rows
    appended one at a time wait in a flat ``array('d')`` (extending it by a row's tuple costs a
    fraction of a numpy row write) and are copied in before any reserve or read, so the rows
    keep their order. Not ``keep``: the rows are dropped as they are written (``a`` is scratch,
    re-used from row 0 by every reserve, ``append`` writes nothing), for callers that never read
    them: a full hour's million steps x 12 columns streamed through the cache slow every kernel
    that reads or writes other memory."""

    __slots__ = ("a", "n", "ncol", "keep", "_full", "_pending", "_np", "_last")
    PENDING = 256

    def __init__(self, ncol: int, cap: int = 64, keep: bool = True):
        self.a = np.empty((ncol, cap), dtype=np.float64)
        self.n = 0
        self.ncol = ncol
        self.keep = keep
        self._full: list = []  # the filled blocks, [columns, rows] views
        self._pending = array("d")
        self._np = 0  # rows waiting in _pending
        self._last = None  # the last row appended (a lone pending row is written from it)

    def _grow(self, m: int) -> int:
        if not self.keep:
            if m > self.a.shape[1]:
                self.a = np.empty((self.ncol, max(2 * self.a.shape[1], m)), dtype=np.float64)
            self.n = m
            return 0
        i = self.n
        if i + m > self.a.shape[1]:
            if i:
                self._full.append(self.a[:, :i])
            self.a = np.empty((self.ncol, max(2 * self.a.shape[1], m)), dtype=np.float64)
            i = 0
        self.n = i + m
        return i

    def _flush(self) -> None:
        m = self._np
        if m:
            i = self._grow(m)
            if m == 1:
                self.a[:, i] = self._last
            else:
                self.a[:, i : self.n] = np.frombuffer(self._pending, dtype=np.float64).reshape(m, self.ncol).T
            # (the frombuffer view is gone: the buffer may shrink)
            del self._pending[:]
            self._np = 0

    def reserve(self, m: int) -> int:
        """The index in ``a`` (the current block) of the first of m new rows (columns of ``a``,
        written by the caller; re-read ``a`` after reserving: it may be a new block)."""
        if self._np:
            self._flush()
        return self._grow(m)

    def release(self, end: int) -> None:
        """Of the rows reserved last, keep those before index ``end`` of ``a`` (the caller wrote
        fewer than it reserved)."""
        if self.keep:
            self.n = end

    def append(self, row) -> None:
        if not self.keep:
            return
        self._pending.extend(row)
        self._last = row
        self._np += 1
        if self._np >= self.PENDING:
            self._flush()

    def blocks(self) -> list:
        """The rows so far as column blocks, in order: views [columns, rows] (none when not kept)."""
        if not self.keep:
            return []
        self._flush()
        return [*self._full, self.a[:, : self.n]]


class WaitQueue:
    """A replica's waiting queue (FCFS; a preempted request goes back to its head) as an int64
    buffer ``buf[head:tail]``, which the scheduling kernel consumes from the head in place
    (dsim.engine.compiled_sched.schedule_step returns the new head)."""

    def __init__(self, cap: int = 64):
        self.buf = np.empty(cap, dtype=np.int64)
        self.head = self.tail = cap // 4

    def __len__(self) -> int:
        return self.tail - self.head

    def __bool__(self) -> bool:
        return self.tail > self.head

    def ids(self) -> list:
        return self.buf[self.head : self.tail].tolist()

    def make_room(self, front: int, back: int) -> None:
        """At least front free entries before the head and back after the tail (recentred or
        grown)."""
        if self.head >= front and len(self.buf) - self.tail >= back:
            return
        n = self.tail - self.head
        cap = len(self.buf)
        if n + front + back + 16 > cap // 2:
            cap = 2 * (n + front + back + 16)
        head = front + (cap - n - front - back) // 4
        buf = np.empty(cap, dtype=np.int64) if cap != len(self.buf) else self.buf
        buf[head : head + n] = self.buf[self.head : self.tail].copy()
        self.buf, self.head, self.tail = buf, head, head + n

    def append(self, rid: int) -> None:
        if self.tail == len(self.buf):
            self.make_room(0, 1)
        self.buf[self.tail] = rid
        self.tail += 1

    def extend(self, rids) -> None:
        k = len(rids)
        if self.tail + k > len(self.buf):
            self.make_room(0, k)
        t = self.tail
        if k <= 8:  # (a closed loop's few successors: items, cheaper than an array's slice)
            buf = self.buf
            for r in rids:
                buf[t] = r
                t += 1
            self.tail = t
        else:
            self.buf[t : t + k] = np.arange(rids.start, rids.stop, rids.step) if isinstance(rids, range) else rids
            self.tail = t + k

    def appendleft(self, rid: int) -> None:
        if self.head == 0:
            self.make_room(1, 0)
        self.head -= 1
        self.buf[self.head] = rid


def grown(old: np.ndarray, cap: int, keep: int, alloc) -> np.ndarray:
    """A (cap, columns) buffer from ``alloc`` (np.zeros or np.empty) holding old's first keep rows."""
    new = alloc((cap, old.shape[1]), dtype=old.dtype)
    new[:keep] = old[:keep]
    return new
