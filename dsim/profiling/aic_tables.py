"""Kernel tables read from NVIDIA AIConfigurator's silicon data, in dsim's kernel-op record format.

AIConfigurator (``aiconfigurator-core`` on PyPI, Apache-2.0, pinned here at 0.12.0) ships per-system
performance tables measured on real GPUs with real engines (vLLM 0.24.0, SGLang 0.5.14, TRT-LLM): GEMMs, fused
MoE, attention modules, DeepSeek-V4 attention / mHC modules, all-reduce, NCCL and DeepEP all-to-all. This module
reads those tables as data and prices dsim's kernel-op records (the producer side of the composer's interface)
for hardware we cannot measure (B300) and for the H200 (to compare with our own measurements).

Commands (``dsim profile aic ...``):
  grid     op records for a model and topology on a fixed grid (used until the composer lists its own)
  price    price op records from one system's tables -> a kernel table JSON
  build    grid + price for every shipped model and topology -> one kernel table per system
  compare  ratio table (b)/(a) of two kernel tables, op by op and shape by shape (needs no AIC)
  anchors  AIC's own end-to-end step estimates for the public anchor points

Only ``compare`` runs without the optional extra (``pip install 'dsim[aic]'``); shipped tables need no extra.

The tables are read by dsim.profiling.aic_source, priced by aic_pricing (what each AIC table measures is
said there), guarded by aic_guard, built into kernel tables by aic_build, compared by aic_compare, and
AIC's own anchors run by aic_anchors; this module is the command and compose_for.
"""

from __future__ import annotations

if __name__ == "__main__":  # a Ctrl-C while the modules below load: quiet exit 130
    from dsim.cli.toolmain import startup_guard

    startup_guard("dsim profile aic")

import argparse
import datetime as _dt
import gzip
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dsim.errors import InputError
from dsim.profiling.aic_anchors import ANCHORS, run_anchor
from dsim.profiling.aic_build import build_table, case_table, grid_records, kernel_table, table_name
from dsim.profiling.aic_compare import compare_tables, comparison_json, comparison_summary, format_comparison
from dsim.profiling.aic_pricing import price_records
from dsim.profiling.aic_source import AIC_PACKAGE, AIC_VERSION, BACKENDS, MODELS, SYSTEMS, TOPOLOGIES, default_version


def _load_json(path: str, what: str):
    from dsim.schema import read_json

    return read_json(path, what=what)


def _dumps(obj: Any) -> str:
    """JSON with one record per line for lists of records (diffable, a third of the indented size)."""
    if not isinstance(obj, dict):
        return json.dumps(obj, indent=1) + "\n"
    parts = []
    for k, v in obj.items():
        if isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            body = ",\n".join("  " + json.dumps(x, separators=(", ", ": ")) for x in v)
            parts.append(f" {json.dumps(k)}: [\n{body}\n ]")
        else:
            parts.append(f" {json.dumps(k)}: " + json.dumps(v, indent=1).replace("\n", "\n "))
    return "{\n" + ",\n".join(parts) + "\n}\n"


def _write_json(path: str, obj: Any) -> None:
    from dsim.outputs import write_file

    text = _dumps(obj)
    # mtime 0: the same bytes for the same table; whole or nothing, never over a special file
    data = gzip.compress(text.encode(), mtime=0) if Path(path).name.endswith(".gz") else text
    write_file(path, data, parents=True)


def _ops_from(path: str) -> list[dict]:
    obj = _load_json(path, "op records")
    recs = obj.get("records", obj.get("ops")) if isinstance(obj, dict) else obj
    if not isinstance(recs, list):
        raise InputError(f'{path}: expected a list of op records (or an object with "records")')
    return recs


# ---- CLI ---------------------------------------------------------------------------------------------------


def _cmd_grid(a) -> None:
    print(json.dumps(grid_records(a.model, a.topology, a.system), indent=0))


def _cmd_price(a) -> None:
    a.version = a.version or default_version(a.system, a.backend)
    recs: list[dict] = []
    for p in a.ops:
        recs += _ops_from(p)
    priced = price_records(recs, a.system, a.backend, a.version, a.model)
    name = table_name(a.out)
    cmd = " ".join(
        [
            "dsim profile aic price",
            f"--system {a.system}",
            f"--backend {a.backend}",
            f"--version {a.version}",
        ]
        + [f"--ops {p}" for p in a.ops]
        + ([f"--model {a.model}"] if a.model else [])
        + [f"--out {a.out}"]
    )
    _write_json(a.out, kernel_table(name, a.system, a.backend, a.version, priced, cmd, "records from --ops"))
    print(f"{a.out}: {len(priced['records'])} records priced, {len(priced['unpriced'])} unpriced")


