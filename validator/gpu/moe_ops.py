"""Kernel-op benchmarks for DeepSeek-V4 / V3 layer shards on one GPU: op records priced into a kernel table.

    python3 -m validator.gpu.moe_ops grid --out ops.json          # the fallback grid (V4-Flash DP8+EP8, V3 TP8+EP8)
    python3 -m validator.gpu.moe_ops price --ops ops.json --out profiles/kernels/h200-torch.json [--budget-s 300]
    python3 -m validator.gpu.moe_ops check                         # correctness of the kernels against float64
    python3 -m validator.gpu.moe_ops fold ADD.json --into profiles/kernels/h200-torch.json --what TEXT
                                                                   # append a priced run's new records

Op records are those of the kernel-table interface (gemm, moe, attn, mhc, elementwise; comm is not measurable on
one GPU and is skipped with a reason). Every record is timed as a CUDA graph holding several instances of the op
over rotating input sets (footprint >= 2 x L2 where memory allows, so each instance reads its operands from HBM,
as inside a whole forward pass), median over repeats of (graph time / instances).

Kernels (what a serving engine runs, as far as torch 2.11 + Triton allow on Hopper):
- gemm bf16: cuBLAS through torch (x @ w.T). gemm fp8: e4m3 with DeepSeek's scales (1x128 activation groups,
  128x128 weight blocks) through torch's block-scaled FP8 matmul where the build supports it, else per-row /
  per-column scales (the mode used is recorded in the table's provenance).
- moe: routed experts of one EP rank: expert-order permute, grouped gate+up GEMM, SwiGLU (clamped), grouped down
  GEMM, routing-weight multiply, unpermute; torch's grouped GEMM (bf16) / row-scaled FP8 grouped GEMM, else a
  loop of per-expert GEMMs. fp4 records run as fp8 (Hopper has no FP4 tensor cores; the FP8-expert V4 variant
  is public).
- attn v4_*: DeepSeek-V4 attention core (single 512-dim KV head shared by key and value, sliding window 128,
  KV compressor at ratio 4 (overlapping blocks) or 128, lightning indexer 64 x 128 scoring over the compressed
  cache with top-k selection (ratio 4), attention sink per head): cache writes, compressor pooling, indexer
  (Triton), top-k (torch), and the sparse attention (Triton: each query token's heads form the query tile,
  its key list = selected compressed entries + window, split-K with a logsumexp combine when the step is too
  small to fill the GPU). The q/kv/o, compressor and indexer projection GEMMs are NOT in the core.
- attn mla: DeepSeek-V3 absorbed MLA decode (16 x q query rows folded into one tile per request, 576-dim keys,
  512-dim values = the latent, split-K + combine; same Triton kernel in range mode); prefill: the latent
  expanded by W_UK / W_UV (included) and flash attention (varlen, causal) at head dim 192.
- mhc: two hyper-connection sites (pre: mixing-weight projection, Sinkhorn normalisation (Triton), weighted
  stream sum; post: stream mix + output broadcast).
torch is imported only inside functions: dsim never needs it. This module is the command; the records are
moe_records (torch-free), the Triton kernels and their launch plan moe_triton, the attention cores
moe_attention, the GEMM / MoE / mHC / elementwise ops moe_gemm, the timing harness and checks moe_timing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from dsim.outputs import write_file
from validator.gpu import moe_triton
from validator.gpu.moe_gemm import detect_fp8
from validator.gpu.moe_records import fallback_grid
from validator.gpu.moe_timing import (
    check_kernels,
    copy_bandwidth,
    gpu_line,
    price_record,
    tune_attention,
    write_json_atomic,
)
from validator.gpu.moe_triton import ATTN_TUNE, INDEXER_TUNE


def price_main(a) -> int:
    import torch

    if a.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    device = torch.device("cpu" if a.dry_run else "cuda")
    dtype = torch.float32 if a.dry_run else torch.bfloat16
    try:
        ops = json.loads(Path(a.ops).read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: --ops {a.ops}: {e}", file=sys.stderr)
        return 2
    if isinstance(ops, dict):
        ops = ops.get("records", ops.get("ops", []))
    if not isinstance(ops, list) or not all(isinstance(r, dict) and "op" in r for r in ops):
        print(f"error: --ops {a.ops}: expected a list of op records", file=sys.stderr)
        return 2
    if a.dry_run:
        ops = dry_run_records(ops)
    t0 = time.time()
    info = gpu_line(device)
    if device.type == "cuda":
        moe_triton.SMS = info["sms"]
        fp8 = detect_fp8(device)
        info["fp8"] = {k: v for k, v in fp8.items()}
        info["tune"] = tune_attention(device, dtype)
        info["copy_tb_s"] = round(copy_bandwidth(device), 3)  # after the tuning warmed the clocks
        print(json.dumps(info), flush=True)
    tune = {"attn": dict(ATTN_TUNE), "indexer": dict(INDEXER_TUNE)}
    order = list(range(len(ops))) if a.keep_order else sorted(range(len(ops)), key=lambda i: _priority(ops[i]))
    priced: dict[int, dict] = {}
    last_write = time.time()
    for n_done, i in enumerate(order):
        if time.time() - t0 > a.budget_s:
            break
        rec = {k: v for k, v in ops[i].items() if k != "ms"}
        try:
            priced[i] = price_record(rec, device, dtype, tune)
        except Exception as e:  # noqa: BLE001 - one failing record must not lose the table
            priced[i] = dict(rec, skipped=f"{type(e).__name__}: {str(e)[:200]}")
        if time.time() - last_write > 20 or n_done == len(order) - 1:
            _write_table(a, ops, priced, info, t0)
            last_write = time.time()
        if a.verbose:
            print(json.dumps(priced[i]), flush=True)
    _write_table(a, ops, priced, info, t0)
    n_ms = sum(1 for r in priced.values() if "ms" in r)
    print(
        f"priced {n_ms} of {len(ops)} records ({len(priced) - n_ms} skipped, {len(ops) - len(priced)} not reached) "
        f"in {time.time() - t0:.0f}s -> {a.out}",
        flush=True,
    )
    return 0


def _priority(rec: dict) -> tuple:
    """Cheap, widely used records first; the largest attention shapes last (the budget may cut them)."""
    op = rec["op"]
    rank = {"gemm": 0, "moe": 1, "mhc": 2, "elementwise": 2, "attn": 3, "comm": 4}.get(op, 5)
    if op == "attn":
        size = rec["batch"] * rec["q"] * max(rec["kv"], 1) ** 0.5
        return (rank, rec["phase"] != "decode", size)
    return (rank, 0, 0)


def _write_table(a, ops, priced, info, t0) -> None:
    records = [priced[i] for i in sorted(priced) if "ms" in priced[i]]
    skipped = [priced[i] for i in sorted(priced) if "ms" not in priced[i]]
    fp8 = info.get("fp8", {})
    mode = fp8.get("gemm_mode")
    fp8_line = {
        "block": "fp8 GEMMs with DeepSeek's block scales (1x128 activation groups, 128x128 weight "
        "blocks) through torch.nn.functional.scaled_mm",
        "row": "fp8 GEMMs with per-row / per-column scales (this torch build has no block-scaled "
        "FP8 matmul on this GPU)",
        "tensor": "fp8 GEMMs with per-tensor scales",
    }.get(mode, "fp8 mode: dry run")
    grouped = (
        "fp8 MoE: torch._scaled_grouped_mm with per-row / per-column scales"
        if fp8.get("grouped_mode") == "row"
        else "fp8 MoE: a loop of per-expert scaled GEMMs"
    )
    prov = {
        "kind": "measured",
        "hardware": "NVIDIA H200 SXM" if "H200" in info.get("gpu", "") else info.get("gpu"),
        "engine": "torch + Triton (validator/gpu/moe_ops.py)",
        "engine_version": f"torch {info.get('torch')}",
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "method": (
            "CUDA-graph replay of each op (several instances over rotating inputs, >= 2 x L2 where "
            "memory allows), median of 7 timed intervals; random bf16/fp8 data; "
            + fp8_line
            + "; "
            + grouped
            + "; fp4 experts run as fp8 (no FP4 tensor cores on Hopper); MoE routing "
            "uniform (each token picks top-k distinct experts uniformly; seeded); attention cores "
            "as in the module docstring (projection GEMMs excluded); comm not measured"
        ),
        "command": " ".join(
            ["python3 -m validator.gpu.moe_ops price", f"--ops {a.ops}", f"--out {a.out}", f"--name {a.name}"]
            + ([f"--budget-s {a.budget_s:g}"] if a.budget_s != 420.0 else [])
            + (["--keep-order"] if a.keep_order else [])
        ),
        "source": "own measurement",
        "gpu": info,
        "records_requested": len(ops),
        "records_priced": len(records),
        "records_skipped": skipped,
        "records_not_reached": len(ops) - len(priced),
        "wall_s": round(time.time() - t0, 1),
    }
    write_json_atomic(a.out, {"name": a.name, "provenance": prov, "records": records})


def fold_records(table: dict, add: dict, what: str, command: str) -> dict:
    """Append the records of a priced run (`add`, the output of `price`) that `table` has no record
    for, and one provenance.additions entry saying what they are and where they were measured.
    Records the table already holds stay as they are (the table's other records were measured
    beside them); how far the run re-measured them is summarised in the entry (new / old ms). Returns
    the summary; `table` is changed in place."""
    from dsim.profiling.kernel_tables import record_key

    have = {}
    for r in table["records"]:
        have.setdefault((r["op"],) + record_key(r), float(r["ms"]))
    new, ratios = [], []
    for r in add.get("records", []):
        if "ms" not in r:
            continue
        k = (r["op"],) + record_key(r)
        if k in have:
            ratios.append(float(r["ms"]) / have[k])
        else:
            have[k] = float(r["ms"])
            new.append(r)
    table["records"].extend(new)
    prov = add.get("provenance", {})
    gpu = prov.get("gpu", {})
    entry = {
        "date": prov.get("date"),
        "records": len(new),
        "what": what,
        "command": command,
        "wall_s": prov.get("wall_s"),
        "gpu": gpu.get("gpu"),
        "torch": gpu.get("torch"),
        "skipped": len(prov.get("records_skipped", [])),
        "not_reached": prov.get("records_not_reached", 0),
    }
    if ratios:
        dev = [abs(x - 1) for x in ratios]
        entry["remeasured"] = dict(
            records=len(ratios),
            median_ratio=round(float(np.median(ratios)), 4),
            max_abs_dev=round(float(max(dev)), 4),
        )
    table["provenance"].setdefault("additions", []).append(entry)
    return entry


def fold_main(a) -> int:
    try:
        add = json.loads(Path(a.add).read_text())
        table = json.loads(Path(a.into).read_text())
    except (OSError, json.JSONDecodeError) as e:
        print(f"error: fold: {e}", file=sys.stderr)
        return 2
    if not isinstance(add, dict) or not isinstance(add.get("records"), list):
        print(f"error: fold: {a.add}: not a priced kernel table (no records list)", file=sys.stderr)
        return 2
    if not isinstance(table, dict) or not isinstance(table.get("records"), list) or "provenance" not in table:
        print(f"error: fold: {a.into}: not a kernel table (records and provenance)", file=sys.stderr)
        return 2
    bad = [i for i, r in enumerate(add["records"]) if not isinstance(r, dict) or "op" not in r]
    if bad:
        print(f"error: fold: {a.add}: record {bad[0]} has no op", file=sys.stderr)
        return 2
    command = a.command or "python3 -m validator.gpu.moe_ops price --ops OPS.json --out ADD.json; records appended"
    entry = fold_records(table, add, a.what, command)
    write_json_atomic(a.into, table)
    print(json.dumps(entry))
    return 0


def dry_run_records(ops: list[dict]) -> list[dict]:
    """Tiny stand-ins of the first records of each op kind (CPU dry run)."""
    seen: dict[str, int] = {}
    out = []
    for r in ops:
        key = r["op"] + r.get("kind", "") + r.get("phase", "")
        if seen.get(key, 0) >= 2:
            continue
        seen[key] = seen.get(key, 0) + 1
        r = dict(r)
        if r["op"] == "gemm":
            r.update(m=min(r["m"], 8), n=min(r["n"], 256), k=min(r["k"], 256))
        elif r["op"] == "moe":
            r.update(tokens=min(r["tokens"], 16), hidden=128, inter=64, experts=16, ep=4)
        elif r["op"] == "attn":
            r.update(
                batch=min(r["batch"], 2),
                q=min(r["q"], 80),
                kv=min(r["kv"], 600),
                model="__dry__",
                heads=16 if r["kind"] != "mla" else 4,
            )
        elif r["op"] == "mhc":
            r.update(tokens=min(r["tokens"], 8), hidden=64)
        elif r["op"] == "elementwise":
            r.update(bytes=min(r["bytes"], 4096))
        out.append(r)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grid", help="write the fallback op grid")
    g.add_argument(
        "--spec",
        action="append",
        default=[],
        help="MODEL:TOPOLOGY (default deepseek-v4-flash:dp8-ep8 and deepseek-v3:tp8-ep8)",
    )
    g.add_argument("--quick", action="store_true", help="a thinned grid")
    g.add_argument("--out", default="-")
    p = sub.add_parser("price", help="price op records on this GPU")
    p.add_argument("--ops", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--name", default="h200-torch")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting new records after this")
    p.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes (Triton interpreter)")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--keep-order", action="store_true", help="price in file order (default: cheap ops first)")
    f = sub.add_parser("fold", help="append a priced run's new records to a kernel table, with provenance")
    f.add_argument("add", help="the priced run (price's --out)")
    f.add_argument("--into", required=True, help="the kernel table to extend (rewritten in place)")
    f.add_argument("--what", required=True, help="what the records are (kept in provenance.additions)")
    f.add_argument("--command", default=None, help="the command that produced them (kept in provenance.additions)")
    c = sub.add_parser("check", help="kernel correctness against float64")
    c.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    if a.cmd == "grid":
        specs = [tuple(s.split(":", 1)) for s in (a.spec or ["deepseek-v4-flash:dp8-ep8", "deepseek-v3:tp8-ep8"])]
        for s in specs:
            if len(s) != 2:
                print(f"error: --spec {':'.join(s)}: expected MODEL:TOPOLOGY", file=sys.stderr)
                return 2
        recs = fallback_grid(specs, a.quick)
        txt = json.dumps(recs, indent=0)
        if a.out == "-":
            print(txt)
        else:
            write_file(a.out, txt + "\n", "output")
            print(f"{len(recs)} records -> {a.out}", file=sys.stderr)
        return 0
    if a.cmd == "price":
        return price_main(a)
    if a.cmd == "fold":
        return fold_main(a)
    import torch

    if a.dry_run:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    dev = torch.device("cpu" if a.dry_run else "cuda")
    print(json.dumps(check_kernels(dev, torch.float32 if a.dry_run else torch.bfloat16, small=a.dry_run)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
