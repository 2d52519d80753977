"""GPU step-cost profiler: writes dsim profile YAML files measured on this GPU.

    python3 -m validator.gpu.profile --model profiles/models/llama-3.1-8b.json \
        [--model ...] --out $OUT [--replay synthetic|STEPLOG ...] [--quick] [--dry-run] [--eager-tails]

    python3 -m validator.gpu.profile --draft-only --model ... --out $OUT --split continuous:fill=2,balance=2 \
        [--reps 5] [--stop-at UNIX_S] [--draft-kinds dspark,mtp,eagle3,block]

Needs torch + numpy (yaml optional). --dry-run runs a tiny model on the CPU (float32) with a small
sweep: it checks the whole pipeline, its numbers mean nothing. --draft-only times the drafter
tables alone at every size of plan.DRAFT_REQUESTS and appends one run per process to
$OUT/drafts-<model>.json (scripts/draft_tables.sh; merged by `python3 -m validator.gpu.refit --drafts`).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dsim.errors import InputError
from validator.gpu import model as M
from validator.gpu.fit import cost_model, fit_step_model, kv_slope_by_window, step_terms
from validator.gpu.model import Timer, parse_split
from validator.gpu.plan import (
    ANCHOR_N,
    ATTENTION_MISSING,
    BLOCK_K,
    BLOCK_LAYERS,
    CAPTURE_LIMIT,
    DRAFT_CTX,
    DRAFT_FORMAT,
    DRAFT_ORDER,
    DRAFT_REQUESTS,
    DRY_CFG,
    EAGLE3_DRAFT_VOCAB,
    FIT_EXCLUDE,
    TABLE_TIERS,
    StepShape,
    busy_plan,
    context_sweep_plan,
    gpu_prefix,
    hetero_step,
    model_dims,
    model_name,
    padded_tokens,
    request_grid_plan,
    shaped_step,
    sweep_plan,
    tail_sizes,
    uniform_step,
    vllm_capture_sizes,
)
from validator.gpu.profile_files import dump_yaml, profile_dict, repo_relative, write_text_atomic
from validator.gpu.replay import dry_run_steps, load_or_make_steps, replay_steps
from validator.gpu.steplog import error_summary

T_MAIN = time.time()  # when this run started (main() resets it)


def log(*a: Any) -> None:
    print(*a, flush=True)


def run_identity(device: torch.device) -> dict:
    """Which machine start timed a file: the GPU's UUID and the host's boot id (a fresh machine
    start is a new boot, often another GPU), so files of one start can be grouped as one run."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = "unknown"
    uuid = str(torch.cuda.get_device_properties(0).uuid) if device.type == "cuda" else "cpu"
    return dict(gpu_uuid=uuid, boot_id=boot, started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))


def gpu_info(device: torch.device) -> dict:
    if device.type != "cuda":
        return dict(gpu="cpu (dry run)", driver="n/a", torch=str(torch.__version__), cuda="n/a", mem_gib=16.0)
    p = torch.cuda.get_device_properties(0)
    try:
        drv = (
            subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=20,
            )
            .stdout.strip()
            .splitlines()[0]
        )
    except Exception as e:  # pragma: no cover
        drv = f"unknown ({e})"
    return dict(
        gpu=torch.cuda.get_device_name(0),
        driver=drv,
        torch=torch.__version__,
        cuda=torch.version.cuda,
        mem_gib=round(p.total_memory / 2**30, 2),
        sms=p.multi_processor_count,
    )


