"""The drafter tables: one drafter's pass timed at each request count (draft_table), and
`--draft-only`, the tables alone appended as one run per process to OUT/drafts-<model>.json
(draft_only; merged into the shipped profiles by validator.gpu.refit --drafts).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shlex
import time
from pathlib import Path
from typing import Any

import torch

from dsim.errors import InputError
from validator.gpu import model as M
from validator.gpu.device import log, sm_clock_mhz
from validator.gpu.model import Timer
from validator.gpu.plan import (
    BLOCK_K,
    BLOCK_LAYERS,
    DRAFT_CTX,
    DRAFT_FORMAT,
    DRAFT_ORDER,
    DRAFT_REQUESTS,
    DRY_CFG,
    EAGLE3_DRAFT_VOCAB,
    model_dims,
    model_name,
    uniform_step,
)
from validator.gpu.profile_files import repo_relative, write_text_atomic


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
        started_unix=round(args.started_unix, 1),
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
        run["elapsed_s"] = round(time.time() - args.started_unix, 2)
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