def _cmd_build(a) -> None:
    a.version = a.version or default_version(a.system, a.backend)
    priced = build_table(a.system, a.backend, a.version)
    cmd = f"dsim profile aic build --system {a.system} --backend {a.backend} --version {a.version} --out {a.out}"
    what = (
        f"the composer's records (dsim.profiling.compose required-ops) and the fixed grid over their shapes for "
        f"{priced['cases']}; {priced['clashes']} record keys priced differently for two models kept the "
        "first"
    )
    _write_json(a.out, kernel_table(table_name(a.out), a.system, a.backend, a.version, priced, cmd, what))
    print(
        f"{a.out}: {len(priced['records'])} records priced, {len(priced['unpriced'])} unpriced, "
        f"{priced['clashes']} clashes"
    )


def _cmd_compare(a) -> None:
    b = _load_json(a.b, "kernel table (b)")
    t = _load_json(a.a, "kernel table (a)")
    c = compare_tables(b, t)
    print(format_comparison(c, shapes=not a.summary))
    if a.json:
        _write_json(a.json, comparison_json(c))
    if a.error_summary:
        cmd = f"dsim profile aic compare {a.b} {a.a} --error-summary {a.error_summary}"
        _write_json(a.error_summary, comparison_summary(c, cmd, t.get("provenance") if isinstance(t, dict) else None))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="dsim profile aic", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grid", help="op records on the fixed grid for a model and topology")
    g.add_argument("--model", required=True, choices=sorted(MODELS))
    g.add_argument("--topology", required=True, choices=TOPOLOGIES)
    g.add_argument("--system", default="b300_sxm", choices=sorted(SYSTEMS))
    p = sub.add_parser("price", help="price op records from AIC's tables")
    p.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    p.add_argument("--backend", default="vllm", choices=sorted(BACKENDS))
    p.add_argument("--version", default=None, help="the backend's table version (default: the newest AIC ships)")
    p.add_argument("--ops", required=True, action="append", help="op records JSON (repeatable)")
    p.add_argument("--model", choices=sorted(MODELS), help="model of attention records that do not name one")
    p.add_argument("--out", required=True)
    bd = sub.add_parser("build", help="grid + price for the shipped models and both topologies")
    bd.add_argument("--system", required=True, choices=sorted(SYSTEMS))
    bd.add_argument("--backend", default="vllm", choices=sorted(BACKENDS))
    bd.add_argument("--version", default=None, help="the backend's table version (default: the newest AIC ships)")
    bd.add_argument("--out", required=True)
    c = sub.add_parser("compare", help="ratio (b)/(a) of two kernel tables, shape by shape")
    c.add_argument("b", help="kernel table (b), e.g. profiles/kernels/h200-aic-vllm.json.gz")
    c.add_argument("a", help="kernel table (a), e.g. profiles/kernels/h200-torch.json")
    c.add_argument("--summary", action="store_true", help="per-kind summary only")
    c.add_argument("--json", help="also write the comparison as JSON here")
    c.add_argument("--error-summary", help="also write the per-kind error summary here (for compose --table-error)")
    pr = sub.add_parser("profile", help="a composed profile of a model on any hardware x backend with tables")
    pr.add_argument(
        "--model", required=True, help="a model under profiles/models (deepseek-v3, deepseek-v4-flash, ...)"
    )
    pr.add_argument("--hardware", required=True, help="h100, h200, b200, b300, gb200 or gb300")
    pr.add_argument("--backend", default="vllm", choices=sorted(BACKENDS))
    pr.add_argument("--topology", default="dp8-ep8", help="e.g. dp8-ep8, tp8-ep8, dp16-ep16")
    pr.add_argument("--overlap", default="none", choices=("none", "dbo"))
    pr.add_argument("--expert-dtype", default=None, help="fp8 or fp4 (default: as released where the hardware runs it)")
    pr.add_argument("--out", required=True)
    an = sub.add_parser("anchors", help="AIC's end-to-end estimates for the public anchor points")
    an.add_argument("--out", default="profiles/kernels/aic-anchors.json")
    a = ap.parse_args(argv)
    from dsim.cli.toolmain import run_tool
    from dsim.outputs import check_apart, check_file_target

    def body() -> int:
        outs = [(getattr(a, k, None), f"--{k.replace('_', '-')}") for k in ("out", "json", "error_summary")]
        for path, what in outs:  # every output refused before any work
            if path is not None:
                check_file_target(path, what, parents=True)
        check_apart(*outs)
        {
            "grid": _cmd_grid,
            "price": _cmd_price,
            "build": _cmd_build,
            "compare": _cmd_compare,
            "profile": _cmd_profile,
            "anchors": _cmd_anchors,
        }[a.cmd](a)
        return 0

    return run_tool("dsim profile aic", body)


# ---- a composed profile on any hardware x backend AIC has tables for -------------------------------------------


