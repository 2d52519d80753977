"""AIC kernel tables built: the op records of a model and topology (the composer's, or the fallback grid),
priced into a kernel table file's content with provenance (kernel_table), for every shipped case (build_table)
or one hardware x backend x model x topology (case_table)."""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import Any

from dsim.errors import InputError
from dsim.profiling.aic_compare import record_key
from dsim.profiling.aic_guard import table_guard
from dsim.profiling.aic_pricing import AicTables, price_records
from dsim.profiling.aic_source import (
    A2A_BYTES_PER_ELEMENT,
    AIC_PACKAGE,
    AIC_VERSION,
    BACKENDS,
    DATASHEET,
    FALLBACK_BACKEND,
    SYSTEM_OF,
    SYSTEMS,
    TOPOLOGIES,
    default_version,
    model_config,
)

# the fallback grid (KERNEL_OPS.md) until the composer lists its records
GRID_TOKENS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 4096, 8192, 16384)
GRID_BATCH = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
GRID_Q_DECODE = (1, 2, 4, 6, 8)
GRID_Q_PREFILL = (256, 1024, 2048, 8192)
GRID_BATCH_PREFILL = (1, 2, 4)
GRID_KV = (512, 2048, 8192, 32768, 131072)


def composer_records(model: str, topology: str, system: str, expert_dtype: str | None = None) -> list[dict]:
    """The records the composer looks up for a model, topology and system (dsim.profiling.compose required-ops)."""
    import dataclasses

    from dsim.profiling.compose import required_ops
    from dsim.profiling.models import load_model
    from dsim.profiling.topology import parse_topology

    m = load_model(model)
    if expert_dtype:
        m = dataclasses.replace(m, expert_dtype=expert_dtype)
    # without the capture limit + 1 point and the fixed-length DSpark drafter records (dspark@K): the pinned
    # tables were built before them, and the composer prices them by AIC's and its own interpolation
    return required_ops(m, parse_topology(topology), DATASHEET[system], new_points=False)


def grid_records(model: str, topology: str, system: str, required: list[dict] | None = None) -> list[dict]:
    """Op records on the fixed grid (KERNEL_OPS.md's fallback grid) over the shapes the composer needs for one
    model and topology: every GEMM (n, k) at the grid's m (fp8 shapes also in bf16), the routed experts in
    fp8 and bf16 (and the composer's dtype) at the grid's tokens, each attention kind at the grid's batch x q
    x kv, mHC, and the topology's collectives at the grid's tokens. For comparisons and for interpolation
    beyond the composer's own points."""
    if topology not in TOPOLOGIES:
        raise InputError(f"--topology: {topology!r} is not one of {', '.join(TOPOLOGIES)}")
    req = required if required is not None else composer_records(model, topology, system)
    recs: list[dict] = []
    gemms = sorted({(r["dtype"], r["n"], r["k"], r.get("groups", 1)) for r in req if r["op"] == "gemm"})
    gemms = sorted(set(gemms) | {("bf16", n, k, g) for d, n, k, g in gemms if d == "fp8"})
    recs += [
        {"op": "gemm", "dtype": d, "m": m, "n": n, "k": k, **({"groups": g} if g > 1 else {})}
        for d, n, k, g in gemms
        for m in GRID_TOKENS
    ]
    for shape in sorted(
        {tuple((k, r[k]) for k in ("hidden", "inter", "topk", "experts", "ep")) for r in req if r["op"] == "moe"}
    ):
        dtypes = sorted({"fp8", "bf16"} | {r["dtype"] for r in req if r["op"] == "moe"})
        recs += [{"op": "moe", "dtype": d, "tokens": t, **dict(shape)} for d in dtypes for t in GRID_TOKENS]
    for kind, heads in sorted({(r["kind"], r["heads"]) for r in req if r["op"] == "attn"}):
        recs += [
            {"op": "attn", "kind": kind, "phase": "decode", "batch": bb, "q": q, "kv": kv, "heads": heads}
            for bb in GRID_BATCH
            for q in GRID_Q_DECODE
            for kv in GRID_KV
        ]
        recs += [
            {"op": "attn", "kind": kind, "phase": "prefill", "batch": bb, "q": q, "kv": kv, "heads": heads}
            for bb in GRID_BATCH_PREFILL
            for q in GRID_Q_PREFILL
            for kv in (0,) + GRID_KV
        ]
    for h, hc in sorted({(r["hidden"], r["hc_mult"]) for r in req if r["op"] == "mhc"}):
        recs += [{"op": "mhc", "tokens": t, "hidden": h, "hc_mult": hc} for t in GRID_TOKENS]
    hidden = next((r["hidden"] for r in req if r["op"] == "moe"), None)
    for kind, gpus in sorted({(r["kind"], r["gpus"]) for r in req if r["op"] == "comm"}):
        per_token = {"all_reduce": 2, **A2A_BYTES_PER_ELEMENT}.get(kind)
        if per_token is None or hidden is None:
            continue
        recs += [{"op": "comm", "kind": kind, "gpus": gpus, "bytes": t * hidden * per_token} for t in GRID_TOKENS]
    return recs


