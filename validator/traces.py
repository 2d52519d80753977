"""The request list a replay sends: (arrival_s, prompt_tokens, output_tokens) per request.

Read from a trace through dsim.workload.load_workload when it is available, else from a small
native format (CSV or JSONL with columns prompt_tokens/input_tokens, output_tokens and optional
arrival_s/timestamp), or made up from fixed lengths.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dsim.errors import InputError

if TYPE_CHECKING:
    from dsim.workload import Workload


@dataclass
class Plan:
    arrival_s: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    source: str

    def __len__(self):
        return len(self.prompt_tokens)

    def head(self, n: int | None) -> Plan:
        if n is None or n >= len(self):
            return self
        return Plan(self.arrival_s[:n], self.prompt_tokens[:n], self.output_tokens[:n], self.source)


def fixed(n: int, input_len: int, output_len: int) -> Plan:
    if n <= 0 or input_len <= 0 or output_len <= 0:
        raise InputError("--requests, --input-len and --output-len must be > 0")
    return Plan(
        np.zeros(n),
        np.full(n, input_len, dtype=np.int64),
        np.full(n, output_len, dtype=np.int64),
        f"fixed:n={n},in={input_len},out={output_len}",
    )


def _native(path: Path) -> Plan:
    from dsim.schema import check_input_file, read_json_lines
    from dsim.workload.trace_checks import MAX_TRACE_ROWS

    check_input_file(path, max_bytes=4 << 30)  # no device, FIFO or file past the bound
    rows: list = []
    if path.suffix == ".jsonl":
        rows = [r for _, r in read_json_lines(path, max_bytes=4 << 30, max_lines=MAX_TRACE_ROWS)]
    elif path.suffix == ".csv":
        with open(path, newline="", encoding="utf-8", errors="replace") as f:
            try:
                for r in csv.DictReader(f):
                    if len(rows) >= MAX_TRACE_ROWS:
                        raise InputError(f"{path}: more than {MAX_TRACE_ROWS} requests (refused)")
                    rows.append(r)
            except csv.Error as e:  # e.g. a field past csv's size limit (128 KiB)
                raise InputError(f"{path}:{len(rows) + 2}: not a CSV row ({e})") from None
    else:
        raise InputError(f"{path}: unknown trace format (csv or jsonl, or install dsim.workload)")
    from dsim.errors import plain
    from dsim.workload import MAX_SPAN_S, MAX_TOKENS

    arr, pin, pout = [], [], []
    for i, r in enumerate(rows, 1):
        line = i if path.suffix == ".jsonl" else i + 1
        if not isinstance(r, dict):
            raise InputError(f"{path}:{line}: expected an object with prompt_tokens and output_tokens")

        def field(*names: str, r: dict = r) -> tuple[str, Any]:
            for k in names:
                if r.get(k) not in (None, ""):
                    return k, r[k]
            return names[0], None

        vals = []
        for names, lo, hi in (
            (("prompt_tokens", "input_tokens", "ContextTokens"), 1, MAX_TOKENS),
            (("output_tokens", "GeneratedTokens"), 1, MAX_TOKENS),
            (("arrival_s", "timestamp"), 0, MAX_SPAN_S),
        ):
            key, v = field(*names)
            if v is None and key == "arrival_s":
                v = 0.0
            try:
                x = float(v) if not isinstance(v, bool) else float("nan")
            except (TypeError, ValueError):
                raise InputError(f"{path}:{line}: {key}: not a number: {plain(v)}") from None
            if not (np.isfinite(x) and lo <= x <= hi) or (key != "arrival_s" and x != int(x)):
                raise InputError(
                    f"{path}:{line}: {key}: must be {'an integer ' if key != 'arrival_s' else ''}"
                    f"in [{lo}, {hi:g}], got {plain(v)}"
                )
            vals.append(x)
        pin.append(int(vals[0]))
        pout.append(int(vals[1]))
        arr.append(vals[2])
    if not rows:
        raise InputError(f"{path}: no requests")
    a = np.asarray(arr, dtype=np.float64)
    order = np.argsort(a, kind="stable")
    a = a[order] - a[order][0]
    return Plan(a, np.asarray(pin, dtype=np.int64)[order], np.asarray(pout, dtype=np.int64)[order], str(path))


def load(trace: str | None, n: int | None, input_len: int | None, output_len: int | None) -> Plan:
    if trace is None:
        return fixed(n or 32, input_len or 64, output_len or 64)
    try:
        from dsim.workload import load_workload  # the project's reader, when it exists
    except ImportError:
        load_workload = None
    if load_workload is not None:
        try:
            w = load_workload(trace)
            plan = Plan(
                np.asarray(w.arrival_s, dtype=np.float64),
                np.asarray(w.prompt_tokens),
                np.asarray(w.output_tokens),
                getattr(w, "source", str(trace)),
            )
            return plan.head(n)
        except InputError:
            if not Path(trace).exists():
                raise
    p = Path(trace)
    if not p.exists():
        raise InputError(f"{trace}: trace not found")
    return _native(p).head(n)


def to_workload(
    plan_or_requests: Plan, concurrency: int | None = None, run_starts: tuple[int, ...] = ()
) -> Workload | Plan:
    """A dsim Workload for the simulator (when dsim.workload exists), else the Plan itself.
    ``run_starts``: a closed loop measured as several runs (Workload.closed_loop_run_starts)."""
    plan = plan_or_requests
    try:
        from dsim.workload import Workload
    except ImportError:
        return plan
    n = len(plan)
    kwargs = dict(
        arrival_s=np.asarray(plan.arrival_s, dtype=np.float64),
        prompt_tokens=np.asarray(plan.prompt_tokens, dtype=np.int64),
        output_tokens=np.asarray(plan.output_tokens, dtype=np.int64),
        cls=np.zeros(n, dtype=np.int16),
        class_names=("default",),
        session_id=np.full(n, -1, dtype=np.int64),
        prefix_hashes=None,
        prefix_block_tokens=16,
        closed_loop_concurrency=concurrency,
        closed_loop_run_starts=run_starts,
        source=plan.source,
        class_mix_assumed=False,
    )
    import dataclasses

    names = {f.name for f in dataclasses.fields(Workload)}
    return Workload(**{k: v for k, v in kwargs.items() if k in names})