# ---------------------------------------------------------------- attention probe
def attention_probe(device: torch.device, dtype: torch.dtype, timer: Timer, cfg_dims: dict, bench: bool = True) -> dict:
    """Correctness of the GPU attention paths against a float64 reference, and the attention time
    at q = 1, 2, 4, 8 at 8K context (256 requests) vs SDPA enable_gqa and the KV-read floor."""
    out: dict[str, Any] = {}
    pk: Any
    pv: Any
    H, kv, d = cfg_dims["heads"], cfg_dims["kv_heads"], cfg_dims["head_dim"]
    dims = dict(heads=H, kv_heads=kv, head_dim=d, vocab=100)
    rng = np.random.default_rng(0)
    cases = {
        "dense_verify": StepShape((1, 3, 8, 5), (300, 300, 300, 300)),
        "varlen_verify": StepShape(
            tuple(int(x) for x in rng.integers(1, 9, 20)), tuple(int(x) for x in rng.integers(50, 5000, 20))
        ),
        "varlen_verify_prefill": StepShape(
            tuple(int(x) for x in rng.integers(1, 9, 17)) + (40,),
            tuple(int(x) for x in rng.integers(1, 3000, 17)) + (700,),
        ),
        "prefill_ctx": StepShape((2, 4, 64), (150, 150, 128)),
        "single_split": StepShape((8,), (3500,)),
    }
    splits = {"varlen_verify_forced_split": dict(policy="continuous", fill=8.0, min_chunk=64, balance=1.0)}
    cases["varlen_verify_forced_split"] = cases["varlen_verify"]
    for name, shape in cases.items():
        for attempt in range(2):
            try:
                m = M.StepMeta(shape, shape.n, dims, device, split=splits.get(name))
                pk = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
                pv = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
                x = torch.randn(m.n_pad, H + 2 * kv, d, device=device, dtype=dtype) * 0.3
                pk.index_copy_(0, m.slot, x[:, H : H + kv])
                pv.index_copy_(0, m.slot, x[:, H + kv :])
                a = M.attention(x, (pk, pv), m).double().cpu()
                r = M.reference_attention(
                    x.cpu(), (pk.cpu(), pv.cpu()), M.StepMeta(shape, shape.n, dims, "cpu", split=splits.get(name))
                )
                out[f"check_{name}_rel_err"] = float((a - r).norm() / r.norm())
                break
            except RuntimeError as e:
                if attempt == 0 and M.GQA_NATIVE:
                    log(f"  flash GQA not accepted ({str(e)[:120]}); expanding KV heads")
                    M.GQA_NATIVE = False
                    continue
                out[f"check_{name}_error"] = str(e)[:300]
                raise
    out["prefill_gqa_native"] = M.GQA_NATIVE
    if not bench:
        return out
    R, L = (256, 8192) if device.type == "cuda" else (4, 256)
    pk = torch.randn(R * L + R * 8 + 16, kv, d, device=device, dtype=dtype)  # + band gap (s_max - 1)
    pv = torch.randn_like(pk)
    floor_bytes = 2 * R * L * kv * d * 2
    res: dict[str, Any] = {}
    for s in (1, 2, 4, 8):
        m = M.StepMeta(uniform_step(R, s, L), R * s, dims, device)
        x = torch.randn(m.n_pad, H + 2 * kv, d, device=device, dtype=dtype)
        ms, _ = timer(lambda: M.attention(x, (pk, pv), m))
        q4 = torch.randn(R, H, s, d, device=device, dtype=dtype)
        k4 = pk[: R * L].view(R, L, kv, d).transpose(1, 2)
        v4 = pv[: R * L].view(R, L, kv, d).transpose(1, 2)
        sd: float | str
        try:
            sd, _ = timer(lambda: torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True))
        except Exception as e:
            sd = f"failed: {str(e)[:80]}"
        res[f"q{s}"] = dict(
            ours_ms=round(ms, 4), sdpa_enable_gqa_ms=sd if isinstance(sd, str) else round(sd, 4), mode=m.mode
        )
        log(f"  attention R={R} L={L} q={s}: ours {ms:.3f} ms, sdpa enable_gqa {sd} ms")
    pk = pv = None
    if device.type == "cuda":
        a = torch.empty(2**30, dtype=torch.uint8, device=device)
        b = torch.empty_like(a)
        cp, _ = timer(lambda: b.copy_(a), graph=False)
        bw = 2 * 2**30 / (cp / 1e3)
        del a, b
        res["copy_bw_TBps"] = round(bw / 1e12, 3)
        res["floor_ms"] = round(floor_bytes / bw * 1e3, 4)
    res["q8_over_q1"] = round(res["q8"]["ours_ms"] / res["q1"]["ours_ms"], 3)
    # heterogeneous DSpark-like verify steps vs a uniform step of the same requests and KV tokens:
    # with attention cost proportional to KV read, the two should cost about the same
    rng2 = random.Random(7)
    het = {}
    for R in (32, 256) if device.type == "cuda" else (16,):
        hs = hetero_step(R, rng2, ctx_median=1050.0 if device.type == "cuda" else 60.0)
        cm = max(1, round((hs.kv - hs.n) / R))
        us = uniform_step(R, max(1, round(hs.n / R)), cm)
        row = {}
        for lab, sh in (("hetero", hs), ("uniform", us)):
            m = M.StepMeta(sh, sh.n, dims, device)
            pk = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
            pv = torch.randn_like(pk)
            x = torch.randn(m.n_pad, H + 2 * kv, d, device=device, dtype=dtype)
            ms, _ = timer(lambda: M.attention(x, (pk, pv), m))
            row[lab] = dict(ms=round(ms, 4), n=sh.n, kv=sh.kv, ctx_max=max(sh.ctx), chunks=m.n_chunks)
            pk = pv = None
        row["hetero_over_uniform"] = round(row["hetero"]["ms"] / row["uniform"]["ms"], 3)
        het[f"R{R}"] = row
        log(f"  attention hetero vs uniform R={R}: {json.dumps(row)}")
    res["hetero_vs_uniform"] = het
    # KV cost per 1000 tokens (attention alone, one layer) by verify window at R = 32: q-independent
    # if the folded query block and the split keep per-row work out of the KV term
    R32, (c_lo, c_hi) = (32, (1024, 8192)) if device.type == "cuda" else (8, (32, 256))
    slope = {}
    for s in (1, 2, 4, 8):
        t = {}
        for c in (c_lo, c_hi):
            m = M.StepMeta(uniform_step(R32, s, c), R32 * s, dims, device)
            pk = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
            pv = torch.randn_like(pk)
            x = torch.randn(m.n_pad, H + 2 * kv, d, device=device, dtype=dtype)
            t[c], _ = timer(lambda: M.attention(x, (pk, pv), m))
            pk = pv = None
        slope[f"q{s}"] = round((t[c_hi] - t[c_lo]) / (R32 * (c_hi - c_lo) / 1000), 6)
    res["kv_us_per_ktok_by_q_R32"] = {k: round(v * 1e3, 4) for k, v in slope.items()}
    log(f"  attention KV us per 1000 tokens by window (R={R32}, one layer): {res['kv_us_per_ktok_by_q_R32']}")
    res["requests"], res["context"] = R, L
    out["bench"] = res
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return out


SPLIT_CANDIDATES = {  # split settings the probe times (the first wins near-ties)
    "cont-f2-b2": dict(fill=2.0, balance=2.0),
    "cont-f1-b2": dict(fill=1.0, balance=2.0),
    "cont-f4-b2": dict(fill=4.0, balance=2.0),
    "cont-f2-b1.5": dict(fill=2.0, balance=1.5),
}
LINEARITY_WEIGHT = 1.0  # score = mean relative time + this x mean |hetero / uniform - 1|


