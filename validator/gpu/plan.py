"""Torch-free plan of the GPU profiler: the executor's limits and the drafter tables' sizes, model
shapes, the step shapes of the profile sweep and of the attention sweeps (context spreads, request
grid, busy steps).

Imports the standard library, numpy and dsim.cost (no torch), so it runs in CPU tests too; the fit is
validator.gpu.fit, profile files validator.gpu.profile_files, step logs validator.gpu.steplog.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dsim.cost import drafter_request_sizes, vllm_capture_sizes

MAX_BATCHED_TOKENS = 8192
# a tiny model for --dry-run (CPU, float32): checks the pipeline, its numbers mean nothing
DRY_CFG = dict(
    hidden_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,
    intermediate_size=256,
    vocab_size=1000,
    num_hidden_layers=2,
)
CAPTURE_LIMIT = 512
PREFILL_MIN_Q = 17  # a request with more query tokens than 16 is a prefill chunk
# the executor's attention paths (validator.gpu.model: StepMeta impl; torch-free here for the CLIs)
ATTENTION_IMPLS = ("split", "varlen", "packed")
# drafter request counts timed: the composer's grid (vLLM's capture sizes, one source in dsim.cost) up
# to this executor's capture limit; every one runs as a CUDA graph, and dsim reads the table at the
# next size at or above (the padded batch), extrapolating by the last slope beyond 512
DRAFT_REQUESTS = drafter_request_sizes(CAPTURE_LIMIT, CAPTURE_LIMIT)
DRAFT_CTX = 1024  # context the draft tables are measured at (stated, not modelled)
BLOCK_K = 8  # block drafter: tokens drafted in parallel per request
BLOCK_LAYERS = 3  # block drafter depth
EAGLE3_DRAFT_VOCAB = 32000  # EAGLE-3 heads use a reduced draft vocabulary
DRAFT_ORDER = ("dspark", "mtp", "eagle3", "block")  # the drafter kinds, in the order a --draft-only run times them
DRAFT_FORMAT = "dsim-draft-tables-1"  # the profiler's --draft-only file (validator.gpu.refit --drafts reads it)


def tail_sizes(limit: int = CAPTURE_LIMIT, max_tokens: int = MAX_BATCHED_TOKENS) -> list[int]:
    """vLLM adaptive-verification tail sizes: 1.5 x limit, then doubling, capped at max_tokens."""
    out, x = [], int(1.5 * limit)
    while x < max_tokens:
        out.append(x)
        x *= 2
    out.append(max_tokens)
    return out


def table_knots(caps: Sequence[int], max_tokens: int = MAX_BATCHED_TOKENS) -> list[int]:
    """The sizes a profile's forward table is fitted at (fit_step_model's knots): the capture
    sizes and the sweep's tail sizes above the largest (tail_sizes); the step cost between two
    tail sizes is read by linear interpolation, so it is fitted that way too."""
    top = max(int(c) for c in caps)
    return sorted({int(c) for c in caps} | set(tail_sizes(top, max_tokens)))


def median(xs: Iterable[float]) -> float:
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
    return dict(
        hidden=h,
        heads=nh,
        kv_heads=nkv,
        head_dim=hd,
        layers=L,
        inter=inter,
        vocab=V,
        qk_norm=qk_norm,
        layer_params=layer_params,
        params=L * layer_params + 2 * V * h + h,
        kv_bytes_per_token=L * 2 * nkv * hd * 2,
        kv_bytes_per_token_layer=2 * nkv * hd * 2,
    )


def model_name(cfg: dict, path: str = "") -> str:
    return cfg.get("_name") or Path(path).stem


ANCHOR_N = (1, 8, 64, 256, 512, 2048, 8192)  # the sweep's table sizes re-timed as anchors in each attention sweep
# what a profile without the per-request attention terms misses (profile --no-attention-terms)
ATTENTION_MISSING = (
    "attention terms missing (--no-attention-terms): format 1, attention priced by one KV slope, blind to how "
    "contexts are spread over requests and to prompt chunks over long cached prefixes; fitted so on the same "
    "sweeps, the four H200 profiles under-predict their held-out Mooncake replays (long unequal contexts, prefix "
    "caching) by 5.1-10.3 % median (Azure logs -4.5 .. +2.7 %; docs/user/gpu-profiling.md, 'The profiling recipe'); "
    "rerun without --no-attention-terms, or time the sweeps with scripts/context_sweep.py and refit with "
    "validator.gpu.refit --context"
)


def gpu_prefix(gpu: str) -> str:
    """A profile's name prefix from the GPU that measured it (torch's device name): 'NVIDIA H100 80GB
    HBM3' -> h100, 'NVIDIA H200' -> h200, 'NVIDIA H100 PCIe' -> h100-pcie, 'NVIDIA GB200' -> gb200; the
    CPU dry run -> dry. A name with no chip model in it is kept, lower-cased, spaces as dashes."""
    if gpu.startswith("cpu"):
        return "dry"
    words = re.sub(r"[^a-z0-9]+", " ", gpu.lower()).split()
    words = [w for w in words if w not in ("nvidia", "tesla", "geforce")]
    chip = next((w for w in words if re.fullmatch(r"[a-z]{1,3}\d{2,4}[a-z]?", w)), None)
    if chip is None:
        return "-".join(words) or "gpu"
    return chip + ("-pcie" if "pcie" in words else "")


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
# mixed trace (archive/h200/steplogs, concurrency 32 and 256, pooled): the heterogeneous shapes the
# profile must cover. Context: log-normal, median 1050, geometric sd 1.76 (5th-95th pct 430-2730).
DSPARK_WINDOW_P = (0.156, 0.288, 0.285, 0.131, 0.063, 0.041, 0.025, 0.012)
CTX_MEDIAN, CTX_GSD = 1050.0, 1.76
# Prompts dsim's chunked prefill puts into busy steps (whole prompts at context 0, several per step):
# log-normal, median ~850, geometric sd ~1.9 (steplogs, c = 32 and 256)
PROMPT_MEDIAN, PROMPT_GSD = 850.0, 1.9
HETERO_REQUESTS = (16, 48, 64, 96, 128, 160, 192)  # held-out DSpark-like checks at other request counts
# Request counts of the table points: the concurrencies the step replay checks. A capture size
# n runs with R = the smallest tier t with t <= n <= 8 t (windows 1..8), else R = n // 4 (n = 16):
# n <= 8 -> one request (a single user's verify step), 32..256 -> 32, 264..512 -> 256.
TABLE_TIERS = (1, 32, 256)
FIT_EXCLUDE = ("hetero",)  # measured and reported (signed), not fitted
SLOPE_ONLY = ("context",)  # fitted with their own intercept per (n, R, window): they set the KV slope only
TAIL_DECODE_MAX_REQUESTS = 256  # pure-decode tail points only up to this many requests (8 tokens each)


def table_requests(n: int) -> int:
    for t in TABLE_TIERS:
        if t <= n <= 8 * t:
            return t
    return max(1, n // 4)


def quantile_contexts(
    R: int, seed: int, median: float = CTX_MEDIAN, gsd: float = CTX_GSD, lo: int = 64, hi: int = 32768
) -> list[int]:
    """R contexts at the (i + 0.5) / R quantiles of the log-normal (deterministic, representative of
    the distribution at every R), shuffled with `seed`."""
    from statistics import NormalDist

    nd = NormalDist()
    mu, sg = math.log(median), math.log(gsd)
    ctx = [int(min(hi, max(lo, round(math.exp(mu + sg * nd.inv_cdf((i + 0.5) / R)))))) for i in range(R)]
    random.Random(seed).shuffle(ctx)
    return ctx


def _windows(R: int, rng: random.Random, target_n: int | None) -> list[int]:
    q = rng.choices(range(1, 9), weights=DSPARK_WINDOW_P, k=R)
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
    return q


def hetero_step(
    R: int,
    rng: random.Random,
    ctx_median: float = CTX_MEDIAN,
    ctx_gsd: float = CTX_GSD,
    target_n: int | None = None,
    tag: str = "hetero",
) -> StepShape:
    """A decode/verify step like dsim's DSpark steps: R requests, windows drawn from DSPARK_WINDOW_P,
    contexts log-normal (clipped to 64..32768). target_n: windows nudged (within 1..8) until the
    step has exactly that many tokens."""
    q = _windows(R, rng, target_n)
    mu, sg = math.log(ctx_median), math.log(ctx_gsd)
    ctx = [int(min(32768, max(64, round(rng.lognormvariate(mu, sg))))) for _ in range(R)]
    return StepShape(tuple(q), tuple(ctx), tag)


def shaped_step(R: int, n: int, seed: int = 0, ctx_scale: float = 1.0, tag: str = "table") -> StepShape:
    """A step shaped like dsim's DSpark steps at concurrency R with exactly n tokens: quantile
    contexts (quantile_contexts) and windows from DSPARK_WINDOW_P nudged to n. The same seed gives the
    same contexts and base windows at every n, so a table over n moves only in n."""
    ctx = [max(1, int(c * ctx_scale)) for c in quantile_contexts(R, seed)]
    return StepShape(tuple(_windows(R, random.Random(seed + 1), n)), tuple(ctx), tag)


def dspark_mixed_step(
    n: int, R: int, seed: int = 0, ctx_scale: float = 1.0, dec_tokens: int | None = None, tag: str = "tail-mixed"
) -> StepShape:
    """A busy DSpark step of n tokens as dsim's chunked prefill builds it: R decode/verify requests
    shaped as in shaped_step with dec_tokens tokens (default: 3 per request at R >= 256, 5 below, at
    most n / 2), plus whole prompts at context 0, log-normal sizes (PROMPT_MEDIAN, PROMPT_GSD), the
    last one cut to fill exactly n."""
    if dec_tokens is None:
        dec_tokens = (3 if R >= 256 else 5) * R
    dec_tokens = max(R, min(dec_tokens, 8 * R, n // 2))
    d = shaped_step(R, dec_tokens, seed, ctx_scale)
    sizes = quantile_contexts(16, seed + 7, PROMPT_MEDIAN * ctx_scale, PROMPT_GSD, lo=PREFILL_MIN_Q, hi=8192)
    rest = n - dec_tokens
    prompts = []
    i = 0
    while rest > 0:
        p = min(rest, sizes[i % len(sizes)])
        if rest - p < PREFILL_MIN_Q:
            p = rest
        prompts.append(p)
        rest -= p
        i += 1
    return StepShape(d.q + tuple(prompts), d.ctx + (0,) * len(prompts), tag)


def sweep_plan(
    caps: list[int] | None = None,
    tails: list[int] | None = None,
    contexts: Sequence[int] = (1024, 8192, 32768),
    kv_budget_tokens: int = 1_200_000,
    quick: bool = False,
    table_ctx: int = 1024,
    seed: int = 0,
) -> list[StepShape]:
    """Profiling sweep (the forward table is measured on steps shaped like the ones dsim runs).

    - table: every capture size n, one step shaped like dsim's DSpark steps at the request count
      table_requests(n): n <= 8 one request with an n-token window at table_ctx (a single user's verify
      step); above, shaped_step (quantile log-normal contexts, DSpark windows nudged to n), R = 32 up
      to 256 tokens, 256 above;
    - context: uniform steps, n in (32, 128, 512) x query tokens per request (1, 2, 4, 8) x contexts,
      within the KV budget: the KV slope (fitted with an intercept of their own, SLOPE_ONLY);
    - tail: sizes above the capture limit: a decode/verify step of 256 shaped requests (where n <= 8 x
      256), busy chunked-prefill steps (dspark_mixed_step) with 256 and with 32 decode requests and
      whole prompts, and one prefill chunk of the whole size at zero context (tail-prefill: fitted
      with the prefill terms, whose causal-attention term covers its square growth; measured and
      reported but not fitted without them);
    - hetero: held-out DSpark-like steps at other request counts (HETERO_REQUESTS; plus long contexts,
      median 4K, at 32, 128 and 256 requests): measured and reported (signed error), not fitted.
    """
    caps = caps or vllm_capture_sizes()
    tails = tails or tail_sizes(caps[-1])
    scale = table_ctx / 1024.0
    plan: list[StepShape] = []
    table_caps = caps if not quick else [c for c in caps if c in (1, 2, 4, 8, 16, 64, 256, 264, caps[-1])]
    for n in table_caps:
        R = table_requests(n)
        if R == 1:
            plan.append(uniform_step(1, n, table_ctx, "table"))
        else:
            plan.append(shaped_step(R, n, seed + R, scale))
    ns = (32, 128, 512) if not quick else (32, 64)
    for n in ns:
        for s in (1, 2, 4, 8):
            R = n // s
            for c in contexts:
                if R * c <= kv_budget_tokens:
                    plan.append(uniform_step(R, s, c, "context"))
    for n in tails if not quick else tails[:2]:
        R = TAIL_DECODE_MAX_REQUESTS
        if n <= 8 * R and R * 4 * table_ctx <= kv_budget_tokens:
            plan.append(shaped_step(R, n, seed + R, scale, "tail-decode"))
        plan.append(dspark_mixed_step(n, 256, seed + 256, scale))
        plan.append(dspark_mixed_step(n, 32, seed + 32, scale))
        plan.append(StepShape((n,), (0,), "tail-prefill"))
    rng = random.Random(seed)
    reqs = HETERO_REQUESTS if not quick else (16, 64)
    draws = [(CTX_MEDIAN, reqs)] + ([(4096.0, (32, 128, 256))] if not quick else [])
    for med, rs in draws:
        for R in rs:
            st = hetero_step(R, rng, ctx_median=med * scale)
            if st.n > caps[-1]:  # above the limit: run exactly at a tail size
                t = min([x for x in tails if x >= st.n] or [tails[-1]])
                st = hetero_step(R, rng, ctx_median=med * scale, target_n=min(t, 8 * R))
            if st.kv <= kv_budget_tokens:
                plan.append(st)
    return plan


# ---------------------------------------------------------------- context sweep (unequal contexts)
# Context spreads of the context sweep: the same request count and total KV, contexts spread as
# uniform, dsim's DSpark mix (log-normal gsd 1.76), a wide log-normal (gsd 3) and a heavy tail like
# Mooncake's conversation trace (input p50 6.9K, p99 85K tokens; one request near the 122K maximum).
CONTEXT_SPREADS = ("uniform", "gsd1.76", "gsd3", "heavy")
LONG_PREFIX_CACHED = (0, 16384, 65536, 122880)  # cached tokens under one prefill chunk
LONG_PREFIX_CHUNKS = (512, 2048, 8192)


def spread_contexts(R: int, mean: int, spread: str, seed: int = 0) -> list[int]:
    """R contexts with mean about `mean` (sum exactly R x mean), spread as CONTEXT_SPREADS names."""
    if spread == "uniform":
        raw = [1.0] * R
    elif spread.startswith("gsd"):
        raw = [float(c) for c in quantile_contexts(R, seed, 1000.0, float(spread[3:]), lo=1, hi=10**9)]
    elif spread == "heavy":  # one request near 122K tokens, the rest log-normal (gsd 2.5)
        raw = [float(c) for c in quantile_contexts(R, seed, 1000.0, 2.5, lo=1, hi=10**9)]
    else:
        raise ValueError(f"unknown spread {spread!r} ({', '.join(CONTEXT_SPREADS)})")
    total = R * mean
    if spread == "heavy" and R > 1:
        top = min(122880, total // 2)
        rest = [x * (total - top) / sum(raw[1:]) for x in raw[1:]]
        ctx = [top] + [max(16, int(round(x))) for x in rest]
    else:
        ctx = [max(16, int(round(x * total / sum(raw)))) for x in raw]
    random.Random(seed + 3).shuffle(ctx)
    return ctx


REQUEST_GRID_N = (8, 64, 192, 384, 512)  # decode/verify steps: n tokens over n/8, n/4, n/2, n requests
REQUEST_GRID_MIXED = ((1024, (8, 64, 128)), (2048, (8, 64, 128)))  # busy steps: n tokens, decode requests


def request_grid_plan(seed: int = 0, quick: bool = False) -> list[StepShape]:
    """Steps that vary the request count at a fixed token count (the table ties each capture size to
    one request count, table_requests):

    - rgrid: for n in REQUEST_GRID_N, decode/verify steps of n tokens over n / 8, n / 4, n / 2 and n
      requests (windows 8 down to 1), shaped like dsim's DSpark steps (shaped_step: quantile
      log-normal contexts, median 1050);
    - rgrid-mixed: busy chunked-prefill steps (dspark_mixed_step) of 1024 and 2048 tokens with 8, 64
      and 128 decode requests and whole prompts.
    """
    plan: list[StepShape] = []
    for n in REQUEST_GRID_N if not quick else (8, 32):
        for R in sorted({max(1, n // 8), n // 4, n // 2, n}):
            plan.append(shaped_step(R, n, seed + R, tag="rgrid") if R > 1 else uniform_step(1, n, 1024, "rgrid"))
    for n, rs in REQUEST_GRID_MIXED if not quick else ((96, (4, 8)),):
        for R in rs:
            plan.append(dspark_mixed_step(n, R, seed + R, tag="rgrid-mixed"))
    return plan


def context_sweep_plan(kv_budget_tokens: int = 4_000_000, seed: int = 0, quick: bool = False) -> list[StepShape]:
    """Steps that tell unequal contexts and long cached prefixes apart from total KV alone:

    - spread: decode/verify steps of R requests (16, 96, 256) at a mean context (4K, 12K) with every
      spread in CONTEXT_SPREADS (same windows, same total KV within a group), plus window-1 steps
      (no drafter) at 16 and 96 requests, 12K mean;
    - longpre: one prefill chunk of q tokens (LONG_PREFIX_CHUNKS) over c cached tokens
      (LONG_PREFIX_CACHED), and busy steps mixing heavy-tailed decodes with a chunk over a long prefix.
    Steps over kv_budget_tokens are left out.
    """
    plan: list[StepShape] = []
    groups = [(16, 4096), (16, 12288), (96, 4096), (96, 12288), (256, 4096)]
    if quick:
        groups = [(4, 256), (16, 128)]
    for R, mean in groups:
        q = tuple(_windows(R, random.Random(seed + R), None))
        for sp in CONTEXT_SPREADS:
            st = StepShape(q, tuple(spread_contexts(R, mean, sp, seed + R)), f"spread-{sp}")
            if st.kv <= kv_budget_tokens:
                plan.append(st)
    for R in (16, 96) if not quick else (4,):
        mean = 12288 if not quick else 256
        for sp in ("uniform", "heavy"):
            st = StepShape((1,) * R, tuple(spread_contexts(R, mean, sp, seed + R)), f"spread-{sp}")
            if st.kv <= kv_budget_tokens:
                plan.append(st)
    cached = LONG_PREFIX_CACHED if not quick else (0, 256)
    chunks = LONG_PREFIX_CHUNKS if not quick else (32, 128)
    for c in cached:
        for qn in chunks:
            plan.append(StepShape((qn,), (c,), "longpre"))
    mixes = [(16, 2048, 32768), (96, 4096, 65536)] if not quick else [(4, 64, 256)]
    for R, qn, c in mixes:
        d = StepShape(
            tuple(_windows(R, random.Random(seed + R), None)),
            tuple(spread_contexts(R, 8192 if not quick else 128, "heavy", seed)),
        )
        st = StepShape(d.q + (qn,), d.ctx + (c,), "longpre-mixed")
        if st.kv <= kv_budget_tokens:
            plan.append(st)
    return plan


# busy steps: (tokens, decode tokens) over BUSY_DECODE_REQUESTS decode requests plus whole prompts
BUSY_DECODE = ((4096, 1536), (6144, 1024), (6144, 2048), (7680, 1280), (7680, 1792), (8192, 1536), (8192, 2048))
BUSY_DECODE_REQUESTS = 256
# short prompt chunks beside decode requests: (decode requests, decode tokens, chunk sets)
BUSY_SHORT = (
    (32, 128, ((96,), (224,), (352,), (608,), (1000,), (1400,), (200, 400))),
    (128, 640, ((), (128,), (416,), (1000,), (1760,), (256, 512, 1024))),
)


BUSY_ONE = ((1, 2, 4, 8), (256, 2048, 8192))  # one request: verify windows x contexts


def busy_plan(seed: int = 0, parts: Sequence[str] = ("decode", "short"), quick: bool = False) -> list[StepShape]:
    """Mixed steps the table and request grid leave out (plan.sweep_plan's busy steps carry 768 or
    160 decode tokens, the grid's at most 640 at 1-2K tokens):

    - busy-decode ("decode"): steps of 4-8K tokens whose 256 decode/verify requests run 1024-2048
      tokens (windows of 4-8, shaped as shaped_step), the rest whole prompts at context 0
      (dspark_mixed_step's prompt sizes), and one with its first prompt over 1024 cached tokens
      (a prompt continued from the step before);
    - busy-short ("short"): one to three short prompt chunks (96-1760 tokens) beside 32 decode
      requests with 128 tokens or 128 with 640, at sizes on and between the table's knots, and the
      128 requests alone;
    - one ("one"): a single request verifying 1-8 tokens over 256-8192 cached ones (the table's
      one-request sizes at 1K context share F(n) with the grid's steps of 2-8 requests).
    """
    plan: list[StepShape] = []
    if "decode" in parts:
        drows: Sequence[tuple[int, int]] = BUSY_DECODE if not quick else ((192, 96),)
        R = BUSY_DECODE_REQUESTS if not quick else 16
        for i, (n, dec) in enumerate(drows):
            plan.append(dspark_mixed_step(n, R, seed + R + i, dec_tokens=dec, tag="busy-decode"))
        n, dec = drows[-2] if not quick else drows[-1]
        st = dspark_mixed_step(n, R, seed + R + len(drows), dec_tokens=dec, tag="busy-decode")
        i = next(j for j, q in enumerate(st.q) if q >= PREFILL_MIN_Q)
        plan.append(StepShape(st.q, st.ctx[:i] + (1024 if not quick else 64,) + st.ctx[i + 1 :], "busy-decode"))
    if "short" in parts:
        srows: Sequence[tuple[int, int, Sequence[tuple[int, ...]]]] = (
            BUSY_SHORT if not quick else ((4, 16, ((24,), (40, 32))), (8, 24, ((), (48,))))
        )
        for R, dec, sets in srows:
            d = shaped_step(R, dec, seed + R)
            for chunks in sets:
                plan.append(StepShape(d.q + tuple(chunks), d.ctx + (0,) * len(chunks), "busy-short"))
    if "one" in parts:
        wins, ctxs = BUSY_ONE if not quick else ((1, 8), (64,))
        for c in ctxs:
            for s in wins:
                plan.append(uniform_step(1, s, c, "busy-one"))
    return plan
