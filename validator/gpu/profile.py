"""GPU step-cost profiler: writes dsim profile YAML files measured on this GPU.

    python3 -m validator.gpu.profile --model profiles/models/llama-3.1-8b.json \
        [--model ...] --out $OUT [--replay synthetic|STEPLOG ...] [--quick] [--dry-run] [--eager-tails]

Needs torch + numpy (yaml optional). --dry-run runs a tiny model on the CPU (float32) with a small
sweep: it checks the whole pipeline, its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from validator.gpu import model as M
from validator.gpu.plan import (BLOCK_K, BLOCK_LAYERS, CAPTURE_LIMIT, DRAFT_CTX, DRAFT_REQUESTS,
                                EAGLE3_DRAFT_VOCAB, FIT_EXCLUDE, Staircase, StepShape, dump_yaml,
                                fit_step_model, hetero_step, model_dims, model_name, padded_tokens,
                                profile_dict, sweep_plan, tail_sizes, uniform_step, vllm_capture_sizes,
                                write_text_atomic)

DRY_CFG = dict(hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
               intermediate_size=256, vocab_size=1000, num_hidden_layers=2)


def log(*a):
    print(*a, flush=True)


class Timer:
    def __init__(self, device, reps, warm=2):
        self.cuda = device.type == "cuda"
        self.reps = reps
        self.warm = warm
        self.pool = None   # private pool per graph, freed with the graph

    def __call__(self, fn, graph=True):
        if self.cuda:
            return M.time_fn(fn, reps=self.reps, graph=graph, pool=self.pool, warm=self.warm)
        fn()
        ts = []
        for _ in range(self.reps):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e3)
        return sorted(ts)[len(ts) // 2], ts


def gpu_info(device) -> dict:
    if device.type != "cuda":
        return dict(gpu="cpu (dry run)", driver="n/a", torch=str(torch.__version__), cuda="n/a", mem_gib=16.0)
    p = torch.cuda.get_device_properties(0)
    try:
        drv = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
    except Exception as e:   # pragma: no cover
        drv = f"unknown ({e})"
    return dict(gpu=torch.cuda.get_device_name(0), driver=drv, torch=torch.__version__,
                cuda=torch.version.cuda, mem_gib=round(p.total_memory / 2**30, 2), sms=p.multi_processor_count)


# ---------------------------------------------------------------- attention probe
def attention_probe(device, dtype, timer, cfg_dims, bench=True) -> dict:
    """Correctness of the GPU attention paths against a float64 reference, and the attention time
    at q = 1, 2, 4, 8 at 8K context (256 requests) vs SDPA enable_gqa and the KV-read floor."""
    out = {}
    H, kv, d = cfg_dims["heads"], cfg_dims["kv_heads"], cfg_dims["head_dim"]
    dims = dict(heads=H, kv_heads=kv, head_dim=d, vocab=100)
    rng = np.random.default_rng(0)
    cases = {
        "dense_verify": StepShape((1, 3, 8, 5), (300, 300, 300, 300)),
        "varlen_verify": StepShape(tuple(int(x) for x in rng.integers(1, 9, 20)),
                                   tuple(int(x) for x in rng.integers(50, 5000, 20))),
        "varlen_verify_prefill": StepShape(tuple(int(x) for x in rng.integers(1, 9, 17)) + (40,),
                                           tuple(int(x) for x in rng.integers(1, 3000, 17)) + (700,)),
        "prefill_ctx": StepShape((2, 4, 64), (150, 150, 128)),
    }
    for name, shape in cases.items():
        for attempt in range(2):
            try:
                m = M.StepMeta(shape, shape.n, dims, device)
                pk = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
                pv = torch.randn(m.region_tokens, kv, d, device=device, dtype=dtype)
                x = torch.randn(m.n_pad, H + 2 * kv, d, device=device, dtype=dtype) * 0.3
                pk.index_copy_(0, m.slot, x[:, H:H + kv])
                pv.index_copy_(0, m.slot, x[:, H + kv:])
                a = M.attention(x, (pk, pv), m).double().cpu()
                r = M.reference_attention(x.cpu(), (pk.cpu(), pv.cpu()), M.StepMeta(shape, shape.n, dims, "cpu"))
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
    pk = torch.randn(R * L + R * 8 + 1, kv, d, device=device, dtype=dtype)
    pv = torch.randn_like(pk)
    floor_bytes = 2 * R * L * kv * d * 2
    res = {}
    for s in (1, 2, 4, 8):
        m = M.StepMeta(uniform_step(R, s, L), R * s, dims, device)
        x = torch.randn(m.n_pad, H + 2 * kv, d, device=device, dtype=dtype)
        ms, _ = timer(lambda: M.attention(x, (pk, pv), m))
        q4 = torch.randn(R, H, s, d, device=device, dtype=dtype)
        k4 = pk[:R * L].view(R, L, kv, d).transpose(1, 2)
        v4 = pv[:R * L].view(R, L, kv, d).transpose(1, 2)
        try:
            sd, _ = timer(lambda: torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, enable_gqa=True))
        except Exception as e:
            sd = f"failed: {str(e)[:80]}"
        res[f"q{s}"] = dict(ours_ms=round(ms, 4), sdpa_enable_gqa_ms=sd if isinstance(sd, str) else round(sd, 4),
                            mode=m.mode)
        log(f"  attention R={R} L={L} q={s}: ours {ms:.3f} ms, sdpa enable_gqa {sd} ms")
    del pk, pv
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
    for R in ((32, 256) if device.type == "cuda" else (16,)):
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
            del pk, pv
        row["hetero_over_uniform"] = round(row["hetero"]["ms"] / row["uniform"]["ms"], 3)
        het[f"R{R}"] = row
        log(f"  attention hetero vs uniform R={R}: {json.dumps(row)}")
    res["hetero_vs_uniform"] = het
    res["requests"], res["context"] = R, L
    out["bench"] = res
    torch.cuda.empty_cache() if device.type == "cuda" else None
    return out


# ---------------------------------------------------------------- per-model profiling
def profile_model(cfg_path: str, args, device, dtype, info, timer, probe) -> dict:
    cfg = json.loads(Path(cfg_path).read_text())
    name = model_name(cfg, cfg_path)
    if args.dry_run:
        cfg = {**cfg, **DRY_CFG}
    dims = model_dims(cfg)
    layers = args.layers or dims["layers"]
    t0 = time.time()
    pool_gib = args.pool_gib if not args.dry_run else 0.05
    model = M.Model(cfg, device, dtype, layers=layers, pool_gib=pool_gib)
    drafters = M.Drafters(model, BLOCK_LAYERS, EAGLE3_DRAFT_VOCAB if not args.dry_run else 500)
    if device.type == "cuda":
        torch.cuda.synchronize()
    log(f"[{name}] built {layers}/{dims['layers']} layers in {time.time() - t0:.1f}s, "
        f"pool {model.pool_tokens} tokens/layer-region")
    caps = vllm_capture_sizes(CAPTURE_LIMIT)
    tails = tail_sizes(CAPTURE_LIMIT)
    if args.dry_run:
        plan = sweep_plan(caps, tails, contexts=(64, 256), kv_budget_tokens=20000, quick=True,
                          table_ctx=32)
    else:
        plan = sweep_plan(caps, tails, kv_budget_tokens=int(model.pool_tokens * 0.95), quick=args.quick)
    depth_scale = dims["layers"] / layers
    points = []
    t0 = time.time()
    for i, shape in enumerate(plan):
        if args.dry_run and shape.n > 1536:
            continue
        n_pad = padded_tokens(shape.n, caps)
        m = M.StepMeta(shape, n_pad, dims, device)
        graph = n_pad <= CAPTURE_LIMIT or not args.eager_tails
        ms, reps = timer(lambda: model.forward(m), graph=graph)
        p = dict(tag=shape.tag, n=n_pad, n_real=shape.n, kv=shape.kv, R=shape.requests, s=max(shape.q),
                 ctx=max(shape.ctx), ctx_min=min(shape.ctx), chunks=int(m.n_chunks), graph=graph,
                 mode=m.mode, ms=ms * depth_scale, reps=[round(r, 4) for r in reps],
                 fit=shape.tag not in FIT_EXCLUDE)
        points.append(p)
        if i % 20 == 0 or shape.tag != "table":
            log(f"  {shape.tag:12s} n={n_pad:5d} R={shape.requests:4d} s={max(shape.q)} ctx={max(shape.ctx):6d} "
                f"kv={shape.kv:8d} {'graph' if graph else 'eager'} {m.mode or 'prefill'}: {ms:8.3f} ms")
    log(f"[{name}] sweep {len(points)} points in {time.time() - t0:.1f}s")
    fit = fit_step_model(points)
    log(f"[{name}] fit: kv_ms_per_ktok={fit['kv_ms_per_ktok']:.5f} residuals {fit['residual_pct']}")
    # drafts
    draft = {}
    t0 = time.time()
    reqs = DRAFT_REQUESTS if not args.dry_run else [1, 2, 4, 8]
    for kind in ("mtp", "eagle3", "block", "dspark"):
        vals = []
        for R in reqs:
            s = BLOCK_K if kind in ("block", "dspark") else 1
            m = M.StepMeta(uniform_step(R, s, DRAFT_CTX if not args.dry_run else 64), R * s, dims, device)
            ms, _ = timer(lambda: drafters.run(kind, m, BLOCK_K), graph=True)
            vals.append(ms)
        draft[kind] = dict(requests=reqs, ms=vals)
        log(f"  draft {kind}: " + ", ".join(f"{r}:{v:.3f}" for r, v in zip(reqs, vals)))
    log(f"[{name}] drafts in {time.time() - t0:.1f}s")
    weights_gib = (dims["params"] * 2) / 2**30
    kv_cache_gib = 0.9 * info["mem_gib"] - weights_gib
    cmd = "python3 -m validator.gpu.profile " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    prov = dict(
        kind="measured", hardware=info["gpu"], gpus_per_replica=1, model=name,
        engine="dsim validator/gpu executor: PyTorch eager decoder layers under CUDA graphs "
               "(vLLM-like capture sizes and padding" + (", eager tails" if args.eager_tails else
                                                         ", tails captured unpadded") + "), random bf16 weights",
        engine_version=f"torch {info['torch']}, CUDA {info['cuda']}",
        date=str(dt.date.today()),
        method=(f"one forward step of n tokens over R requests, {args.reps} replays, median; "
                f"CUDA graphs at vLLM capture sizes (<= {CAPTURE_LIMIT}, steps padded to the next size); "
                + (f"eager tails {tails}; " if args.eager_tails else
                   f"steps above the limit (tails {tails}) also captured, unpadded, so they time the GPU "
                   "work and not this Python executor's kernel launches (~50 per layer, CPU-bound up to "
                   "~1500 tokens eagerly; a serving engine's compiled path is GPU-bound there); ")
                + f"{layers} of {dims['layers']} layers measured"
                + (f" and scaled x{depth_scale:g} to full depth" if depth_scale != 1 else " (full depth)")
                + "; LM head on every decode/verify token and the last token of each prefill chunk; "
                  "sweep: uniform decode tables, context points, DSpark-like heterogeneous verify steps "
                  "(mixed windows 1..8, log-normal contexts), chunked-prefill mixes above the limit; "
                  "fit step_ms = F(n) + kv_ms_per_ktok * kv/1000 (relative least squares, one F per n; "
                  f"tags {list(FIT_EXCLUDE)} measured but not fitted)"),
        command=cmd, driver=info["driver"], gpu_memory_gib=info["mem_gib"], cuda=info["cuda"],
        torch=info["torch"],
        kernels=dict(
            linears="torch matmul (cuBLAS) bf16, fused QKV and gate/up projections",
            norms="torch.nn.functional.rms_norm", rope="eager torch (neox rotate-half)",
            attention_decode=("folded GQA: query heads of a KV group folded into the query-length dim. "
                              "R < 16: dense aten._flash_attention_forward over the prefix padded to the "
                              "longest context + masked new-token scores, logsumexp merge. R >= 16: ragged "
                              f"split-KV: prefixes cut into {M.KV_CHUNK}-token chunks, one varlen flash call "
                              "with each chunk's real query rows only, one causal varlen flash call (native "
                              "GQA) for the new tokens, exact logsumexp merge by scatter_reduce/index_add "
                              "over real rows (no padding to the longest context or largest window)"),
            attention_prefill="aten._flash_attention_forward causal (bottom-right) over [cache, chunk]"
                              + ("" if M.GQA_NATIVE else ", KV heads expanded"),
            kv_write="index_copy_ into a KV pool (distinct region per layer while it fits)"),
        attention_check=probe,
        draft_method=dict(
            mtp="eh_proj(2h->h) + one decoder layer + full LM head, 1 token per request",
            eagle3=f"fc(3h->h) + one decoder layer on concat(emb, hidden) + LM head over a "
                   f"{EAGLE3_DRAFT_VOCAB}-token draft vocab; one sequential step (K steps = K x)",
            block=f"{BLOCK_LAYERS} decoder layers + LM head over R x {BLOCK_K} tokens in one pass",
            dspark=f"block pass + {BLOCK_K} sequential steps of a confidence head (h+1 -> 256 -> 1)",
            context=DRAFT_CTX, graphs="CUDA graph per request count"),
        assumptions=dict(cpu_overhead_ms="1.5 stated, not measured",
                         kv_cache="0.9 x GPU memory - weights (bf16, incl. embedding and LM head)",
                         excluded="sampling / rejection sampling, scheduler CPU time, tensor parallelism"),
    )
    if args.dry_run:
        prov["kind"] = "measured"
        prov["dry_run"] = True
    prof = profile_dict(name=f"{args.prefix}-{name}", provenance=prov, kv_cache_gib=kv_cache_gib,
                        kv_bytes_per_token=dims["kv_bytes_per_token"], caps=caps, fit=fit, draft=draft)
    raw = dict(model=name, points=points, fit=fit, attention_check=probe, info=info)
    out = Path(args.out)

    def save():
        write_text_atomic(out / f"{args.prefix}-{name}.yaml", dump_yaml(prof))
        write_text_atomic(out / f"{args.prefix}-{name}.raw.json", json.dumps(raw, default=str))

    save()          # the profile first; replay results are added after each log
    if args.replay:
        from validator.gpu.plan import error_summary
        from validator.gpu.replay import replay_steps, load_or_make_steps
        sc = Staircase(prof["forward"]["tokens"], prof["forward"]["ms"], prof["kv_ms_per_ktok"], caps[-1])
        rtimer = Timer(device, args.replay_reps, warm=1)
        all_rows, per_log = [], {}
        for src in args.replay:
            src = src.replace("{model}", name)
            steps = load_or_make_steps(src)
            for st in steps:        # predictions from the profile just measured
                st.pop("predicted_ms", None)
            if args.dry_run:
                steps = [s for s in steps if sum(s["q"]) <= 600 and len(s["q"]) <= 32][:12]
                for st in steps:
                    st["ctx"] = [min(c, 200) for c in st["ctx"]]
            t0 = time.time()
            rows, summary = replay_steps(model, steps, dims, device, rtimer, caps, sc, depth_scale,
                                         eager_tails=args.eager_tails)
            for r in rows:
                r["log"] = src
            all_rows += rows
            per_log[src] = summary
            raw["replay"] = dict(rows=all_rows, summary=error_summary(all_rows), logs=per_log)
            prof["replay_check"] = dict(steplogs=list(per_log), summary=per_log,
                                        note="predicted from this profile's staircase (forward only), "
                                             "measured by replaying the exact step shapes on the same "
                                             "executor")
            save()
            log(f"[{name}] replay {src} ({time.time() - t0:.1f}s): {json.dumps(summary)}")
    del model, drafters
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return prof


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", action="append", required=True, help="HF-style config.json (repeatable)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--prefix", default="h200")
    ap.add_argument("--layers", type=int, default=0, help="layers to build (0: full depth)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pool-gib", type=float, default=24.0)
    ap.add_argument("--quick", action="store_true", help="reduced sweep")
    ap.add_argument("--dry-run", action="store_true", help="tiny model on the CPU")
    ap.add_argument("--replay", action="append", default=[],
                    help="'synthetic' or a step log (JSONL) to replay after profiling, predictions from the "
                         "new profile; '{model}' is replaced by the model name (repeatable)")
    ap.add_argument("--replay-reps", type=int, default=3, help="timed replays per replayed step (median)")
    ap.add_argument("--eager-tails", action="store_true",
                    help="run steps above the capture limit eagerly (default: captured, unpadded)")
    ap.add_argument("--no-attn-bench", action="store_true")
    args = ap.parse_args(argv)
    device = torch.device("cpu" if args.dry_run else "cuda")
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    if not args.dry_run:
        torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    info = gpu_info(device)
    info = {k: (v if isinstance(v, (int, float)) else str(v)) for k, v in info.items()}
    log(f"device: {json.dumps(info)}")
    timer = Timer(device, args.reps)
    cfg0 = json.loads(Path(args.model[0]).read_text())
    if args.dry_run:
        cfg0 = {**cfg0, **DRY_CFG}
    t0 = time.time()
    probe = attention_probe(device, dtype, timer, model_dims(cfg0), bench=not args.no_attn_bench)
    log(f"attention probe ({time.time() - t0:.1f}s): {json.dumps(probe)}")
    for path in args.model:
        t0 = time.time()
        profile_model(path, args, device, dtype, info, timer, probe)
        log(f"== {path} done in {time.time() - t0:.1f}s")


if __name__ == "__main__":
    main()
