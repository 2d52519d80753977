"""One model's profile: build the executor, time the profile sweep, fit it, time the drafter tables,
write the profile and its raw sweep with their provenance, then the attention sweeps and their fit,
dsim's step logs from the new profile and their replay in the same process (profile_model);
recheck re-times the sweep's table points before each replayed log.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

from dsim.errors import InputError
from validator.gpu import model as M
from validator.gpu.attention_sweeps import attention_sweeps
from validator.gpu.device import log, sm_clock_mhz
from validator.gpu.draft_tables import draft_table
from validator.gpu.fit import cost_model, fit_step_model, kv_slope_by_window, step_terms
from validator.gpu.model import Timer
from validator.gpu.plan import (
    ATTENTION_MISSING,
    BLOCK_K,
    BLOCK_LAYERS,
    CAPTURE_LIMIT,
    DRAFT_CTX,
    DRAFT_REQUESTS,
    DRY_CFG,
    EAGLE3_DRAFT_VOCAB,
    FIT_EXCLUDE,
    TABLE_TIERS,
    StepShape,
    model_dims,
    model_name,
    padded_tokens,
    sweep_plan,
    tail_sizes,
    vllm_capture_sizes,
)
from validator.gpu.profile_files import dump_yaml, profile_dict, repo_relative, write_text_atomic
from validator.gpu.replay import dry_run_steps, load_or_make_steps, replay_steps
from validator.gpu.steplog import error_summary

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