def split_tune(device: torch.device, dtype: torch.dtype, timer: Timer, cfg_dims: dict, reps_in_graph: int = 8) -> dict:
    """Times the decode attention alone (reps_in_graph back-to-back calls per graph, like layers) on
    DSpark-like steps at concurrency 1, 32 and 256 and on uniform steps with the same requests and KV
    tokens, for each split variant. Score: mean time relative to the best variant per case, plus
    LINEARITY_WEIGHT x mean |hetero / uniform - 1| at 32 and 256 requests (a KV-linear cost is what
    dsim's F(n) + kv model can follow); lowest wins, within 2 % the first variant is kept. Returns
    the record; the caller applies `chosen`."""
    pk: Any
    pv: Any
    H, kv, d = cfg_dims["heads"], cfg_dims["kv_heads"], cfg_dims["head_dim"]
    dims = dict(heads=H, kv_heads=kv, head_dim=d, vocab=100)
    cuda = device.type == "cuda"
    rng = random.Random(3)
    sc = 1.0 if cuda else 0.06
    R2 = 256 if cuda else 64

    def uni(sh):
        return uniform_step(sh.requests, max(1, round(sh.n / sh.requests)), max(1, round(sum(sh.ctx) / sh.requests)))

    c32, c256 = shaped_step(32, 160, 5, sc), shaped_step(R2, 3 * R2, 6, sc)
    cases = {
        "c1_q4_ctx1200": StepShape((4,), (int(1200 * sc),)),
        "c1_q8_ctx3500": StepShape((8,), (int(3500 * sc),)),
        "c32": c32,
        "c32_uniform": uni(c32),
        "c32_long": hetero_step(32, rng, ctx_median=4096.0 * sc),
        "c256": c256,
        "c256_uniform": uni(c256),
    }
    pairs = (("c32", "c32_uniform"), ("c256", "c256_uniform"))
    variants = SPLIT_CANDIDATES
    res: dict[str, Any] = {}
    for cname, sh in cases.items():
        row = {}
        pk = pv = None
        for vname, sp in variants.items():
            m = M.StepMeta(sh, sh.n, dims, device, split=sp)
            if pk is None or pk.shape[0] < m.region_tokens:
                pk = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
                pv = torch.randn_like(pk)
            x = torch.randn(m.n_pad, H + 2 * kv, d, device=device, dtype=dtype)

            def fn():
                for _ in range(reps_in_graph):
                    M.attention(x, (pk, pv), m)

            ms, _ = timer(fn)
            row[vname] = dict(
                us_per_call=round(ms * 1e3 / reps_in_graph, 2),
                chunks=m.n_chunks,
                max_chunk=m.max_k,
                merge_rows=m.merge_rows,
            )
        res[cname] = dict(n=sh.n, R=sh.requests, kv=sh.kv, ctx_max=max(sh.ctx), variants=row)
        pk = pv = None
        log(
            f"  split tune {cname} (R={sh.requests} n={sh.n} kv={sh.kv}): "
            + ", ".join(f"{v}:{r['us_per_call']}us/{r['chunks']}ch/L{r['max_chunk']}" for v, r in row.items())
        )
    timed = [c for c in res if not c.endswith("_uniform")]
    ratio = {
        v: {a: round(res[a]["variants"][v]["us_per_call"] / res[b]["variants"][v]["us_per_call"], 4) for a, b in pairs}
        for v in variants
    }
    score = {
        v: float(
            np.mean(
                [
                    res[c]["variants"][v]["us_per_call"]
                    / min(res[c]["variants"][u]["us_per_call"] for u in SPLIT_CANDIDATES)
                    for c in timed
                ]
            )
            + LINEARITY_WEIGHT * float(np.mean([abs(r - 1) for r in ratio[v].values()]))
        )
        for v in variants
    }
    first = next(iter(SPLIT_CANDIDATES))
    best = min(SPLIT_CANDIDATES, key=lambda v: score[v])
    chosen = first if score[first] <= score[best] * 1.02 else best
    out = dict(
        cases=res,
        hetero_over_uniform=ratio,
        score={k: round(v, 4) for k, v in score.items()},
        chosen=chosen,
        split=dict(M.SPLIT, **SPLIT_CANDIDATES[chosen]),
        reps_in_graph=reps_in_graph,
        linearity_weight=LINEARITY_WEIGHT,
    )
    log(f"  split tune hetero/uniform {json.dumps(ratio)}")
    log(f"  split tune scores {out['score']} -> {chosen}")
    if cuda:
        torch.cuda.empty_cache()
    return out


# ---------------------------------------------------------------- attention sweeps
ATTENTION_SWEEPS = ("ctx", "grid", "busy")  # the files of a profile's attention terms, in timing order
BUSY_PARTS = ("decode", "short", "one")  # plan.busy_plan's parts a complete profile times


def attention_plan(kind: str, budget: int, parts: Any = BUSY_PARTS, quick: bool = False) -> list[StepShape]:
    """The steps of one attention sweep: ctx plan.context_sweep_plan (unequal decode contexts, prefill
    chunks over long cached prefixes), grid plan.request_grid_plan (request counts at fixed token
    counts), busy plan.busy_plan (busy steps of many decode tokens, short chunks beside decodes, one
    request)."""
    if kind == "ctx":
        return context_sweep_plan(budget, quick=quick)
    if kind == "grid":
        return request_grid_plan(quick=quick)
    if kind == "busy":
        return busy_plan(parts=list(parts), quick=quick)
    raise InputError(f"attention sweep {kind!r}: one of {', '.join(ATTENTION_SWEEPS)}")


def sweep_anchors(
    budget: int, tags: Any = ("table", "tail-decode"), sizes: Any = ANCHOR_N, dry_run: bool = False
) -> list[StepShape]:
    """The profile sweep's own steps of ``tags`` at ``sizes`` tokens, re-timed at the start of an
    attention sweep ("anchor-<tag>"): they tie that sweep's level to the profile sweep's (drift)."""
    caps = vllm_capture_sizes(CAPTURE_LIMIT)
    sweep = sweep_plan(caps, tail_sizes(CAPTURE_LIMIT), kv_budget_tokens=budget)
    anchors = [s for s in sweep if s.tag in tags and s.n in set(sizes)]
    if dry_run:
        anchors = [StepShape(s.q, tuple(min(c, 64) for c in s.ctx), s.tag) for s in anchors if s.n <= 64]
    return [StepShape(s.q, s.ctx, "anchor-" + s.tag) for s in anchors]


def time_steps(
    model: Any,
    shapes: list[StepShape],
    dims: dict,
    device: torch.device,
    reps: int,
    out_path: str | Path,
    meta: dict,
) -> list[dict]:
    """Time each step (CUDA graph, ``reps`` replays up to the capture limit, reps - 2 (at least 2)
    above it, the median) and keep its whole shape (q and ctx per request), so the step model's
    per-request attention features are computed from it offline (validator.gpu.refit). The file
    (``meta`` and the points) is rewritten after every step, so a run cut short keeps what it
    timed."""
    import functools

    caps = vllm_capture_sizes(CAPTURE_LIMIT)
    timer = Timer(device, reps, warm=1)
    big = Timer(device, max(2, reps - 2), warm=1)
    points: list[dict] = []
    t0 = time.time()
    for shape in shapes:
        n_pad = padded_tokens(shape.n, caps)
        m = M.StepMeta(shape, n_pad, dims, device)
        tm = big if shape.n > caps[-1] else timer
        ms, reps_ms = tm(functools.partial(model.forward, m), graph=True)
        dec, pre = step_terms(shape.q, shape.ctx)
        points.append(
            dict(
                tag=shape.tag,
                n=n_pad,
                n_real=shape.n,
                kv=shape.kv,
                R=shape.requests,
                dec=dec,
                pre=round(pre, 6),
                chunks=int(m.n_chunks),
                k_max=int(getattr(m, "k_max", 0)),
                ms=ms,
                reps=[round(r, 4) for r in reps_ms],
                shape_q=list(shape.q),
                shape_ctx=list(shape.ctx),
            )
        )
        log(
            f"  {shape.tag:16s} n={shape.n:5d} R={shape.requests:4d} kv={shape.kv:8d} "
            f"chunks={m.n_chunks:4d}: {ms:8.3f} ms"
        )
        write_text_atomic(out_path, json.dumps(dict(meta, split=M.SPLIT, points=points)))
    log(f"  {Path(out_path).name}: {len(points)} points in {time.time() - t0:.1f}s")
    return points


