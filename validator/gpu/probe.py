"""Before the profile sweep: the attention paths checked against a float64 reference and timed
against SDPA and the KV-read floor (attention_probe), and the decode split-KV settings chosen by
timing the candidates on DSpark-like and uniform steps (split_tune).
"""

from __future__ import annotations

import json
import random
from typing import Any

import numpy as np
import torch

from validator.gpu import model as M
from validator.gpu.device import log
from validator.gpu.model import Timer
from validator.gpu.plan import (
    StepShape,
    hetero_step,
    shaped_step,
    uniform_step,
)


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
