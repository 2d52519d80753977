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
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

PLANS = {"context": "ctx", "grid": "grid", "busy": "busy"}  # --plan -> attention_sweeps.attention_plan's kind


def main(argv: list[str] | None = None) -> None:
    from validator.gpu.plan import ANCHOR_N

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", default="")
    ap.add_argument("--out", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pool-gib", type=float, default=24.0)
    ap.add_argument(
        "--plan",
        choices=tuple(PLANS),
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
    from validator.gpu.attention_sweeps import attention_plan, sweep_anchors, time_steps
    from validator.gpu.device import run_identity

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
    budget = int(model.pool_tokens * 0.95)
    plan = attention_plan(PLANS[a.plan], budget, parts=a.parts.split(","), quick=a.dry_run)
    anchors = sweep_anchors(budget, a.anchor_tags.split(","), anchor_n, dry_run=a.dry_run)
    time_steps(model, anchors + plan, dims, device, a.reps, a.out, dict(model=a.model, run=run_identity(device)))


if __name__ == "__main__":
    main()