def kernel_tables_for(hardware: str, backend: str, model: str | None, topology: str) -> Any:
    """The silicon-table kernel table of ``hardware`` x ``backend``: the shipped
    profiles/kernels/<hardware>-aic-<backend>.json.gz for a shipped topology (dsim.profiling.pricer.shipped_table_for),
    else priced for this model and topology from AIC's tables on demand (case_table; the aic extra; only for
    a model of MODELS: ``model`` None is a model AIC's composer records cannot be written for)."""
    from dsim.profiling.kernel_tables import HARDWARE, kernel_table_path
    from dsim.profiling.pricer import BACKENDS as COMPOSE_BACKENDS
    from dsim.profiling.pricer import shipped_table_for

    if backend not in COMPOSE_BACKENDS:
        raise InputError(f"--backend {backend!r}: one of {', '.join(COMPOSE_BACKENDS)}")
    if hardware not in HARDWARE:
        raise InputError(f"--hardware {hardware!r}: one of {', '.join(sorted(HARDWARE))}")
    if kernel_table_path(f"{hardware}-aic-{backend}").is_file() and topology in ("dp8-ep8", "tp8-ep8"):
        return shipped_table_for(hardware, backend, topology)
    if model is None:
        raise InputError(
            f"no shipped {hardware}-aic-{backend} table for {topology}, and AIC's tables are priced on demand only "
            f"for {', '.join(MODELS)}"
        )
    return case_table(hardware, backend, model, topology)


def compose_for(
    model: Any,
    hardware: str,
    backend: str = "vllm",
    topology: str = "dp8-ep8",
    *,
    overlap: str = "none",
    expert_dtype: str | None = None,
    name: str | None = None,
    after: Sequence[Any] = (),
    command: str | None = None,
    **kw: Any,
) -> Any:
    """A composed profile of ``model`` (profiles/models/<model>.json, or a dsim.profiling.models.MoEModel, e.g. read from
    a user's config.json) on ``hardware`` (a dsim.profiling.kernel_tables.HARDWARE key: h100, h200, b200, b300, gb200, gb300)
    served by ``backend`` (vllm, sglang, trtllm: whose kernels AIC's silicon tables measured) at ``topology``.
    ``after``: further kernel tables asked after the silicon one (e.g. our own measured table). Named
    <model>-<hardware>-<backend>-<topology>[-dbo]; provenance.hardware and provenance.backend say both. Other
    keywords go to dsim.profiling.compose.compose_profile."""
    import dataclasses

    from dsim.profiling.compose import compose_profile
    from dsim.profiling.kernel_tables import HARDWARE
    from dsim.profiling.models import MoEModel, load_model
    from dsim.profiling.topology import parse_topology

    m = model if isinstance(model, MoEModel) else load_model(model)
    known = m.name if m.name in MODELS else None
    if expert_dtype:
        if expert_dtype == "fp4" and HARDWARE[hardware]["fp4"] is None:
            raise InputError(f"expert dtype fp4: {HARDWARE[hardware]['name']} has no FP4 tensor cores")
        m = dataclasses.replace(m, expert_dtype=expert_dtype)
    topo = parse_topology(topology)
    table = kernel_tables_for(hardware, backend, known, topo.name)
    label = f"{m.name}-{hardware}-{backend}-{topo.name}" + ("-dbo" if overlap == "dbo" else "")
    cmd = command or (
        f"dsim.profiling.aic_tables.compose_for({m.name!r}, {hardware!r}, {backend!r}, {topology!r}"
        + (f", overlap={overlap!r}" if overlap != "none" else "")
        + (f", expert_dtype={expert_dtype!r}" if expert_dtype else "")
        + ")"
    )
    tables = [table, *after]
    prof = compose_profile(m, topo, hardware, tables, name=name or label, overlap=overlap, command=cmd, **kw)
    prof.provenance["backend"] = f"{backend} ({table.provenance.get('backend', table.provenance.get('engine'))})"
    return prof


def _cmd_profile(a: argparse.Namespace) -> None:
    from dsim.cost import save_profile

    prof = compose_for(a.model, a.hardware, a.backend, a.topology, overlap=a.overlap, expert_dtype=a.expert_dtype)
    save_profile(prof, a.out)  # (the target was checked before any work; written whole or not at all)
    print(f"wrote {a.out}: {prof.label}")


def _cmd_anchors(a) -> None:
    anchors = [run_anchor(an) for an in ANCHORS]
    cmd = f"dsim profile aic anchors --out {a.out}"
    out = {
        "name": "aic-anchors",
        "provenance": {
            "kind": "silicon-table-estimate",
            "date": _dt.date.today().isoformat(),
            "method": (
                "AIConfigurator's own end-to-end static decode estimate: aiconfigurator_core.sdk "
                "get_model + get_backend(...).run_static(mode='static_gen') with ModelConfig(tp_size, "
                "moe_tp_size=1, moe_ep_size, attention_dp_size=1) and RuntimeConfig(batch_size, isl, osl), "
                "AIC's default quantization for each checkpoint; step_ms is AIC's TPOT"
            ),
            "command": cmd,
            "package": f"{AIC_PACKAGE}=={AIC_VERSION}",
            "source": f"NVIDIA AIConfigurator ({AIC_PACKAGE} {AIC_VERSION}, Apache-2.0)",
        },
        "anchors": anchors,
    }
    _write_json(a.out, out)
    for an in anchors:
        print(f"{an['name']}: {an['step_ms']} ms per step (quoted {an['quoted_ms']})")


if __name__ == "__main__":
    sys.exit(main())