def attention_sweeps(
    model: Any,
    cfg_path: str,
    dims: dict,
    device: torch.device,
    reps: int,
    budget: int,
    out: Path,
    name: str,
    dry_run: bool = False,
) -> list[Path]:
    """The sweeps behind a profile's per-request attention terms, on the model already built: the
    context sweep, the request grid and the busy steps (attention_plan), each after its table
    anchors, written as OUT/context/{ctx,grid,busy}-<model>.json (scripts/context_sweep.py's format,
    the layout validator.gpu.refit --stored-context reads). Returns the files."""
    run = run_identity(device)
    files = []
    for kind in ATTENTION_SWEEPS:
        t0 = time.time()
        path = out / "context" / f"{kind}-{name}.json"
        tags = ("table", "tail-decode") if kind != "busy" else ("table", "tail-decode", "tail-mixed", "tail-prefill")
        shapes = sweep_anchors(budget, tags, ANCHOR_N, dry_run) + attention_plan(kind, budget, BUSY_PARTS, dry_run)
        time_steps(model, shapes, dims, device, reps, path, dict(model=repo_relative(cfg_path), run=run, sweep=kind))
        log(f"[{name}] {kind} sweep: {len(shapes)} steps in {time.time() - t0:.1f}s")
        files.append(path)
    return files


# ---------------------------------------------------------------- per-model profiling
RECHECK_N = (1, 2, 4, 8, 128, 168, 512)  # table sizes re-timed before each replayed log


def recheck(
    model: M.Model,
    points: list[dict],
    shapes: list[StepShape],
    dims: dict,
    device: torch.device,
    timer: Timer,
    caps: list[int],
    depth_scale: float,
    src: str,
) -> list:
    """Re-time the sweep's table points at RECHECK_N (identical shapes, same process) and report the
    drift from the sweep's value: separates a measurement offset from a model error."""
    out = []
    for p, shape in zip(points, shapes):
        if p["tag"] != "table" or p["n"] not in RECHECK_N:
            continue
        m = M.StepMeta(shape, padded_tokens(shape.n, caps), dims, device)
        ms, _ = timer(lambda: model.forward(m))
        ms *= depth_scale
        out.append(
            dict(
                before=Path(src).name,
                n=p["n"],
                R=p["R"],
                s=p["s"],
                ctx=p["ctx"],
                sweep_ms=round(p["ms"], 4),
                now_ms=round(ms, 4),
                drift_pct=round((ms / p["ms"] - 1) * 100, 2),
            )
        )
    clk = sm_clock_mhz(device)
    for r in out:
        r["sm_clock_mhz"] = clk
    log(
        f"  recheck before {Path(src).name} (SM clock {clk} MHz): "
        + ", ".join(f"n{r['n']}R{r['R']}s{r['s']}c{r['ctx']}:{r['drift_pct']:+.1f}%" for r in out)
    )
    return out


def sm_clock_mhz(device: torch.device) -> int | None:
    """Current SM clock (NVML through torch), None where unavailable."""
    if device.type != "cuda":
        return None
    try:
        return int(torch.cuda.clock_rate(0))
    except Exception:  # pragma: no cover
        return None


def draft_table(
    drafters: Any,
    kind: str,
    reqs: list[int],
    ctx: int,
    dims: dict,
    device: torch.device,
    timer: Timer,
    on_point: Any = None,
    stop_at: float | None = None,
) -> dict:
    """One drafter's table: its pass over R requests (R x BLOCK_K tokens for the block and DSpark
    drafters, R for MTP and EAGLE-3) at ctx tokens of context, one CUDA graph per request count R
    in reqs, the timer's median. Returns requests, ms, reps (every timed replay), sm_clock_mhz
    (after each size) and complete; on_point(table) runs after each size, and past stop_at
    (time.time()) no further size is started (complete False)."""
    tab: dict[str, Any] = dict(requests=[], ms=[], reps=[], sm_clock_mhz=[], complete=False)
    t0 = time.time()
    s = BLOCK_K if kind in ("block", "dspark") else 1
    for R in reqs:
        if stop_at is not None and time.time() > stop_at:
            log(f"  draft {kind}: deadline, stopped before R={R}")
            break
        m = M.StepMeta(uniform_step(R, s, ctx), R * s, dims, device)
        ms, reps = timer(lambda: drafters.run(kind, m, BLOCK_K), graph=True)
        tab["requests"].append(int(R))
        tab["ms"].append(float(ms))
        tab["reps"].append([round(float(r), 5) for r in reps])
        tab["sm_clock_mhz"].append(sm_clock_mhz(device))
        if on_point is not None:
            on_point(tab)
    tab["complete"] = tab["requests"] == list(reqs)
    tab["elapsed_s"] = round(time.time() - t0, 2)
    log(f"  draft {kind}: " + ", ".join(f"{r}:{v:.3f}" for r, v in zip(tab["requests"], tab["ms"])))
    return tab


