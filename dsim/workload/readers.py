"""Trace files read into a :class:`~dsim.workload.table.Workload` (``load_workload``, by path or
public trace name) and written from one (``save_workload``), through the registry of trace
formats: one ``TraceFormat`` per format, registered with ``register_format``; ``FORMATS`` (the
``--format`` choices besides ``auto``) and ``detect_format`` are generated from it.

Formats (their readers: dsim.workload.public_traces, dsim.workload.native):

* ``azure``      Azure LLM inference trace CSV, 2023 and 2024;
* ``mooncake``   Mooncake JSONL;
* ``burstgpt``   BurstGPT CSV (failed requests dropped, counted in ``source``);
* ``native-csv``, ``native-jsonl``, ``native-parquet``: dsim's own format (traces/README.md).

The interface, for every format: ``reader(path) -> Cols`` (dsim.workload.trace_checks.Cols)
pre: ``path`` a regular, readable file within MAX_TRACE_BYTES (``load_workload`` checks);
post: ``arrival`` float64 seconds in file order (not shifted), ``prompt`` and ``output`` int64 in
1..MAX_TOKENS, ``lines`` each row's line (or a callable giving them), and the optional columns the
format ``yields``; bad input raises :class:`dsim.errors.InputError` with ``path:line: field:
problem``, lines 1-based as an editor shows them (CSV header = line 1).
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsim.errors import InputError, shown
from dsim.workload import native, public_traces
from dsim.workload.public_traces import resolve_trace
from dsim.workload.table import (
    DEFAULT_CLASSES,
    DEFAULT_MIX,
    MOONCAKE_BLOCK_TOKENS,
    Workload,
    assign_classes,
    head,
    parse_mix,
    scale_rate,
    time_window,
)
from dsim.workload.trace_checks import (
    MAX_SPAN_S,
    MAX_TRACE_BYTES,
    Cols,
    RowLocator,
    check_monotone,
    check_text,
    first_line,
    trace_error,
)

__all__ = [
    "FORMATS",
    "FORMAT_KINDS",
    "TraceFormat",
    "detect_format",
    "load_workload",
    "register_format",
    "save_workload",
]

# How detection reads a container, and how a bad row is located in it (RowLocator's kinds).
CONTAINERS = {"csv": "csv", "json": "lines", "parquet": "parquet"}
_PARQUET_EXTENSIONS = (".parquet", ".pq")  # a file named so is read as Parquet without a look
_JSON_EXTENSIONS = (".jsonl", ".json", ".ndjson")  # a file named so is read as JSON records


@dataclass(frozen=True)
class TraceFormat:
    """What a trace format is, declared once where it is registered (``register_format``):

    * ``name``: its ``--format`` name; ``aliases``: other spellings;
    * ``container``: ``csv`` (detected by its header's column names), ``json`` (one JSON object a
      line, detected by the first record's keys) or ``parquet`` (detected by extension or the
      ``PAR1`` magic); a bad row is reported by line (csv, json) or row number (parquet);
    * ``detect(header)``: whether a file is this format, given the header's column names (csv)
      or the first record (json); formats of one container are asked in registration order;
      ``signature``: what it looks for, as an unknown file's error names it;
    * ``reader(path) -> Cols``: the module docstring's interface; ``reads``: the file's fields
      it needs; ``yields``: the Workload columns beyond arrival and token counts it can fill
      (``session_id``, ``prefix_hashes``, ``class``) when the file has them;
    * ``extensions``: a native format's file extensions (``--format native`` and
      ``save_workload`` pick it by them); ``writer(workload, path, time_decimals)``: how
      ``save_workload`` writes it (native formats only);
    * ``default_mix(path, name)``: the class mix of a trace that carries no classes (else
      DEFAULT_MIX)."""

    name: str
    container: str
    detect: Callable[[Any], bool]
    signature: str
    reader: Callable[[Path], Cols]
    reads: tuple[str, ...]
    yields: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    extensions: tuple[str, ...] = ()
    writer: Callable[[Workload, Path, int], None] | None = None
    default_mix: Callable[[Path, str | None], dict[str, float]] | None = None

    @property
    def rows(self) -> str:
        """How a bad row is located (a RowLocator kind)."""
        return CONTAINERS[self.container]


FORMAT_KINDS: dict[str, TraceFormat] = {}  # name -> format, in registration order
_ALIASES: dict[str, str] = {}  # other spellings -> name


def register_format(kind: TraceFormat) -> TraceFormat:
    """Register a trace format under its name and aliases."""
    if kind.container not in CONTAINERS:
        raise ValueError(f"format {kind.name!r}: container must be one of {', '.join(CONTAINERS)}")
    for spelling in (kind.name, *kind.aliases):
        if spelling in FORMAT_KINDS or spelling in _ALIASES or spelling in ("auto", "native"):
            raise ValueError(f"format spelling {spelling!r} registered twice")
    FORMAT_KINDS[kind.name] = kind
    _ALIASES.update({a: kind.name for a in kind.aliases})
    return kind


register_format(
    TraceFormat(
        "azure",
        "csv",
        lambda cols: "ContextTokens" in cols or "GeneratedTokens" in cols or "TIMESTAMP" in cols,
        "TIMESTAMP/ContextTokens/GeneratedTokens (Azure)",
        public_traces.read_azure,
        reads=("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
        aliases=("azure2023", "azure2024"),
        default_mix=public_traces.azure_default_mix,
    )
)
register_format(
    TraceFormat(
        "mooncake",
        "json",
        # a record with arrival_s is native, whatever else it has
        lambda rec: (
            "arrival_s" not in rec and ("input_length" in rec or ("timestamp" in rec and "output_length" in rec))
        ),
        "input_length/output_length (Mooncake)",
        public_traces.read_mooncake,
        reads=("timestamp", "input_length", "output_length"),
        yields=("prefix_hashes",),
    )
)
register_format(
    TraceFormat(
        "burstgpt",
        "csv",
        lambda cols: "Request tokens" in cols or "Response tokens" in cols,
        "Request tokens/Response tokens (BurstGPT)",
        public_traces.read_burstgpt,
        reads=("Timestamp", "Request tokens", "Response tokens"),
        yields=("session_id",),
        aliases=("bursty",),
    )
)
_NATIVE_YIELDS = ("session_id", "prefix_hashes", "class")
_NATIVE_READS = ("arrival_s", "prompt_tokens", "output_tokens")
register_format(
    TraceFormat(
        "native-csv",
        "csv",
        lambda cols: "arrival_s" in cols or "prompt_tokens" in cols,
        "arrival_s/prompt_tokens (native)",
        native.read_native_csv,
        reads=_NATIVE_READS,
        yields=_NATIVE_YIELDS,
        aliases=("csv",),
        extensions=(".csv",),
        writer=native.write_native_csv,
    )
)
register_format(
    TraceFormat(
        "native-jsonl",
        "json",
        lambda rec: "arrival_s" in rec,
        "arrival_s (native)",
        native.read_native_jsonl,
        reads=_NATIVE_READS,
        yields=_NATIVE_YIELDS,
        aliases=("jsonl",),
        extensions=(".jsonl", ".json"),
        writer=native.write_native_jsonl,
    )
)
register_format(
    TraceFormat(
        "native-parquet",
        "parquet",
        lambda _footer: True,
        "a Parquet file (native)",
        native.read_native_parquet,
        reads=_NATIVE_READS,
        yields=_NATIVE_YIELDS,
        aliases=("parquet",),
        extensions=_PARQUET_EXTENSIONS,
        writer=native.write_native_parquet,
    )
)
FORMATS = tuple(FORMAT_KINDS)  # the --format choices besides auto, in registration order


# --------------------------------------------------------------------------------------------
# Format detection
# --------------------------------------------------------------------------------------------


def _first_match(container: str, header: Any) -> str | None:
    return next((k.name for k in FORMAT_KINDS.values() if k.container == container and k.detect(header)), None)


def _signatures(container: str) -> str:
    return " nor ".join(k.signature for k in FORMAT_KINDS.values() if k.container == container)


def detect_format(path: str | Path) -> str:
    """Detect the trace format from the extension and the header / first record: a Parquet file
    by extension or magic, JSON records by extension or a leading ``{``, else a CSV header; then
    the registered formats of that container in registration order."""
    path = Path(path)
    ext = "".join(path.suffixes[-1:]).lower()
    parquet = _first_match("parquet", None)
    if ext in _PARQUET_EXTENSIONS and parquet:
        return parquet
    try:
        with open(path, "rb") as f:
            head_bytes = f.read(4096)
    except OSError as e:
        raise trace_error(path, None, None, f"cannot read ({e.strerror})") from None
    if head_bytes[:4] == b"PAR1" and parquet:
        return parquet
    check_text(path, head_bytes)
    first = first_line(path)
    if ext in _JSON_EXTENSIONS or first.startswith("{"):
        try:
            rec = json.loads(first)
        except json.JSONDecodeError:
            raise trace_error(path, 1, None, "unknown format: first line is not a JSON object") from None
        found = _first_match("json", rec) if isinstance(rec, dict) else None
        if found:
            return found
        raise trace_error(path, 1, None, f"unknown format: JSON record with neither {_signatures('json')}")
    cols = [c.strip().strip('"') for c in next(csv.reader([first]))]
    found = _first_match("csv", cols)
    if found:
        return found
    raise trace_error(
        path,
        1,
        None,
        f"unknown format: header {shown(first, 80)} matches no known trace (formats: {', '.join(FORMATS)})",
    )


def _native_by_extension(path: Path) -> str | None:
    ext = path.suffix.lower()
    return next((k.name for k in FORMAT_KINDS.values() if k.writer is not None and ext in k.extensions), None)


def resolve_format(fmt: str, path: Path) -> str:
    """A format name from a ``--format`` value for ``path``: ``auto`` detects it, ``native``
    picks the native format by extension, an alias its format; InputError for anything else."""
    f = str(fmt).lower().strip()
    if f == "auto":
        return detect_format(path)
    if f == "native":
        found = _native_by_extension(path)
        if not found:
            exts = "/".join(k.extensions[0] for k in FORMAT_KINDS.values() if k.writer is not None)
            raise trace_error(
                path, None, None, f"unknown format: native file needs {exts}, got {path.suffix.lower()!r}"
            )
        return found
    f = _ALIASES.get(f, f)
    if f not in FORMAT_KINDS:
        raise trace_error(path, None, None, f"unknown format {fmt!r} (use auto, {', '.join(FORMATS)})")
    return f


# --------------------------------------------------------------------------------------------
# load / save
# --------------------------------------------------------------------------------------------


def load_workload(
    path_or_name: str | Path,
    fmt: str = "auto",
    *,
    mix: Any = None,
    seed: int = 0,
    sort: bool = False,
    prefix_block_tokens: int | None = None,
    n: int | None = None,
    window: tuple[float, float] | None = None,
    rate_scale: float | None = None,
) -> Workload:
    """Load a trace by path or name ("default", "azure-conv", "azure-code",
    "mooncake-conversation", "mooncake-synthetic", ...).

    fmt: "auto" (extension + header/first record) or one of FORMATS ("native" picks by extension).
    mix: class mix (dict or "math=0.3,..." string) to assign instead of the trace's classes / the
         per-trace default; seed: its seed. sort: sort by arrival instead of rejecting a trace
         whose timestamps go back. Then, in this order: window=(t0, t1) s, n = first N requests,
         rate_scale = arrival rate multiplier.
    """
    path, name = resolve_trace(path_or_name)
    if path.is_dir():
        raise trace_error(path, None, None, "is a directory, not a trace file")
    if not os.access(path, os.R_OK):
        raise trace_error(path, None, None, "cannot read (permission denied)")
    from dsim.schema import check_input_file

    check_input_file(path, max_bytes=MAX_TRACE_BYTES)  # no device, FIFO or file past the bound
    f = resolve_format(fmt, path)
    kind = FORMAT_KINDS[f]
    c = kind.reader(path)
    t = c["arrival"]
    order = None
    if sort:
        if len(t) > 1 and np.any(np.diff(t) < 0):
            order = np.argsort(t, kind="stable")
    else:
        check_monotone(t, path, c.get("tfield", "arrival_s"), c["lines"], c.get("raw_t"))
    nreq = len(t)
    sel = order if order is not None else slice(None)
    t = t[sel]
    t0 = float(t[0])
    arrival = (t - t0).astype(np.float64)
    if arrival[-1] > MAX_SPAN_S:
        i = int(np.argmax(arrival > MAX_SPAN_S))
        j = int(order[i]) if order is not None else i
        ln = c["lines"]() if callable(c["lines"]) else c["lines"]
        raise trace_error(
            path,
            ln[j],
            c.get("tfield", "arrival_s"),
            f"arrives {arrival[i]:.3g} s after the first request (more than {MAX_SPAN_S:g} s: not a trace's time)",
        )
    session = c.get("session")
    session = np.full(nreq, -1, np.int64) if session is None else np.asarray(session, np.int64)[sel]
    hashes = c.get("hashes")
    if hashes is not None and order is not None:
        hashes = [hashes[i] for i in order]
    pbt = prefix_block_tokens or MOONCAKE_BLOCK_TOKENS

    label = f"{name}: {path}" if name else str(path)
    notes = [f"fmt={f}", f"{nreq} requests"] + list(c.get("notes", []))
    if order is not None:
        notes.append("sorted by arrival")
    cls_raw = c.get("cls_names")
    if cls_raw is not None and mix is None:
        cls_raw = cls_raw[sel]
        uniq = set(cls_raw.tolist())
        names = tuple([k for k in DEFAULT_CLASSES if k in uniq] + sorted(uniq - set(DEFAULT_CLASSES)))
        lut = {k: i for i, k in enumerate(names)}
        cls = np.array([lut[x] for x in cls_raw], dtype=np.int16)
        assumed = name == "default"  # the default's classes were drawn from a mix by dsim
        if assumed:
            notes.append("classes carried per request, drawn by dsim from a mix (an assumption)")
        else:
            notes.append("classes from the trace")
    else:
        names = ("chat",)
        cls = np.zeros(nreq, np.int16)
        assumed = True
    data_rows = c.get("data_rows")
    rows = (np.arange(nreq, dtype=np.int64) if data_rows is None else np.asarray(data_rows, np.int64))[sel]
    locator = RowLocator(path, kind.rows, c["lines"] if kind.rows == "lines" else None)
    w = Workload(
        arrival_s=arrival,
        prompt_tokens=c["prompt"][sel],
        output_tokens=c["output"][sel],
        cls=cls,
        class_names=names,
        session_id=session,
        prefix_hashes=hashes,
        prefix_block_tokens=pbt,
        closed_loop_concurrency=None,
        source=f"{label} ({', '.join(notes)})",
        class_mix_assumed=assumed,
        rows=rows,
        locator=locator,
        trace_name=name or path.name,
    )
    if cls_raw is None or mix is not None:
        m = (
            parse_mix(mix)
            if mix is not None
            else (kind.default_mix(path, name) if kind.default_mix else dict(DEFAULT_MIX))
        )
        w = assign_classes(w, m, seed)
        if mix is None:
            w = dataclasses.replace(
                w, source=w.source.replace("classes assumed: mix", "classes assumed (per-trace default): mix")
            )
    if window is not None:
        w = time_window(w, *window)
    if n is not None:
        w = head(w, n)
    if rate_scale is not None:
        w = scale_rate(w, rate_scale)
    return w


def save_workload(w: Workload, path: str | Path, fmt: str = "auto", *, time_decimals: int = 6) -> Path:
    """Write a workload in dsim's native format (CSV, JSONL or Parquet, by extension or fmt).

    Arrival times are rounded to ``time_decimals`` (microseconds by default); classes are
    written by name; session_id only when known (>= 0); prefix_hashes only when present
    (CSV: space-separated integers). Closed-loop concurrency and class_mix_assumed are not
    stored (they are run options).
    """
    path = Path(path)
    f = str(fmt).lower()
    if f in ("auto", "native"):
        f = _native_by_extension(path) or ""
    kind = FORMAT_KINDS.get(_ALIASES.get(f, f))
    if kind is None or kind.writer is None:
        raise InputError(f"{path}: cannot write format {fmt!r} (use .csv, .jsonl or .parquet)")
    kind.writer(w, path, time_decimals)
    return path
