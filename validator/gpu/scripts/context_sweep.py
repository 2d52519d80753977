"""Time the context sweep (plan.context_sweep_plan: unequal decode contexts, prefill chunks over long
cached prefixes; --plan grid: plan.request_grid_plan, request counts at fixed token counts; --plan
busy: plan.busy_plan, busy steps with many decode tokens and short prompt chunks beside decodes,
--parts picks which) and a few of the table's points on the GPU executor, one model per process.

    python3 validator/gpu/scripts/context_sweep.py --model profiles/models/llama-3.1-8b.json \
        --profile profiles/h200/h200-llama-3.1-8b.yaml --out $OUT/ctx-llama-3.1-8b.json [--dry-run]

The split-KV settings are the profile's (provenance.attention_check.split). Every point keeps its
whole shape (q and ctx per request), so the step model's per-request attention features can be
computed from it offline (validator.gpu.refit). The table points ("anchor") re-time steps of the
profile's own sweep: they tie this run to the sweep's absolute level (drift).
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

ANCHOR_N = (1, 8, 64, 256, 512, 2048, 8192)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pool-gib", type=float, default=24.0)
    ap.add_argument(
        "--plan",
        choices=("context", "grid", "busy"),
        default="context",
        help="context: plan.context_sweep_plan (unequal contexts, long prefixes); grid: plan.request_grid_plan "
        "(request counts at fixed token counts); busy: plan.busy_plan (many decode tokens in 4-8K-token steps, "
        "short prompt chunks beside decodes)",
    )
    ap.add_argument("--parts", default="decode,short", help="--plan busy: comma-separated parts of plan.busy_plan")
    ap.add_argument(
        "--anchor-tags",
        default="table,tail-decode",
        help="tags of the sweep's steps re-timed as anchors (at the sizes ANCHOR_N), e.g. add tail-mixed,tail-prefill "
        "for the busy and prompt-only steps at 8192 tokens",
    )
    ap.add_argument(
        "--anchor-n",
        default=",".join(str(n) for n in ANCHOR_N),
        help="token counts of the anchors (the sweep's steps of --anchor-tags at these sizes), e.g. 6144,8192",
    )
    ap.add_argument("--dry-run", action="store_true")
    a = ap.parse_args(argv)
    anchor_n = {int(x) for x in a.anchor_n.split(",") if x}
    import yaml

    from validator.gpu import model as M
    from validator.gpu import plan as P
    from validator.gpu.profile import run_identity

    device, dtype = M.executor_device(a.dry_run)
    if a.profile:
        rec = yaml.safe_load(Path(a.profile).read_text()).get("provenance", {}).get("attention_check", {}).get("split")
        if rec:
            M.SPLIT.update({k: v for k, v in M.split_settings(rec).items() if k != "sms"})
    cfg = json.loads(Path(a.model).read_text())
    if a.dry_run:
        cfg = {**cfg, **P.DRY_CFG}
    dims = P.model_dims(cfg)
    t0 = time.time()
    model = M.Model(cfg, device, dtype, pool_gib=a.pool_gib if not a.dry_run else 0.05)
    print(f"built in {time.time() - t0:.1f}s; split {json.dumps(M.SPLIT)}", flush=True)
    caps = P.vllm_capture_sizes(P.CAPTURE_LIMIT)
    budget = int(model.pool_tokens * 0.95)
    if a.plan == "context":
        plan = P.context_sweep_plan(budget, quick=a.dry_run)
    elif a.plan == "grid":
        plan = P.request_grid_plan(quick=a.dry_run)
    else:
        plan = P.busy_plan(parts=a.parts.split(","), quick=a.dry_run)
    sweep = P.sweep_plan(caps, P.tail_sizes(P.CAPTURE_LIMIT), kv_budget_tokens=budget)
    anchors = [s for s in sweep if s.tag in a.anchor_tags.split(",") and s.n in anchor_n]
    if a.dry_run:
        anchors = [s for s in anchors if s.n <= 64]
        anchors = [P.StepShape(s.q, tuple(min(c, 64) for c in s.ctx), s.tag) for s in anchors]
    run = run_identity(device)
    timer = M.Timer(device, a.reps, warm=1)
    big = M.Timer(device, max(2, a.reps - 2), warm=1)
    points = []
    t0 = time.time()
    for shape in [P.StepShape(s.q, s.ctx, "anchor-" + s.tag) for s in anchors] + plan:
        n_pad = P.padded_tokens(shape.n, caps)
        m = M.StepMeta(shape, n_pad, dims, device)
        tm = big if shape.n > caps[-1] else timer
        ms, reps = tm(functools.partial(model.forward, m), graph=True)
        dec, pre = P.step_terms(shape.q, shape.ctx)
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
                reps=[round(r, 4) for r in reps],
                shape_q=list(shape.q),
                shape_ctx=list(shape.ctx),
            )
        )
        print(
            f"  {shape.tag:16s} n={shape.n:5d} R={shape.requests:4d} kv={shape.kv:8d} "
            f"chunks={m.n_chunks:4d}: {ms:8.3f} ms",
            flush=True,
        )
        P.write_text_atomic(a.out, json.dumps(dict(model=a.model, split=M.SPLIT, run=run, points=points)))
    print(f"context sweep: {len(points)} points in {time.time() - t0:.1f}s", flush=True)


if __name__ == "__main__":
    main()