def draft_only(
    cfg_path: str, args: argparse.Namespace, device: torch.device, dtype: torch.dtype, info: dict, timer: Timer
) -> dict:
    """--draft-only: the drafter tables alone, at every size of plan.DRAFT_REQUESTS (the dry run
    too, at a 64-token context), kinds in --draft-kinds order. The target is built with one decoder
    layer (the drafters read its embedding, final norm, LM head, RoPE tables and KV pool, never its
    layers) and the pool of a profile run (--pool-gib). One run per process is appended to
    OUT/drafts-<model>.json, rewritten after every size, so a process cut short keeps what it
    timed; validator.gpu.refit --drafts merges the files into the shipped profiles."""
    cfg = json.loads(Path(cfg_path).read_text())
    name = model_name(cfg, cfg_path)
    if args.dry_run:
        cfg = {**cfg, **DRY_CFG}
    dims = model_dims(cfg)
    kinds = [k.strip() for k in args.draft_kinds.split(",") if k.strip()]
    bad = [k for k in kinds if k not in DRAFT_ORDER]
    if bad or not kinds:
        raise InputError(f"--draft-kinds {args.draft_kinds!r}: kinds are {', '.join(DRAFT_ORDER)}")
    stop_at = args.stop_at if args.stop_at > 0 else None
    t0 = time.time()
    vocab = EAGLE3_DRAFT_VOCAB if not args.dry_run else 500
    model: Any = M.Model(cfg, device, dtype, layers=1, pool_gib=args.pool_gib if not args.dry_run else 0.05)
    drafters: Any = M.Drafters(model, BLOCK_LAYERS, vocab)
    if device.type == "cuda":
        torch.cuda.synchronize()
    build_s = time.time() - t0
    log(f"[{name}] drafters built in {build_s:.1f}s (target: 1 layer, pool {model.pool_tokens} tokens)")
    ctx = DRAFT_CTX if not args.dry_run else 64
    reqs = list(DRAFT_REQUESTS)
    t0 = time.time()
    warm_n = 0
    if args.draft_warmup_s > 0:  # the GPU busy (clocks up) before the first size, as after a sweep
        R = reqs[-1]
        wm = M.StepMeta(uniform_step(R, BLOCK_K, ctx), R * BLOCK_K, dims, device)
        while time.time() - t0 < args.draft_warmup_s:
            timer(lambda: drafters.run("block", wm, BLOCK_K), graph=True)
            warm_n += 1
        del wm
    warmup_s = time.time() - t0
    path = Path(args.out) / f"drafts-{name}.json"
    doc: dict[str, Any] = dict(format=DRAFT_FORMAT, model=name, model_config=repo_relative(cfg_path), runs=[])
    if path.exists():
        old = json.loads(path.read_text())
        if old.get("format") != DRAFT_FORMAT or old.get("model") != name:
            raise InputError(f"{path}: not a {DRAFT_FORMAT} file of {name}")
        doc["runs"] = list(old.get("runs", []))
    run: dict[str, Any] = dict(
        process=len(doc["runs"]) + 1,
        date=str(dt.date.today()),
        started_unix=round(T_MAIN, 1),
        info=info,
        command=repo_relative("python3 -m validator.gpu.profile " + " ".join(shlex.quote(a) for a in args.argv)),
        job=os.environ.get("DSIM_GPU_JOB", ""),
        dry_run=bool(args.dry_run),
        reps=int(args.reps),
        warm=int(timer.warm),
        context=ctx,
        block_k=BLOCK_K,
        block_layers=BLOCK_LAYERS,
        eagle3_draft_vocab=vocab,
        split=dict(M.SPLIT),
        attention_impl=M.ATTENTION_IMPL["impl"],
        target_layers_built=1,
        build_s=round(build_s, 2),
        warmup=dict(kind="block", requests=reqs[-1], seconds=round(warmup_s, 2), graphs=warm_n),
        kinds=kinds,
        tables={},
        stopped=None,
    )
    doc["runs"].append(run)

    def save(kind: str | None = None, tab: dict | None = None) -> None:
        if kind is not None:
            run["tables"][kind] = dict(tab or {})
        run["elapsed_s"] = round(time.time() - T_MAIN, 2)
        write_text_atomic(path, json.dumps(doc, indent=1))

    save()
    for kind in kinds:
        tab = draft_table(drafters, kind, reqs, ctx, dims, device, timer, lambda t: save(kind, t), stop_at)
        save(kind, tab)
        if not tab["complete"]:
            run["stopped"] = f"deadline in {kind} after {len(tab['requests'])} of {len(reqs)} sizes"
            save()
            break
    log(f"[{name}] drafts {','.join(run['tables'])} in {time.time() - t0:.1f}s -> {path}")
    model = drafters = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return doc


