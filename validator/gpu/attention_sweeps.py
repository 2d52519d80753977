"""The sweeps behind a profile's per-request attention terms: the context sweep, the request grid and
the busy steps (attention_plan), each after anchors re-timed from the profile sweep (sweep_anchors),
timed step by step into OUT/context/{ctx,grid,busy}-<model>.json (time_steps, attention_sweeps).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from dsim.errors import InputError
from validator.gpu import model as M
from validator.gpu.device import log, run_identity
from validator.gpu.fit import step_terms
from validator.gpu.model import Timer
from validator.gpu.plan import (
    ANCHOR_N,
    CAPTURE_LIMIT,
    StepShape,
    busy_plan,
    context_sweep_plan,
    padded_tokens,
    request_grid_plan,
    sweep_plan,
    tail_sizes,
    vllm_capture_sizes,
)
from validator.gpu.profile_files import repo_relative, write_text_atomic

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
