"""The workload stage: the ``Workload`` (one row per request, sorted by arrival) and its slicing
(``table``), request traces read and written (``readers``: Azure, Mooncake, BurstGPT, native
CSV / JSONL / Parquet) and synthetic workloads (``synthesis``). The public API is re-exported
here."""

from dsim.workload.readers import (
    FORMATS,
    MAX_LINE_CHARS,
    MAX_SPAN_S,
    MAX_TOKENS,
    detect_format,
    load_workload,
    resolve_trace,
    save_workload,
    trace_names,
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