def profile_model(
    cfg_path: str,
    args: argparse.Namespace,
    device: torch.device,
    dtype: torch.dtype,
    info: dict,
    timer: Timer,
    probe: dict,
) -> dict:
    cfg = json.loads(Path(cfg_path).read_text())
    name = model_name(cfg, cfg_path)
    if args.dry_run:
        cfg = {**cfg, **DRY_CFG}
    dims = model_dims(cfg)
    layers = args.layers or dims["layers"]
    t0 = time.time()
    pool_gib = args.pool_gib if not args.dry_run else 0.05
    model: Any = M.Model(cfg, device, dtype, layers=layers, pool_gib=pool_gib)
    if args.compile_dense:
        M.compile_dense(model)
    drafters: Any = M.Drafters(model, BLOCK_LAYERS, EAGLE3_DRAFT_VOCAB if not args.dry_run else 500)
    if device.type == "cuda":
        torch.cuda.synchronize()
    log(
        f"[{name}] built {layers}/{dims['layers']} layers in {time.time() - t0:.1f}s, "
        f"pool {model.pool_tokens} tokens/layer-region"
    )
    caps = vllm_capture_sizes(CAPTURE_LIMIT)
    tails = tail_sizes(CAPTURE_LIMIT)
    if args.dry_run:
        plan = sweep_plan(caps, tails, contexts=(64, 256), kv_budget_tokens=20000, quick=True, table_ctx=32)
    else:
        plan = sweep_plan(caps, tails, kv_budget_tokens=int(model.pool_tokens * 0.95), quick=args.quick)
    depth_scale = dims["layers"] / layers
    points, shapes = [], []
    t0 = time.time()
    for i, shape in enumerate(plan):
        if args.dry_run and shape.n > 1536:
            continue
        n_pad = padded_tokens(shape.n, caps)
        m = M.StepMeta(shape, n_pad, dims, device)
        graph = n_pad <= CAPTURE_LIMIT or not args.eager_tails
        ms, reps = timer(lambda: model.forward(m), graph=graph)
        dec, pre = step_terms(shape.q, shape.ctx)
        p = dict(
            tag=shape.tag,
            n=n_pad,
            n_real=shape.n,
            kv=shape.kv,
            R=shape.requests,
            s=max(shape.q),
            ctx=max(shape.ctx),
            ctx_min=min(shape.ctx),
            chunks=int(m.n_chunks),
            graph=graph,
            mode=m.mode,
            ms=ms * depth_scale,
            reps=[round(r, 4) for r in reps],
            fit=shape.tag not in FIT_EXCLUDE,
            dec=dec,
            pre=round(pre, 6),
            shape_q=list(shape.q),
            shape_ctx=list(shape.ctx),
        )
        points.append(p)
        shapes.append(shape)
        if i % 20 == 0 or shape.tag != "table":
            log(
                f"  {shape.tag:12s} n={n_pad:5d} R={shape.requests:4d} s={max(shape.q)} ctx={max(shape.ctx):6d} "
                f"kv={shape.kv:8d} {'graph' if graph else 'eager'} {m.mode or 'prefill'}: {ms:8.3f} ms"
            )
    log(f"[{name}] sweep {len(points)} points in {time.time() - t0:.1f}s (SM clock now {sm_clock_mhz(device)} MHz)")
    fit = fit_step_model(points)
    log(f"[{name}] fit: kv_ms_per_ktok={fit['kv_ms_per_ktok']:.5f} residuals {fit['residual_pct']}")
    fit["kv_ms_per_ktok_by_window_n128"] = kv_slope_by_window(points)
    log(f"[{name}] KV ms per 1000 tokens by window (n=128, 1K->8K): {fit['kv_ms_per_ktok_by_window_n128']}")
    # drafts
    draft = {}
    t0 = time.time()
    reqs = DRAFT_REQUESTS if not args.dry_run else [1, 2, 4, 8]
    for kind in ("mtp", "eagle3", "block", "dspark"):
        tab = draft_table(drafters, kind, reqs, DRAFT_CTX if not args.dry_run else 64, dims, device, timer)
        draft[kind] = dict(requests=tab["requests"], ms=tab["ms"])
    log(f"[{name}] drafts in {time.time() - t0:.1f}s")
    weights_gib = (dims["params"] * 2) / 2**30
    kv_cache_gib = 0.9 * info["mem_gib"] - weights_gib
    cmd = repo_relative("python3 -m validator.gpu.profile " + " ".join(shlex.quote(a) for a in sys.argv[1:]))
    prov = dict(
        kind="measured",
        hardware=info["gpu"],
        gpus_per_replica=1,
        model=name,
        engine="dsim validator/gpu executor: PyTorch eager decoder layers under CUDA graphs "
        "(vLLM-like capture sizes and padding"
        + (", eager tails" if args.eager_tails else ", tails captured unpadded")
        + "), random bf16 weights",
        engine_version=f"torch {info['torch']}, CUDA {info['cuda']}",
        date=str(dt.date.today()),
        method=(
            f"one forward step of n tokens over R requests, {args.reps} replays, median; "
            f"CUDA graphs at vLLM capture sizes (<= {CAPTURE_LIMIT}, steps padded to the next size); "
            + (
                f"eager tails {tails}; "
                if args.eager_tails
                else f"steps above the limit (tails {tails}) also captured, unpadded, so they time the GPU "
                "work and not this Python executor's kernel launches (~50 per layer, CPU-bound up to "
                "~1500 tokens eagerly; a serving engine's compiled path is GPU-bound there); "
            )
            + f"{layers} of {dims['layers']} layers measured"
            + (f" and scaled x{depth_scale:g} to full depth" if depth_scale != 1 else " (full depth)")
            + "; LM head on every decode/verify token and the last token of each prefill chunk; "
            "sweep: the forward table on steps shaped like dsim's DSpark steps at the "
            f"concurrency that runs n tokens (request tiers {list(TABLE_TIERS)}: n <= 8 one request "
            "with an n-token verify window at 1K context, 16 < n <= 256 32 requests, 256 < n <= 512 "
            "256 requests, windows 1..8 from dsim's DSpark mix, contexts at the quantiles of dsim's "
            "log-normal context mix), tails as 256-request verify steps and busy chunked-prefill "
            "steps (256 or 32 verify requests + whole prompts); uniform context series (n 32/128/512 x "
            "windows 1/2/4/8 x 1K/8K/32K) fitted with an intercept of their own (KV slope only); "
            "fit step_ms = F(n) + kv_ms_per_ktok * kv/1000 + a * decode tokens/1000 + beta * prefill "
            "pairs/1e6 (relative least squares, one F per n; a prefill chunk of q tokens over c cached "
            "has q (c + q/2) causal-attention pairs); the forward table is priced for decode tokens, "
            "F(n) + a n/1000, and a, beta are the profile's prefill_terms (discount, attention); "
            f"tags {list(FIT_EXCLUDE)} measured and reported, not fitted)"
        ),
        command=cmd,
        driver=info["driver"],
        gpu_memory_gib=info["mem_gib"],
        cuda=info["cuda"],
        torch=info["torch"],
        kernels=dict(
            linears="torch matmul (cuBLAS) bf16, fused QKV and gate/up projections",
            norms="torch.nn.functional.rms_norm",
            rope="eager torch (neox rotate-half)",
            attention_decode=(
                "folded GQA x query tokens: the query heads of a KV group and the request's "
                "new tokens folded into one query block per KV head (one CTA per KV head and "
                "chunk). Prefix: one aten._flash_attention_forward varlen call, each sequence a "
                "chunk of a request's prefix with its real rows only; continuous split "
                f"(FlashInfer-like load balancing, {json.dumps(M.SPLIT)}): one chunk length L "
                "per step, L = max(min_chunk, min(total KV / ceil(fill x SMs / kv_heads), "
                "balance x mean context)), every request cut into L-token chunks plus its "
                "remainder; exact logsumexp merge on every step (chunk j of a request into slot j "
                "of a [max chunks, rows] grid, one reduction over the slots, no atomics). New "
                "tokens: masked band of the step's new keys (unfold "
                "view), scores folded per KV head, one softmax with the prefix logsumexp"
            ),
            attention_prefill="aten._flash_attention_forward causal (bottom-right) over [cache, chunk]"
            + ("" if M.GQA_NATIVE else ", KV heads expanded"),
            kv_write="index_copy_ into a KV pool (distinct region per layer while it fits)",
        ),
        attention_check=probe,
        # the executor path the sweep ran on (kernels.attention_decode describes the split path)
        attention_impl=M.ATTENTION_IMPL["impl"],
        compiled_dense=bool(args.compile_dense),
        draft_method=dict(
            mtp="eh_proj(2h->h) + one decoder layer + full LM head, 1 token per request",
            eagle3=f"fc(3h->h) + one decoder layer on concat(emb, hidden) + LM head over a "
            f"{EAGLE3_DRAFT_VOCAB}-token draft vocab; one sequential step (K steps = K x)",
            block=f"{BLOCK_LAYERS} decoder layers + LM head over R x {BLOCK_K} tokens in one pass",
            dspark=f"block pass + {BLOCK_K} sequential steps of a confidence head (h+1 -> 256 -> 1)",
            context=DRAFT_CTX,
            graphs="CUDA graph per request count",
        ),
        assumptions=dict(
            cpu_overhead_ms="1.5 stated, not measured",
            kv_cache="0.9 x GPU memory - weights (bf16, incl. embedding and LM head)",
            excluded="sampling / rejection sampling, scheduler CPU time, tensor parallelism",
        ),
    )
    if args.dry_run:
        prov["kind"] = "measured"
        prov["dry_run"] = True
    prof = profile_dict(
        name=f"{args.prefix}-{name}",
        provenance=prov,
        kv_cache_gib=kv_cache_gib,
        kv_bytes_per_token=dims["kv_bytes_per_token"],
        caps=caps,
        fit=fit,
        draft=draft,
    )
    if args.dry_run:  # the tiny CPU model's fit need not make a profile dsim accepts
        try:
            cost_model(prof)
        except InputError as e:
            log(f"  dry run: {e}; prefill_terms left out")
            prof.pop("prefill_terms", None)
    if not args.attention_terms:
        prov["attention_terms"] = ATTENTION_MISSING
        log(f"[{name}] WARNING: {ATTENTION_MISSING}")
    raw: dict[str, Any] = dict(
        model=name,
        model_config=repo_relative(cfg_path),
        dims=dims,
        points=points,
        fit=fit,
        attention_check=probe,
        info=info,
    )
    out = Path(args.out)
    yaml_path, raw_path = out / f"{args.prefix}-{name}.yaml", out / f"{args.prefix}-{name}.raw.json"

    def save() -> None:
        write_text_atomic(yaml_path, dump_yaml(prof))
        write_text_atomic(raw_path, json.dumps(raw, default=str))

    save()  # the profile first; replay results are added after each log
    if args.attention_terms:  # the per-request attention terms: three more sweeps, then the fit with them
        budget = int(model.pool_tokens * 0.95) if not args.dry_run else 20000
        files = attention_sweeps(model, cfg_path, dims, device, args.attention_reps, budget, out, name, args.dry_run)
        from validator.gpu import refit as RF

        command = repo_relative(
            "python3 -m validator.gpu.refit "
            + " ".join([str(raw_path), *(f"--context {f}" for f in files)])
            + " --in-place"
        )
        try:
            RF.refit_attention(raw_path, [str(f) for f in files], command, out_dir=out)
        except Exception as e:  # the tiny CPU model's points need not fit (a GPU run's error stops it)
            if not args.dry_run:
                raise
            log(f"  dry run: {e}; attention terms left out")
        import yaml

        prof = yaml.safe_load(yaml_path.read_text())
        raw = json.loads(raw_path.read_text())
        if args.dry_run:
            try:
                cost_model(prof)
            except InputError as e:
                log(f"  dry run: {e}; attention terms left out")
                prof.pop("attention", None), prof.pop("format_version", None)
        prof["provenance"]["attention_terms"] = (
            "measured in the profiling run (context, request-grid and busy sweeps: "
            + ", ".join(str(Path(f).relative_to(out)) for f in files)
            + ") and fitted with the sweep (provenance.attention_fit)"
        )
        save()
    if args.steplog_cmd:  # dsim writes its step logs from the profile just saved (CPU, subprocess)
        cmd = args.steplog_cmd.format(profile=str((out / f"{args.prefix}-{name}.yaml").resolve()), model=name)
        t0 = time.time()
        proc = subprocess.run(cmd, shell=True, capture_output=True, text=True)
        log(proc.stdout.strip()[-2000:])
        if proc.returncode:
            log(proc.stderr.strip()[-3000:])
            raise RuntimeError(f"step-log command failed ({proc.returncode}): {cmd}")
        log(f"[{name}] step logs in {time.time() - t0:.1f}s")
    if args.replay:
        cost = cost_model(prof)
        rtimer = Timer(device, args.replay_reps, warm=1)  # tails (large steps); graph sizes: the sweep's timer
        all_rows, per_log, results = [], {}, {}
        for src in args.replay:
            src = src.replace("{model}", name)
            steps = load_or_make_steps(src)
            if not args.log_predictions:
                for st in steps:  # predictions from the profile just measured
                    st.pop("predicted_ms", None)
            if args.dry_run:
                steps = dry_run_steps(steps, 12)
            if args.recheck:  # the profile's table points again, in this process, right before
                raw.setdefault("recheck", []).extend(
                    recheck(model, points, shapes, dims, device, timer, caps, depth_scale, src)
                )
            t0 = time.time()
            rows, summary = replay_steps(
                model,
                steps,
                dims,
                device,
                timer,
                caps,
                cost,
                depth_scale,
                eager_tails=args.eager_tails,
                big_timer=rtimer,
            )
            for r in rows:
                r["log"] = Path(src).name
            all_rows += rows
            per_log[Path(src).name] = summary
            results[src] = dict(rows=rows, summary=summary)
            raw["replay"] = dict(rows=all_rows, summary=error_summary(all_rows), logs=per_log)
            prof["replay_check"] = dict(
                steplogs=list(per_log),
                summary=per_log,
                note=(
                    "step logs written by dsim simulate with this profile (predicted_ms: dsim's own "
                    "forward-only cost), replayed in the profiling process right after the sweep "
                    "(same model, same timer for steps <= the capture limit)"
                )
                if args.log_predictions
                else (
                    "predicted from this profile's staircase (forward only), measured by replaying "
                    "the exact step shapes on the same executor"
                ),
            )
            save()
            if args.replay_out:
                write_text_atomic(
                    Path(args.replay_out) / f"replay-{name}.json",
                    json.dumps(
                        dict(
                            model=cfg_path,
                            profile=f"{args.prefix}-{name}.yaml",
                            in_process=True,
                            eager_tails=args.eager_tails,
                            log_predictions=args.log_predictions,
                            split=M.SPLIT,
                            logs=results,
                        ),
                        indent=1,
                    ),
                )
            log(f"[{name}] replay {src} ({time.time() - t0:.1f}s): {json.dumps(summary)}")
    model = drafters = None
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return prof


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="HF-style config.json (repeatable)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument(
        "--prefix",
        default="",
        help="profile name prefix (default: the measuring GPU's, plan.gpu_prefix: h100, h200, ...; dry for --dry-run)",
    )
    ap.add_argument(
        "--attention-reps",
        type=int,
        default=3,
        help="timed replays per step of the attention sweeps (reps - 2, at least 2, above the capture limit; the "
        "H200 profiles' context sweeps were timed with 3)",
    )
    ap.add_argument(
        "--no-attention-terms",
        dest="attention_terms",
        action="store_false",
        help="skip the context, request-grid and busy sweeps (about a third more GPU time): a format-1 profile "
        "without the per-request attention terms, flagged in its provenance (attention_terms)",
    )
    ap.add_argument("--layers", type=int, default=0, help="layers to build (0: full depth)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pool-gib", type=float, default=24.0)
    ap.add_argument("--quick", action="store_true", help="reduced sweep")
    ap.add_argument("--dry-run", action="store_true", help="tiny model on the CPU")
    ap.add_argument(
        "--replay",
        action="append",
        default=[],
        help="'synthetic' or a step log (JSONL) to replay after profiling, predictions from the "
        "new profile; '{model}' is replaced by the model name (repeatable)",
    )
    ap.add_argument("--replay-reps", type=int, default=3, help="timed replays per replayed step (median)")
    ap.add_argument(
        "--eager-tails",
        action="store_true",
        help="run steps above the capture limit eagerly (default: captured, unpadded)",
    )
    ap.add_argument("--no-attn-bench", action="store_true")
    ap.add_argument(
        "--attention-impl",
        default="split",
        choices=M.ATTENTION_IMPLS,
        help="the executor's attention path (recorded in the profile's provenance)",
    )
    ap.add_argument(
        "--compile-dense",
        action="store_true",
        help="the layers' dense parts through torch.compile (model.compile_dense; recorded in the profile's "
        "provenance; not the --draft-only tables)",
    )
    ap.add_argument(
        "--split",
        default="auto",
        help="decode split-KV settings: auto (timed by the probe) or continuous[:fill=F,balance=B,min_chunk=N]",
    )
    ap.add_argument(
        "--steplog-cmd",
        default="",
        help="shell command run after the profile is written ({profile}: its path, {model}: "
        "the model name), e.g. dsim writing step logs from it; then --replay runs",
    )
    ap.add_argument(
        "--log-predictions",
        action="store_true",
        help="replay: keep the step logs' own predicted_ms (dsim's) instead of the staircase",
    )
    ap.add_argument(
        "--recheck",
        action="store_true",
        help="replay: re-time the sweep's table points at RECHECK_N before each log (drift report)",
    )
    ap.add_argument("--replay-out", default="", help="folder for replay-<model>.json (rows per log)")
    ap.add_argument(
        "--draft-only",
        action="store_true",
        help="time the drafter tables alone at every size of plan.DRAFT_REQUESTS: one run appended to "
        "OUT/drafts-<model>.json per model (no probe, sweep or fit; needs --split continuous:...)",
    )
    ap.add_argument(
        "--draft-kinds", default=",".join(DRAFT_ORDER), help="--draft-only: kinds in the order timed (comma-separated)"
    )
    ap.add_argument(
        "--draft-warmup-s",
        type=float,
        default=-1.0,
        help="--draft-only: seconds of the block drafter at 512 requests before the tables (default 3 on the GPU, 0 dry)",
    )
    ap.add_argument(
        "--stop-at",
        type=float,
        default=0.0,
        help="--draft-only: no drafter size is started after this time (Unix seconds, e.g. $(date +%%s) + limit; 0: none)",
    )
    args = ap.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    M.ATTENTION_IMPL["impl"] = args.attention_impl
    global T_MAIN
    T_MAIN = time.time()
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    if not args.dry_run:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    info = gpu_info(device)
    info = {k: (v if isinstance(v, (int, float)) else str(v)) for k, v in info.items()}
    log(f"device: {json.dumps(info)}")
    if not args.prefix:
        args.prefix = gpu_prefix(str(info["gpu"]))
    timer = Timer(device, args.reps)
    if args.draft_only:
        sp = parse_split(args.split)
        if sp is None:
            raise SystemExit("error: --draft-only needs --split continuous:... (the profiles' recorded split)")
        if device.type == "cuda":
            M.SPLIT["sms"] = int(info.get("sms", M.SPLIT["sms"]))
        M.SPLIT.update(M.split_settings(sp))
        if args.draft_warmup_s < 0:
            args.draft_warmup_s = 0.0 if args.dry_run else 3.0
        log(f"split policy: {json.dumps(M.SPLIT)}")
        for path in args.model:
            t0 = time.time()
            try:
                draft_only(path, args, device, dtype, info, timer)
            except InputError as e:
                raise SystemExit(f"error: {e}") from None
            log(f"== {path} drafts done in {time.time() - t0:.1f}s")
        return
    cfg0 = json.loads(Path(args.model[0]).read_text())
    if args.dry_run:
        cfg0 = {**cfg0, **DRY_CFG}
    if device.type == "cuda":
        M.SPLIT["sms"] = int(info.get("sms", M.SPLIT["sms"]))
    t0 = time.time()
    sp = parse_split(args.split)
    tune = None
    if sp is None:
        tune = split_tune(device, dtype, timer, model_dims(cfg0))
        sp = SPLIT_CANDIDATES[tune["chosen"]]
    M.SPLIT.update(M.split_settings(sp))
    log(f"split policy ({time.time() - t0:.1f}s): {json.dumps(M.SPLIT)}")
    t0 = time.time()
    probe = attention_probe(device, dtype, timer, model_dims(cfg0), bench=not args.no_attn_bench)
    probe["split"] = dict(M.SPLIT)
    if tune:
        probe["split_tune"] = tune
    log(f"attention probe ({time.time() - t0:.1f}s): {json.dumps(probe)}")
    for path in args.model:
        t0 = time.time()
        profile_model(path, args, device, dtype, info, timer, probe)
        log(f"== {path} done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
