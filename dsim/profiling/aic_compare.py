"""Kernel tables compared (b)/(a), op by op and shape by shape, and the compact error record a profile built
from (b) carries; a record's shape key (record_key). Needs no AIC."""

from __future__ import annotations

import datetime as _dt
import statistics
from dataclasses import dataclass

import numpy as np

from dsim.errors import InputError
from dsim.profiling.models import infer_model

# fields that identify a record's shape (everything else is the price or its annotations)
KEY_FIELDS = {
    "gemm": ("dtype", "m", "n", "k", "groups"),
    "moe": ("dtype", "tokens", "hidden", "inter", "topk", "experts", "ep", "distribution"),
    "attn": ("kind", "phase", "batch", "q", "kv", "heads", "model"),
    "mhc": ("tokens", "hidden", "hc_mult"),
    "comm": ("kind", "gpus", "bytes", "scope", "hidden", "topk", "experts"),
    "elementwise": ("bytes",),
    "layer": ("model", "topology", "tokens", "batch", "q", "kv"),
}
KEY_DEFAULTS = {"distribution": "uniform", "scope": "intra_node", "groups": 1}


# ---- record keys and the comparison (no AIC needed) ----------------------------------------------------------


def record_key(r: dict) -> tuple:
    op = str(r.get("op"))
    fields = KEY_FIELDS.get(op, tuple(sorted(k for k in r if k != "ms")))
    return (op,) + tuple((f, r.get(f, KEY_DEFAULTS.get(f))) for f in fields)


def _kind_label(r: dict) -> str:
    op = r["op"]
    if op in ("attn", "comm"):
        return f"{op}:{r.get('kind')}:{r.get('phase', '')}".rstrip(":")
    if op in ("gemm", "moe"):
        return f"{op}:{r.get('dtype')}"
    return op


@dataclass(frozen=True)
class ComparedShape:
    kind: str
    key: tuple
    a_ms: float
    b_ms: float

    @property
    def ratio(self) -> float:
        return self.b_ms / self.a_ms


@dataclass(frozen=True)
class KindSummary:
    kind: str
    shapes: int
    median_abs_error: float
    p90_abs_error: float
    median_ratio: float


@dataclass(frozen=True)
class Comparison:
    b_name: str
    a_name: str
    shapes: list[ComparedShape]
    kinds: list[KindSummary]
    not_comparable: list[tuple[str, tuple, str]]  # (kind, key, why)
    only_in_a: int
    only_in_b: int

    @property
    def median_abs_error(self) -> float:
        errs = [abs(s.ratio - 1) for s in self.shapes]
        return statistics.median(errs) if errs else float("nan")


def _strip_model(key: tuple) -> tuple:
    return tuple(x for x in key if not (isinstance(x, tuple) and x[0] == "model"))


def compare_tables(b: dict, a: dict) -> Comparison:
    """Table (b) against table (a), shape by shape: ratio b/a and per-kind |b/a - 1|.

    A shape is comparable when both tables price the same record key and cost the same work: an attention
    record whose "includes" differ between the tables (AIC's attention modules include the projections) is
    is compared against (a)'s attention core plus (a)'s own records of the included parts (the composer's
    projection GEMMs of one such layer at batch x q tokens; kind "+proj") when (a) has them all, else listed
    as not comparable."""
    a_by = {}
    for r in _records(a, "a"):
        a_by[record_key(r)] = r
        a_by.setdefault(_strip_model(record_key(r)), r)  # a measured table may not name the model
    hardware = "b300" if "B300" in str((a.get("provenance") or {}).get("hardware", "")) else "h200"
    shapes, skipped, matched_a = [], [], set()
    only_b = 0
    for r in _records(b, "b"):
        key = record_key(r)
        ra = a_by.get(key) or a_by.get(_strip_model(key))
        if ra is None:
            only_b += 1
            continue
        matched_a.add(id(ra))
        kind = _kind_label(r)
        a_ms = float(ra["ms"])
        if r["op"] == "attn" and sorted(r.get("includes") or []) != sorted(ra.get("includes") or []):
            added = _projections_from(r, a_by, hardware) if not ra.get("includes") else None
            if added is None:
                why = (
                    f"includes differ: b {r.get('includes')} vs a {ra.get('includes')}, "
                    "and (a) lacks the projection GEMMs to add"
                )
                skipped.append((kind, key, why))
                continue
            a_ms += added
            kind += "+proj"
        if not (a_ms > 0 and r["ms"] > 0):
            skipped.append((kind, key, "non-positive ms"))
            continue
        shapes.append(ComparedShape(kind, key, a_ms, float(r["ms"])))
    kinds = []
    for kind in sorted({s.kind for s in shapes}):
        sel = [s for s in shapes if s.kind == kind]
        errs = sorted(abs(s.ratio - 1) for s in sel)
        kinds.append(
            KindSummary(
                kind,
                len(sel),
                statistics.median(errs),
                float(np.quantile(errs, 0.9)),
                statistics.median(s.ratio for s in sel),
            )
        )
    only_a = len({id(r) for r in a_by.values()} - matched_a)
    return Comparison(str(b.get("name", "b")), str(a.get("name", "a")), shapes, kinds, skipped, only_a, only_b)


