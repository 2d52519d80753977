"""The workload stage: the ``Workload`` (one row per request, sorted by arrival) and its slicing
(``table``), request traces read and written (``readers``: the registry of trace formats,
detection and ``load_workload``; ``public_traces``: Azure, Mooncake, BurstGPT; ``native``: dsim's
CSV / JSONL / Parquet; ``trace_checks``: the bounds and row-level errors they share) and synthetic
workloads (``synthesis``). The public API is re-exported here."""

from dsim.workload.public_traces import resolve_trace, trace_names
from dsim.workload.readers import (
    FORMATS,
    detect_format,
    load_workload,
    save_workload,
)
from dsim.workload.synthesis import (
    DEFAULT_SPEC,
    make_default,
    synthesize,
)
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
from dsim.workload.trace_checks import MAX_LINE_CHARS, MAX_SPAN_S, MAX_TOKENS

__all__ = [
    "DEFAULT_CLASSES",
    "DEFAULT_MIX",
    "DEFAULT_SPEC",
    "FORMATS",
    "MAX_LINE_CHARS",
    "MAX_SPAN_S",
    "MAX_TOKENS",
    "MOONCAKE_BLOCK_TOKENS",
    "Workload",
    "assign_classes",
    "detect_format",
    "head",
    "load_workload",
    "make_default",
    "parse_mix",
    "resolve_trace",
    "save_workload",
    "scale_rate",
    "synthesize",
    "time_window",
    "trace_names",
]