def kernel_table(name: str, system: str, backend: str, version: str, priced: dict, command: str, what: str) -> dict:
    return {
        "name": name,
        "provenance": {
            "kind": "silicon-table",
            "hardware": SYSTEMS[system],
            "engine": f"{BACKENDS.get(backend, backend)} (SGLang {FALLBACK_BACKEND[1]} where a record says so)",
            "engine_version": version,
            "date": _dt.date.today().isoformat(),
            "method": (
                f"{AIC_PACKAGE}=={AIC_VERSION} system {system}: per-kernel tables read as data "
                "(AIC's own interpolation for gemm/moe, log-space linear interpolation of the module "
                "tables for attention/mhc/comm); " + what
            ),
            "command": command,
            "source": (
                f"NVIDIA AIConfigurator ({AIC_PACKAGE} {AIC_VERSION} on PyPI, Apache-2.0), measured "
                "tables under aiconfigurator_core/systems/data"
            ),
            "package": f"{AIC_PACKAGE}=={AIC_VERSION}",
            "system": system,
            "backend": f"{backend} {version}",
            "fallback_backend": " ".join(FALLBACK_BACKEND),
            "files": priced["files"],
            "moe_routing": "balanced (uniform: each token's k experts at a fixed stride) unless a record says",
            **table_guard(priced["records"]),
        },
        "records": priced["records"],
        "unpriced": priced["unpriced"],
    }


def table_name(out: str) -> str:
    """A kernel table's name from its output path: the file name without .json / .json.gz."""
    name = Path(out).name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


#: (model, topology, expert dtype or None = the composer's default) per system in the shipped tables
SHIPPED_CASES: dict[str, list[tuple[str, str, str | None]]] = {
    "b300_sxm": [(m, t, None) for m in ("deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3") for t in TOPOLOGIES],
    "h200_sxm": [(m, t, None) for m in ("deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3") for t in TOPOLOGIES]
    + [("deepseek-v4-pro", "tp8-ep8", "w4a16")],
}


def build_table(
    system: str,
    backend: str = "vllm",
    version: str | None = None,
    cases: list[tuple[str, str, str | None]] | None = None,
) -> dict:
    """Price the composer's records (required-ops) and the fixed grid for every shipped case of one system.

    A record key priced differently for two models (possible only for collectives whose record carries no
    model shape: an a2a of equal bytes) keeps the first model's price and is counted in provenance; every a2a
    record also has a twin carrying its shape (hidden, topk, experts), which never clashes."""
    tables = AicTables(system, backend, version)
    merged: dict[tuple, dict] = {}
    unpriced: dict[tuple, dict] = {}
    clashes = 0
    cases = (
        cases
        or SHIPPED_CASES.get(system)
        or [(m, t, None) for m in ("deepseek-v4-flash", "deepseek-v4-pro", "deepseek-v3") for t in TOPOLOGIES]
    )
    for model, topo, edt in cases:
        req = composer_records(model, topo, system, edt)
        got = price_records(req + grid_records(model, topo, system, req), system, backend, version, model, tables)
        c = model_config(model)
        shape = {"hidden": c["hidden_size"], "topk": c["num_experts_per_tok"], "experts": c["n_routed_experts"]}
        twins = [
            {**r, **shape}
            for r in got["records"]
            if r["op"] == "comm" and r["kind"].startswith("a2a") and "hidden" not in r
        ]
        for r in got["records"] + twins:
            k = record_key(r)
            if k in merged:
                clashes += merged[k]["ms"] != r["ms"]
                continue
            merged[k] = r
        for u in got["unpriced"]:
            unpriced.setdefault(record_key(u), u)
    cases_txt = ", ".join(f"{m} {t}" + (f" ({e} experts)" if e else "") for m, t, e in cases)
    return {
        "records": list(merged.values()),
        "unpriced": [u for k, u in unpriced.items() if k not in merged],
        "files": sorted(tables.files_read),
        "clashes": clashes,
        "cases": cases_txt,
    }


def case_table(hardware: str, backend: str, model: str, topology: str, expert_dtype: str | None = None) -> Any:
    """A kernel table for one composer case priced on demand from AIC's tables (the aic extra): the
    composer's records and the fixed grid of ``model`` x ``topology`` on ``hardware`` (dsim's key: h100,
    h200, b200, b300, gb200, gb300) with ``backend``'s tables (vllm, sglang, trtllm), as
    ``dsim profile aic build`` prices them; guarded as build's. Returns a dsim.profiling.kernel_tables.KernelTable
    named <hardware>-aic-<backend>."""
    from dsim.profiling.kernel_tables import KernelTable

    system = SYSTEM_OF.get(hardware)
    if system is None:
        raise InputError(
            f"--hardware {hardware}: AIC has no kernel tables dsim can compose from for it "
            f"(it composes on {', '.join(sorted(SYSTEM_OF))})"
        )
    version = default_version(system, backend)
    if topology in TOPOLOGIES:  # the composer's records and the fixed grid over their shapes
        priced = build_table(system, backend, version, [(model, topology, expert_dtype)])
    else:  # (the fixed grid is written for the shipped topologies): the composer's own records
        priced = _case_records(system, backend, version, model, topology, expert_dtype)
    name = f"{hardware}-aic-{backend}"
    cmd = f"dsim.profiling.aic_tables.case_table({hardware!r}, {backend!r}, {model!r}, {topology!r})"
    t = kernel_table(name, system, backend, version, priced, cmd, f"the composer's records for {model} {topology}")
    return KernelTable(name=name, provenance=t["provenance"], records=t["records"])


def _case_records(system: str, backend: str, version: str, model: str, topology: str, expert_dtype: str | None) -> dict:
    """The composer's own records of a topology outside the fixed grid's (wide EP): priced, no grid."""
    tables = AicTables(system, backend, version)
    got = price_records(
        composer_records(model, topology, system, expert_dtype), system, backend, version, model, tables
    )
    return {**got, "files": sorted(tables.files_read), "clashes": 0, "cases": f"{model} {topology}"}