def projection_records(rb: dict, hardware: str = "h200") -> list[tuple[dict, float]] | None:
    """The composer's GEMM records (with their counts) of the parts that attention record rb includes, for one
    layer of its kind: dsim.profiling.kernel_ops.layer_ops over that single layer. None when the model is not known."""
    from dsim.profiling.kernel_ops import layer_ops
    from dsim.profiling.models import load_model
    from dsim.profiling.topology import parse_topology

    name = rb.get("model") or infer_model(str(rb.get("kind")), int(rb.get("heads", 0)))
    if name is None:
        return None
    try:
        model = load_model(name)
    except InputError:
        return None
    heads = int(rb["heads"])
    if heads <= 0 or model.heads % heads or rb["kind"] not in model.attn_kinds:
        return None
    tp = model.heads // heads
    topo = parse_topology(f"tp{tp}-ep8" if tp > 1 else "dp8-ep8")
    layer = model.attn_kinds.index(rb["kind"])
    b, q = int(rb["batch"]), int(rb["q"])
    ops = layer_ops(
        model, topo, hardware, b * q, phase=rb.get("phase", "decode"), batch=b, q=q, kv=int(rb["kv"]), layers=[layer]
    )
    parts = set(rb.get("includes") or ())
    return [(op.rec, op.count) for op in ops if op.part in parts and op.rec["op"] == "gemm"]


def _projections_from(rb: dict, a_by: dict, hardware: str) -> float | None:
    """(a)'s cost of the projection GEMMs that (b)'s attention record includes, or None if (a) lacks one."""
    recs = projection_records(rb, hardware)
    if not recs:
        return None
    total = 0.0
    for rec, count in recs:
        ra = a_by.get(record_key(rec))
        if ra is None:
            return None
        total += count * float(ra["ms"])
    return total


def _records(table: dict, which: str) -> list[dict]:
    recs = table.get("records") if isinstance(table, dict) else None
    if not isinstance(recs, list):
        raise InputError(f'table {which}: no "records" list')
    for i, r in enumerate(recs):
        if not isinstance(r, dict) or "op" not in r or not isinstance(r.get("ms"), (int, float)):
            raise InputError(f'table {which}: records[{i}]: needs "op" and a numeric "ms"')
    return recs


def format_comparison(c: Comparison, shapes: bool = True) -> str:
    head = (
        f"(b) {c.b_name} against (a) {c.a_name}: {len(c.shapes)} shapes compared, "
        f"{len(c.not_comparable)} not comparable, {c.only_in_b} only in (b), {c.only_in_a} only in (a)"
    )
    lines = [head]
    if shapes:
        lines.append(f"{'kind':<26} {'shape':<64} {'a_ms':>10} {'b_ms':>10} {'b/a':>7}")
        for s in sorted(c.shapes, key=lambda s: (s.kind, str(s.key))):
            shape = " ".join(f"{k}={v}" for k, v in s.key[1:] if v is not None and k not in ("dtype", "kind"))
            lines.append(f"{s.kind:<26} {shape[:64]:<64} {s.a_ms:>10.4f} {s.b_ms:>10.4f} {s.ratio:>7.3f}")
    lines.append(f"{'kind':<26} {'shapes':>6} {'median|err|':>12} {'p90|err|':>10} {'median b/a':>11}")
    for k in c.kinds:
        lines.append(
            f"{k.kind:<26} {k.shapes:>6} {k.median_abs_error:>11.1%} {k.p90_abs_error:>9.1%} {k.median_ratio:>11.3f}"
        )
    lines.append(f"{'all':<26} {len(c.shapes):>6} {c.median_abs_error:>11.1%}   (target: median <= 10%)")
    groups: dict[tuple[str, str], int] = {}
    for kind, _key, why in c.not_comparable:
        groups[(kind, why)] = groups.get((kind, why), 0) + 1
    for (kind, why), n in sorted(groups.items()):
        lines.append(f"not comparable: {kind}: {n} shapes: {why}")
    return "\n".join(lines)


def comparison_json(c: Comparison) -> dict:
    return {
        "b": c.b_name,
        "a": c.a_name,
        "median_abs_error": c.median_abs_error,
        "kinds": [k.__dict__ for k in c.kinds],
        "shapes": [
            {
                "label": s.kind,
                "op": s.key[0],
                **{f: v for f, v in s.key[1:] if v is not None},
                "a_ms": s.a_ms,
                "b_ms": s.b_ms,
                "ratio": s.ratio,
            }
            for s in c.shapes
        ],
        "not_comparable": [
            {"label": k, "op": key[0], **{f: v for f, v in key[1:] if v is not None}, "why": w}
            for k, key, w in c.not_comparable
        ],
        "only_in_a": c.only_in_a,
        "only_in_b": c.only_in_b,
    }


def comparison_summary(c: Comparison, command: str = "", a_provenance: dict | None = None) -> dict:
    """The compact error record a profile built from (b) carries in provenance (compose --table-error)."""
    ap = a_provenance or {}
    return {
        "against": c.a_name,
        "table": c.b_name,
        "date": _dt.date.today().isoformat(),
        "command": command,
        "against_provenance": {
            k: ap[k] for k in ("kind", "hardware", "engine", "engine_version", "date", "command") if k in ap
        },
        "error": "median |b/a - 1| over the shapes both tables price; attention modules of (b) against (a)'s "
        "attention core plus (a)'s projection GEMMs",
        "shapes": len(c.shapes),
        "median_abs_error": round(c.median_abs_error, 4),
        "median_ratio_b_over_a": round(statistics.median(s.ratio for s in c.shapes), 4) if c.shapes else None,
        "by_kind": {
            k.kind: {
                "shapes": k.shapes,
                "median_abs_error": round(k.median_abs_error, 4),
                "p90_abs_error": round(k.p90_abs_error, 4),
                "median_ratio": round(k.median_ratio, 4),
            }
            for k in c.kinds
        },
        "not_comparable": len(c.not_comparable),
    }
