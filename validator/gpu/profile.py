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
import json
import sys
import time
from pathlib import Path

from dsim.errors import InputError
from validator.gpu.plan import ATTENTION_IMPLS, DRAFT_ORDER, DRY_CFG, gpu_prefix, model_dims


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
        choices=ATTENTION_IMPLS,
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
    args.started_unix = time.time()
    # torch and the executor only now: --help and a bad argument need neither (a CPU machine)
    import torch

    from validator.gpu import model as M
    from validator.gpu.device import gpu_info, log
    from validator.gpu.draft_tables import draft_only
    from validator.gpu.model import Timer, parse_split
    from validator.gpu.probe import SPLIT_CANDIDATES, attention_probe, split_tune
    from validator.gpu.profile_model import profile_model

    M.ATTENTION_IMPL["impl"] = args.attention_impl
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
