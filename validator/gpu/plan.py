"""Pure-Python parts of the GPU profiler: sweep plan, fit, tables, profile dicts, step logs.

Imports only the standard library and numpy (yaml if present), so it runs on the lent GPU machine
(torch + numpy, no dsim dependencies) and in CPU tests. Nothing here imports dsim.
"""
from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAX_BATCHED_TOKENS = 8192
CAPTURE_LIMIT = 512
PREFILL_MIN_Q = 17          # a request with more query tokens than 16 is a prefill chunk
DRAFT_REQUESTS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
DRAFT_CTX = 1024            # context the draft tables are measured at (stated, not modelled)
BLOCK_K = 8                 # block drafter: tokens drafted in parallel per request
BLOCK_LAYERS = 3            # block drafter depth
EAGLE3_DRAFT_VOCAB = 32000  # EAGLE-3 heads use a reduced draft vocabulary


def vllm_capture_sizes(max_capture: int = CAPTURE_LIMIT) -> list[int]:
    """vLLM's default CUDA-graph capture sizes (same rule as dsim.cost.vllm_capture_sizes)."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, max_capture + 1, 16))
    return [s for s in sizes if s <= max_capture]


def tail_sizes(limit: int = CAPTURE_LIMIT, max_tokens: int = MAX_BATCHED_TOKENS) -> list[int]:
    """vLLM adaptive-verification tail sizes: 1.5 x limit, then doubling, capped at max_tokens."""
    out, x = [], int(1.5 * limit)
    while x < max_tokens:
        out.append(x)
        x *= 2
    out.append(max_tokens)
    return out


def median(xs) -> float:
    xs = sorted(float(x) for x in xs)
    if not xs:
        raise ValueError("median of nothing")
    m = len(xs) // 2
    return xs[m] if len(xs) % 2 else 0.5 * (xs[m - 1] + xs[m])


# ---------------------------------------------------------------- model shapes
def model_dims(cfg: dict) -> dict:
    h = int(cfg["hidden_size"])
    nh = int(cfg["num_attention_heads"])
    nkv = int(cfg.get("num_key_value_heads", nh))
    hd = int(cfg.get("head_dim") or h // nh)
    L = int(cfg["num_hidden_layers"])
    inter = int(cfg["intermediate_size"])
    V = int(cfg["vocab_size"])
    qk_norm = cfg.get("model_type", "").startswith("qwen3")
    layer_params = h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * inter + 2 * h
    return dict(hidden=h, heads=nh, kv_heads=nkv, head_dim=hd, layers=L, inter=inter, vocab=V,
                qk_norm=qk_norm, layer_params=layer_params,
                params=L * layer_params + 2 * V * h + h,
                kv_bytes_per_token=L * 2 * nkv * hd * 2,
                kv_bytes_per_token_layer=2 * nkv * hd * 2)


def model_name(cfg: dict, path: str = "") -> str:
    return cfg.get("_name") or Path(path).stem


# ---------------------------------------------------------------- steps and the sweep
@dataclass(frozen=True)
class StepShape:
    """One engine step: per request, query tokens and KV context before the step."""
    q: tuple
    ctx: tuple
    tag: str = ""

    @property
    def n(self) -> int:
        return int(sum(self.q))

    @property
    def kv(self) -> int:
        """KV tokens the step's attention reads: context after the step's new tokens."""
        return int(sum(c + q for q, c in zip(self.q, self.ctx)))

    @property
    def requests(self) -> int:
        return len(self.q)


def uniform_step(R: int, s: int, ctx: int, tag: str = "") -> StepShape:
    return StepShape(tuple([s] * R), tuple([ctx] * R), tag)


def padded_tokens(n: int, caps: list[int]) -> int:
    """Token count the graph runs with: the next capture size at or above n (n above the limit: n)."""
    for c in caps:
        if c >= n:
            return c
    return n


# Verify windows (query tokens per request, 1..8) and contexts of dsim's DSpark steps on the default
# mixed trace (validator/gpu/steplogs, concurrency 32 and 256, pooled): the heterogeneous shapes the
# profile must cover. Context: log-normal, median 1050, geometric sd 1.76 (5th-95th pct 430-2730).
DSPARK_WINDOW_P = (0.156, 0.288, 0.285, 0.131, 0.063, 0.041, 0.025, 0.012)
HETERO_REQUESTS = (16, 24, 32, 48, 64, 96, 128, 160, 192, 256)
FIT_EXCLUDE = ("tail-prefill",)   # measured and reported, not fitted (see fit_step_model)
TAIL_DECODE_MAX_REQUESTS = 256    # pure-decode tail points only up to this many requests (8 tokens each)


def hetero_step(R: int, rng: random.Random, ctx_median: float = 1050.0, ctx_gsd: float = 1.76,
                target_n: int | None = None, tag: str = "hetero") -> StepShape:
    """A decode/verify step like dsim's DSpark steps: R requests, windows drawn from DSPARK_WINDOW_P,
    contexts log-normal (clipped to 64..32768). target_n: windows nudged (within 1..8) until the
    step has exactly that many tokens."""
    ws = list(range(1, 9))
    q = rng.choices(ws, weights=DSPARK_WINDOW_P, k=R)
    if target_n is not None:
        if not R <= target_n <= 8 * R:
            raise ValueError(f"target {target_n} tokens not reachable with {R} requests")
        i = 0
        while sum(q) != target_n:
            j = i % R
            if sum(q) < target_n and q[j] < 8:
                q[j] += 1
            elif sum(q) > target_n and q[j] > 1:
                q[j] -= 1
            i += 1
    mu, sg = math.log(ctx_median), math.log(ctx_gsd)
    ctx = [int(min(32768, max(64, round(rng.lognormvariate(mu, sg))))) for _ in range(R)]
    return StepShape(tuple(q), tuple(ctx), tag)


def tail_mixed_step(n: int, ctx: int = 1024, chunk: int = 1024) -> StepShape:
    """A chunked-prefill step of n tokens above the capture limit, as dsim's busy steps are: up to 256
    decode requests with 3-token verify windows at `ctx`, the rest as fresh prefill chunks of at most
    `chunk` tokens (equal sizes)."""
    R = min(256, n // 6)
    rest = n - 3 * R
    k = max(1, -(-rest // chunk))
    sizes = [rest // k + (1 if i < rest % k else 0) for i in range(k)]
    return StepShape(tuple([3] * R + sizes), tuple([ctx] * R + [0] * k), "tail-mixed")


def sweep_plan(caps: list[int] | None = None, tails: list[int] | None = None,
               contexts=(1024, 8192, 32768), kv_budget_tokens: int = 1_200_000,
               quick: bool = False, table_ctx: int = 1024, seed: int = 0) -> list[StepShape]:
    """Profiling sweep.

    - table: every capture size n, decode-only at 1K context with 1 query token per request
      (R = n) and 4 per request (R = n / 4), the forward table's support;
    - context: n in (8, 32, 128, 512) x query tokens per request (1, 2, 4, 8) x contexts, within
      the KV budget, for the context term;
    - hetero: DSpark-like decode/verify steps (hetero_step): R = 16..256 requests with mixed windows
      and log-normal contexts (two draws each, plus long-context draws at median 4K); above the
      capture limit their windows are nudged to a tail size;
    - tail: sizes above the capture limit: a decode batch of 8 query tokens per request at 1K
      context (up to TAIL_DECODE_MAX_REQUESTS requests: larger pure-decode batches are not what
      dsim's engine runs at the concurrencies of interest, and per-request costs would pull the
      tail up), a chunked-prefill mix (tail_mixed_step), and one prefill chunk of the whole size at
      zero context (tail-prefill: measured and reported, not fitted: its attention grows with the
      square of the chunk, which F(n) + kv cannot express, and dsim's steps split prompts into chunks).
    """
    caps = caps or vllm_capture_sizes()
    tails = tails or tail_sizes(caps[-1])
    plan: list[StepShape] = []
    table_caps = caps if not quick else [c for c in caps if c in (1, 2, 4, 8, 64, 256, caps[-1])]
    for n in table_caps:
        plan.append(uniform_step(n, 1, table_ctx, "table"))
        if n % 4 == 0 and n >= 4:
            plan.append(uniform_step(n // 4, 4, table_ctx, "table"))
    ns = (8, 32, 128, 512) if not quick else (8, 64)
    for n in ns:
        for s in (1, 2, 4, 8):
            if n % s:
                continue
            R = n // s
            for c in contexts:
                if R * c <= kv_budget_tokens and not (c == table_ctx and s in (1, 4)):
                    plan.append(uniform_step(R, s, c, "context"))
    rng = random.Random(seed)
    scale = table_ctx / 1024.0
    reqs = HETERO_REQUESTS if not quick else (16, 64)
    draws = [(1050.0, 2), (4096.0, 1)] if not quick else [(1050.0, 1)]
    for med, k in draws:
        for R in reqs:
            if med > 1050 and R not in (32, 128, 256):
                continue
            for _ in range(k):
                st = hetero_step(R, rng, ctx_median=med * scale)
                if st.n > caps[-1]:          # above the limit: run exactly at a tail size
                    t = min([x for x in tails if x >= st.n] or [tails[-1]])
                    st = hetero_step(R, rng, ctx_median=med * scale, target_n=min(t, 8 * R))
                if st.kv <= kv_budget_tokens:
                    plan.append(st)
    for n in (tails if not quick else tails[:2]):
        if n % 8 == 0 and n // 8 <= TAIL_DECODE_MAX_REQUESTS and (n // 8) * table_ctx <= kv_budget_tokens:
            plan.append(uniform_step(n // 8, 8, table_ctx, "tail-decode"))
        plan.append(tail_mixed_step(n, table_ctx, chunk=max(32, table_ctx)))
        plan.append(StepShape((n,), (0,), "tail-prefill"))
    return plan


# ---------------------------------------------------------------- fit
def fit_step_model(points: list[dict]) -> dict:
    """Least squares step_ms = F(n) + slope * kv / 1000 with one free F per distinct n.

    points: dicts with n (token count the step ran with, i.e. padded), kv, ms; a point whose tag is
    in FIT_EXCLUDE (or with fit=False) is not fitted, only its residual reported (by_tag).
    Returns {"tokens": [...], "F": [...], "kv_ms_per_ktok": slope, "residual_pct": {...}}.
    """
    allpts = points
    points = [p for p in points if p.get("fit", p.get("tag") not in FIT_EXCLUDE)]
    held = [p for p in allpts if p not in points]
    ns = sorted({int(p["n"]) for p in points})
    idx = {n: i for i, n in enumerate(ns)}
    A = np.zeros((len(points), len(ns) + 1))
    y = np.zeros(len(points))
    for r, p in enumerate(points):
        A[r, idx[int(p["n"])]] = 1.0
        A[r, -1] = p["kv"] / 1000.0
        y[r] = p["ms"]
    # relative weighting: every point counts by its relative error
    w = 1.0 / np.maximum(y, 1e-6)
    coef, *_ = np.linalg.lstsq(A * w[:, None], y * w, rcond=None)
    slope = max(float(coef[-1]), 0.0)
    if coef[-1] < 0:   # refit with slope pinned at 0
        coef, *_ = np.linalg.lstsq(A[:, :-1] * w[:, None], y * w, rcond=None)
        coef = np.append(coef, 0.0)
    F = np.maximum(coef[:-1], 1e-4)
    pred = A[:, :-1] @ F + slope * A[:, -1]
    rel = (pred - y) / y * 100
    by_tag: dict[str, list] = {}
    for p, e in zip(points, rel):
        by_tag.setdefault(p.get("tag", ""), []).append(abs(float(e)))
    signed = {}
    if held:     # not fitted: signed error of the fitted model (table lookup as in the staircase)
        Fn = dict(zip(ns, F))
        for p in held:
            n = int(p["n"])
            f = Fn[n] if n in Fn else float(np.interp(n, ns, F))
            e = (f + slope * p["kv"] / 1000.0 - p["ms"]) / p["ms"] * 100
            signed.setdefault(p.get("tag", ""), []).append(float(e))
    out = dict(tokens=ns, F=[float(f) for f in F], kv_ms_per_ktok=slope,
               residual_pct=dict(median_abs=float(np.median(np.abs(rel))),
                                 p90_abs=float(np.percentile(np.abs(rel), 90)),
                                 max_abs=float(np.max(np.abs(rel))),
                                 by_tag={k: round(median(v), 3) for k, v in by_tag.items()}))
    if signed:
        out["not_fitted_signed_pct"] = {k: [round(x, 2) for x in v] for k, v in signed.items()}
    return out


def forward_table(fit: dict, caps: list[int]) -> dict:
    """Forward table over the fitted sizes plus every capture size; capture sizes that were not
    measured (quick sweeps only) are interpolated and listed under 'interpolated'."""
    toks = np.asarray(fit["tokens"], dtype=float)
    F = np.asarray(fit["F"], dtype=float)
    missing = [c for c in caps if c not in set(int(t) for t in toks)]
    allx = sorted(set(int(t) for t in toks) | set(caps))
    ms = np.interp(allx, toks, F)
    d = {"tokens": [int(t) for t in allx], "ms": [round(float(v), 5) for v in ms]}
    if missing:
        d["interpolated"] = missing
    return d


class Staircase:
    """Tiny numpy re-implementation of dsim.cost.CostModel.step_ms (vLLM staircase semantics)."""

    def __init__(self, tokens, ms, kv_ms_per_ktok, limit):
        self.x = np.asarray(tokens, dtype=float)
        self.ms = np.maximum.accumulate(np.asarray(ms, dtype=float))
        self.limit = int(limit)
        self.kv = kv_ms_per_ktok / 1000.0
        ab = self.x >= self.limit
        self.ax, self.ams = self.x[ab], self.ms[ab]
        if len(self.ax) >= 2:
            s = (self.ams[-1] - self.ams[-2]) / (self.ax[-1] - self.ax[-2])
        else:
            s = (self.ms[-1] - self.ms[-2]) / (self.x[-1] - self.x[-2]) if len(self.x) >= 2 else 0.0
        self.slope = max(s, 0.0)

    def forward_ms(self, n: int) -> float:
        if n <= self.limit:
            i = min(int(np.searchsorted(self.x, max(n, 1), side="left")), len(self.x) - 1)
            return float(self.ms[i])
        if n > self.ax[-1]:
            return float(self.ams[-1] + self.slope * (n - self.ax[-1]))
        return float(np.interp(n, self.ax, self.ams))

    def step_ms(self, n: int, kv: int) -> float:
        return self.forward_ms(n) + self.kv * kv


# ---------------------------------------------------------------- profile dict / files
def profile_dict(*, name, provenance, kv_cache_gib, kv_bytes_per_token, caps, fit, draft,
                 cpu_overhead_ms=1.5, extra=None) -> dict:
    d = {"name": name, "provenance": provenance,
         "memory": {"kv_cache_gib": round(float(kv_cache_gib), 2),
                    "kv_bytes_per_token": float(kv_bytes_per_token)},
         "cpu_overhead_ms": float(cpu_overhead_ms),
         "capture_sizes": [int(c) for c in caps],
         "forward": forward_table(fit, caps),
         "kv_ms_per_ktok": round(float(fit["kv_ms_per_ktok"]), 6)}
    if draft:
        d["draft"] = {k: {"requests": [int(r) for r in v["requests"]],
                          "ms": [round(float(m), 5) for m in v["ms"]]} for k, v in draft.items()}
    d["fit"] = {"residual_pct": fit["residual_pct"]}
    if extra:
        d.update(extra)
    return d


def dump_yaml(d: dict) -> str:
    """YAML text (JSON is valid YAML, used where pyyaml is missing)."""
    d = json.loads(json.dumps(d, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
    try:
        import yaml
        return yaml.safe_dump(d, sort_keys=False, width=120)
    except ImportError:   # pragma: no cover
        return json.dumps(d, indent=1)


def write_text_atomic(path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


# ---------------------------------------------------------------- synthetic step logs
def synthetic_steplog(seed: int = 0, concurrencies=(1, 32, 256), steps_each: int = 30,
                      prefill_steps: int = 6, ctx_lo: int = 500, ctx_hi: int = 8000) -> list[dict]:
    """Realistic decode/verify batches: per request 1..8 query tokens (speculative verify windows,
    weighted towards small windows), contexts uniform in [ctx_lo, ctx_hi]; plus prefill chunks
    (alone and mixed with decodes, chunked-prefill style). predicted_ms left None."""
    rng = random.Random(seed)
    out = []
    i = 0
    for c in concurrencies:
        for _ in range(steps_each):
            q = [rng.choice([1, 2, 2, 3, 3, 4, 4, 5, 6, 7, 8]) for _ in range(c)]
            ctx = [rng.randint(ctx_lo, ctx_hi) for _ in range(c)]
            out.append({"step": i, "q": q, "ctx": ctx, "predicted_ms": None, "concurrency": c})
            i += 1
    for k in range(prefill_steps):
        chunk = [512, 2048, 4096][k % 3]
        ctx0 = [0, 2048][(k // 3) % 2]
        ndec = [0, 16][k % 2]
        q = [rng.randint(1, 8) for _ in range(ndec)] + [chunk]
        ctx = [rng.randint(ctx_lo, ctx_hi) for _ in range(ndec)] + [ctx0]
        out.append({"step": i, "q": q, "ctx": ctx, "predicted_ms": None, "concurrency": "prefill"})
        i += 1
    return out


def read_steplog(path) -> list[dict]:
    steps = []
    for ln, line in enumerate(Path(path).read_text().splitlines(), 1):
        line = line.strip()
        if not line:
            continue
        d = json.loads(line)
        if len(d["q"]) != len(d["ctx"]) or not d["q"]:
            raise ValueError(f"{path}:{ln}: q and ctx must be non-empty lists of equal length")
        steps.append(d)
    return steps


def error_summary(rows: list[dict], key: str = "concurrency") -> dict:
    """Median and p90 absolute % error of predicted vs measured, per group and overall."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r.get("predicted_ms") is None or not r.get("measured_ms"):
            continue
        e = abs(r["predicted_ms"] - r["measured_ms"]) / r["measured_ms"] * 100
        groups.setdefault(str(r.get(key, "all")), []).append(e)
        groups.setdefault("all", []).append(e)
    return {g: dict(steps=len(v), median_abs_pct=round(median(v), 3),
                    p90_abs_pct=round(float(np.percentile(v, 90)), 3)) for g, v in groups.items()}


def concurrency_of(step: dict):
    c = step.get("concurrency")
    if c is not None:
        return c
    if max(step["q"]) >= PREFILL_MIN_Q:
        return "prefill"
    return len(step["q"])
