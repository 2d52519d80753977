"""Step-cost model: how long one engine step takes.

A profile file (YAML) carries provenance and tables; ``CostModel`` answers
``step_ms(n_tokens, kv_tokens)`` for a target forward/verify step and ``draft_table_ms`` for the
drafter, with vLLM's adaptive-verification semantics (docs/semantics.md §5):

- at or below the CUDA-graph capture limit a step of n tokens runs the graph of the next captured
  size, so cost is a step function: the table value at the smallest profiled size >= n;
- above the limit steps run without full graphs: linear interpolation between profiled points,
  last-slope extrapolation past the largest one;
- the measured curve is made non-decreasing (running maximum) first, as vLLM does.

The table is priced for decode/verify tokens (every one gets an LM-head row). A profile may add
two per-step terms for prefill chunks (``prefill_terms``, fitted on measured steps that mix
decodes and prompts): a prompt token costs ``discount_ms_per_ktok`` / 1000 less (no LM-head row, no
decode-path per-row work), and a chunk of q tokens over c cached ones adds its causal attention,
``attention_ms_per_mpair`` per million query-key pairs q (c + q / 2), and each chunk adds
``ms_per_chunk`` (work per prompt in a step that does not scale with its tokens, measured on CPU
servers). ``prefill_ms(chunks)`` gives that per-step correction; all are 0 unless the profile says
otherwise.

``prefill_terms`` with ``version: 2`` (``PrefillTerms``) replaces those keys by a form fitted on
per-chunk kernel records (dsim.profiling.compose): a chunk of q tokens over c cached ones pays
``cached_ms_per_mpair`` x q c / 1e6 (pairs with the cache), ``within_ms_per_mpair`` x q^2 / 2 / 1e6
(causal pairs within the chunk), ``token_ms_per_ktok`` x q / 1000 (signed: a surcharge, or the
decode-path work a prompt token skips) and ``ms_per_chunk``; a step with prompt chunks pays
``ms_per_step`` once (one attention launch per layer covers all of a step's chunks, so a lone chunk's
fixed excess is the step's, not each chunk's). ``own_keys_tokens`` > 0 (format 4 with ``step_keys``
only): a chunk's tokens are also priced at their own key lists, the step-keys kinds' and the step
indexer's cells at the chunk's visible tokens c + q less those of a decode token over
``own_keys_tokens`` visible tokens (what the forward table priced each token as), at the same
ms per million cells; the step-keys term then pads them to the step's longest as it does requests.

Preconditions: n_tokens >= 1, kv_tokens >= 0. Postcondition: step_ms is non-decreasing in both.

Profile format 2 (``format_version: 2``) adds ``attention``: terms that see each request's context
and query length, for the split-KV decode attention and the causal prefill attention of the
executor the profile was measured on (``AttentionTerms``). Decode: every request's cached prefix
is cut into chunks of one length L per step (FlashInfer-like load balancing, ``split_chunk_tokens``);
the chunk CTAs (KV heads x query blocks x chunks) run as a list schedule over the SMs' CTA
slots (in the grid's dispatch order, each on the first slot to free up, for as long as its
chunk's tokens), so a step pays ``wave_ms_per_ktok`` per 1000 tokens of wave capacity (the
schedule's makespan x slots / CTAs per chunk: equal to the KV read when the chunks pack the slots
exactly, more when long chunks dispatched late, or too few CTAs for one wave, leave slots
idle; on the H200 executor 96 contexts of 12K, each one whole chunk, took 13 % less than the
same KV spread log-normally, whose longest chunks are L = 24.6K), ``chunk_ms_per_kcta`` per 1000
chunk CTAs and ``merge_ms_per_mcell`` per million cells of the logsumexp merge grid (most chunks
of one request x folded query rows x KV heads).
Prefill: a chunk of q tokens over c cached ones runs ceil(q / block rows) x query heads CTAs,
each over its keys, in waves: its pairs are counted per wave (``prefill_pairs``), so a short
chunk over a long prefix (few CTAs, long keys) is priced by its critical path, not by its FLOPs.
Three optional decode terms (0 where absent): ``ms_per_request`` per decode/verify request,
``tail_ms_per_ktok`` per 1000 tokens of the longest chunk the step has (min(L, longest context))
times the chunk-CTA slots over one chunk's CTAs (Graham's bound on what a list schedule adds to
the mean load; the makespan prices it where fitted, and the shipped H200 fits put both at 0), and
``decode_step_ms`` once per step with decode/verify requests: the split-KV path's per-step work
(on the H200 executor about 27 kernels per layer that a prompt-only step does not launch), so the
forward table is then priced without it and a prompt-only step does not pay it.
``CostModel.context_ms(q, ctx)`` gives the decode terms (added to step_ms by the engine);
``prefill_ms`` prices the prefill chunks with the wave-counted pairs. A format-1 profile has no
``attention``: context_ms is 0 and prefill_ms is as above (results unchanged).

Profile format 3 (``format_version: 3``) adds ``request_attention`` (``RequestAttention``), for
attention whose cost is not a function of the step's total tokens and KV (DeepSeek-V4's sliding
window + compressed/sparse attention, MLA): ``step_ms`` of a batch of B requests each of q query
tokens over ctx cached ones, tabulated over B, q and ctx, and ``forward_share_ms``, the part of
each forward-table entry that is this attention priced as one-token requests (at zero context:
the KV slope prices the rest). A step's decode requests (q_i, ctx_i), R of them, cost
(1 / R) sum_i step_ms(R, q_i, ctx_i) (exact for equal requests; linear in B, q and ctx between
table points; past the last B the per-request cost of the last B; contexts below the first
point priced at it, above the last along the last segment), and context_ms returns that minus
what step_ms already charged for them: forward_share at the padded sum of q_i and the KV slope
of their sum_i (ctx_i + q_i) tokens. So a step of one request verifying 8 tokens and one of 8
one-token requests cost what their attention costs, not alike. The result can be negative;
step_ms + context_ms stays >= the forward table's non-attention part (>= 0).

Profile format 4 (``format_version: 4``) adds an optional ``step_indexer`` to ``request_attention``
({ratio, ms_per_mcell}): for an executor whose lightning indexer scores every token of the step
against the step's longest visible compressed context (one [tokens, longest / ratio] logits matrix
and its top-k per csa layer; our H200 shard executor does this, vLLM's DeepGEMM paged-MQA-logits
kernels score each request over its own context and do not), the step pays
ms_per_mcell x (N x l_max - sum_r q_r l_r) / 1e6 beyond what the equal-request table priced, with
l_r = max(1, (ctx_r + q_r) // ratio) over the step's decode requests and (through
``context_ms(..., chunks=)``) its prefill chunks, N their tokens and l_max the largest l_r.
A format-3 profile has no such term (results unchanged).

Format 4 may also add ``step_keys`` to ``request_attention`` ({programs, block, min_chunk,
combine_ms_per_work, kinds: [{layers, ratio, cap, window, ms_per_mcell}]}), for an executor that
gives every token of a step one key list per attention kind, as long as the step's longest
(our H200 shard executor), and splits those lists FlashDecoding-style when the step has fewer
tokens than ``programs``. Per kind, with l_r = (ctx_r + q_r) // ratio over the step's requests and
prefill chunks (0 where ratio is 0), w(l) = min(cap, l) (l where cap is 0) and
k = window + w(l_max): the step pays ms_per_mcell x (N x w(l_max) - sum_r q_r w(l_r)) / 1e6 for
the padded key cells, and, where N < programs and the chunk max(min_chunk, ceil(N k / programs /
block) x block) is shorter than k, layers x combine_ms_per_work x N x ceil(k / chunk) for the
logsumexp combine of the split lists (``split_work``). The table is then priced without any
combine (the composer takes it out of each record), so a step's split is decided by its own
tokens and longest context, not by each request's table point.

Profile format 5 (``format_version: 5``) may add ``block_pool`` to ``request_attention`` ({source,
kinds: [{ratio, layers, ms_per_step, ms_per_block, priced_from_q}]}), for an executor that pools a
completed block of ``ratio`` tokens into the compressed cache in the step that completes it (our H200
shard executor: about a dozen small kernels a layer, launched only in such steps). A request of q
query tokens over c cached ones completes (c + q) // ratio - c // ratio blocks. A step whose decode
requests complete b > 0 blocks of a kind pays ms_per_block x b, and ms_per_step once unless the step
has prompt chunks (a chunk completes blocks of its own, and the prefill records its terms were fitted
on include their pooling). ``priced_from_q`` > 0: the per-request table's records of q >= that
already complete blocks of the kind for every request (ratio 4 from q = 4 on, at contexts that are
multiples of the ratio), so the term applies only to steps whose decode requests all have fewer
query tokens; 0: the records complete none (ratio 128 below 128 query tokens). A profile without
the field prices no pooling (results unchanged).

One attention call (format 4 with step terms, a step with prefill chunks): that executor runs all
of a step's tokens, decode and prompt, through one attention call per layer, and step_ms priced
its N = n + p tokens (n decode/verify, p prompt) as N one-token requests, forward share S(N). The
decode requests' part of it is the call's per-call part S(1) and n / N of the rest, so context_ms
replaces S(1) + (S(N) - S(1)) n / N by their own attention, not S(n): below the executor's split
threshold S(n) carries a split-K combine and a small-step regime that a call of N tokens does not
run (on the H200 shard-check profile S(224) = 14.1 ms where 224 tokens' part of S(480) is 4.7).
The prompt tokens keep the rest, p / N of S(N) - S(1), against which the prefill terms price them
(fitted beside the q one-token records that a lone chunk's forward entry holds). Without prompt
tokens the rule is S(n), as before.
"""

from __future__ import annotations

import bisect
import functools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from dsim.errors import InputError, plain

try:  # the compiled per-request pass; plain Python where numba is absent (the GPU profiler's hosts)
    from numba import njit as _nb_njit

    _njit = _nb_njit(cache=True)
    # the per-step pricing helpers a decode window calls once a step: inlined into their callers
    # (a call across compiled functions costs the arrays' reference counting, about 25 ns a call)
    _njit_inline = _nb_njit(cache=True, inline="always")
except ImportError:  # pragma: no cover

    def _njit(f):
        return f

    _njit_inline = _njit


if TYPE_CHECKING:
    from dsim.schema import Doc

PROVENANCE_FIELDS = ("kind", "hardware", "gpus_per_replica", "model", "engine", "engine_version", "date", "method")
DRAFT_KINDS = ("mtp", "eagle3", "block", "dspark")
# "dspark@K": the DSpark drafter over K positions per request (a fixed length K shorter than the
# profile's draft block; vLLM's DSpark proposer drafts batch x num_speculative_tokens positions)
DRAFT_LENGTH_KINDS = tuple(f"dspark@{k}" for k in range(1, 17))

# measured: our own measurements; silicon-table: composed from published per-kernel silicon tables
# (e.g. NVIDIA AIConfigurator's); analytical: a roofline model; calibrated: fitted to measured runs;
# derived: another profile mapped by a stated transform (provenance.derived_from names it)
PROFILE_KINDS = ("measured", "silicon-table", "analytical", "calibrated", "derived")
KV_BLOCK_TOKENS = 16
DENSE_TOKENS = 16384  # forward cost tabulated densely up to this many tokens per step


def vllm_capture_sizes(max_capture: int = 512) -> list[int]:
    """vLLM's default CUDA-graph capture sizes: 1, 2, 4, multiples of 8 to 256, of 16 above."""
    sizes = [1, 2, 4] + list(range(8, 257, 8)) + list(range(272, max_capture + 1, 16))
    return [s for s in sizes if s <= max_capture]


def drafter_request_sizes(max_capture: int = 512, max_requests: int = 1024) -> list[int]:
    """Request counts a drafter's cost table is keyed by: vLLM's capture sizes up to max_capture
    (a drafter's batch is padded to the next one, as the target's), then every 128 requests up to
    max_requests. ``CostModel.draft_table_ms`` reads the next size at or above, so on this grid a
    drafter pays its padded batch, not the next power of two."""
    caps = vllm_capture_sizes(max_capture)
    top = caps[-1] if caps else 0
    return caps + list(range(top + 128, max_requests + 1, 128))


@dataclass(frozen=True)
class Table:
    """A cost table: x strictly increasing, ms the cost at each x."""

    x: np.ndarray
    ms: np.ndarray


@dataclass(frozen=True)
class AttentionTerms:
    """A profile's per-request attention terms (format 2; see the module doc). The split and
    occupancy fields describe the measured executor's kernels; the *_ms fields are fitted."""

    query_heads: int
    kv_heads: int
    sms: int  # streaming multiprocessors of the GPU
    fill: float  # split-KV: chunk CTAs aimed at fill x SMs
    balance: float  # split-KV: no chunk longer than balance x mean context (0: off)
    min_chunk: int  # split-KV: shortest chunk (tokens)
    block_rows: int  # query rows per attention CTA
    decode_ctas_per_sm: int  # decode chunk CTAs resident per SM (one wave = SMs x this)
    prefill_ctas_per_sm: int  # prefill CTAs resident per SM
    wave_ms_per_ktok: float
    chunk_ms_per_kcta: float
    merge_ms_per_mcell: float
    prefill_ms_per_mpair: float  # per million wave-counted prefill pairs (replaces attention_ms_per_mpair)
    # optional (0 where a profile does not give them): work per decode/verify request that neither
    # its tokens nor its context carry, and the schedule's tail (the longest chunk over the slots)
    ms_per_request: float = 0.0
    tail_ms_per_ktok: float = 0.0
    # once per step that has decode/verify requests: the split-KV path's per-step work (its
    # kernels' launches and fixed passes), which a prompt-only step does not run
    decode_step_ms: float = 0.0

    @property
    def group(self) -> int:
        return max(1, self.query_heads // self.kv_heads)


ATTENTION_SPLIT_FIELDS = ("query_heads", "kv_heads", "sms", "fill", "balance", "min_chunk", "block_rows")
ATTENTION_OCC_FIELDS = ("decode_ctas_per_sm", "prefill_ctas_per_sm")
ATTENTION_COEF_FIELDS = ("wave_ms_per_ktok", "chunk_ms_per_kcta", "merge_ms_per_mcell", "prefill_ms_per_mpair")
ATTENTION_OPTIONAL_FIELDS = ("ms_per_request", "tail_ms_per_ktok", "decode_step_ms")
FORMAT_VERSIONS = (1, 2, 3, 4, 5)


def split_chunk_tokens(ctx: np.ndarray, rows_max: int, a: AttentionTerms) -> int:
    """The chunk length L of one decode step (ctx: cached tokens per decode request, >= 1 each;
    rows_max: the most folded query rows of a request, group x query tokens):
    L = max(min_chunk, min(ceil(total / ceil(ceil(fill x SMs) / CTAs per chunk)), ceil(balance x mean))).
    Precondition: len(ctx) >= 1."""
    per = a.kv_heads * max(1, -(-rows_max // a.block_rows))
    n_t = -(-math.ceil(a.fill * a.sms) // per)
    tot = int(ctx.sum())
    L = -(-tot // n_t)
    if a.balance > 0:
        L = min(L, math.ceil(a.balance * tot / len(ctx)))
    return max(int(a.min_chunk), int(L))


def decode_features(q: Any, ctx: Any, a: AttentionTerms) -> tuple[float, float, float]:
    """(wave capacity in 1000 tokens (the chunk CTAs' list-schedule makespan over the slots, module
    doc), chunk CTAs / 1000, merge-grid cells / 1e6) of one step's
    decode requests: q query tokens and ctx cached tokens per request (equal-length integer
    sequences, q >= 1, ctx >= 0; a context of 0 is read as 1, as the executor does). (0, 0, 0)
    for no requests. One pass over the requests (compiled where numba is installed)."""
    return step_features(q, ctx, a)[:3]


def request_features(q: Any, ctx: Any, a: AttentionTerms) -> tuple[float, float]:
    """(decode/verify requests, schedule tail in 1000 tokens) of one step's decode requests (as
    decode_features): the tail is the longest chunk the step has, min(L, longest context), times
    the chunk-CTA slots (SMs x decode CTAs per SM) over one chunk's CTAs (KV heads x query
    blocks). (0, 0) for no requests."""
    return step_features(q, ctx, a)[3:]


def step_features(q: Any, ctx: Any, a: AttentionTerms) -> tuple[float, float, float, float, float]:
    """decode_features + request_features of one step from one compiled pass."""
    q = np.asarray(q, dtype=np.int64)
    c = np.asarray(ctx, dtype=np.int64)
    if not q.size:
        return 0.0, 0.0, 0.0, 0.0, 0.0
    return _decode_features(q, c, *split_kv_params(a))


def split_kv_params(a: AttentionTerms) -> tuple:
    """The split-KV structure _decode_features reads, as plain numbers: (group, KV heads, query
    rows per CTA, chunk-CTA cap, balance, shortest chunk, chunk-CTA slots of one wave)."""
    return (
        a.group,
        a.kv_heads,
        a.block_rows,
        math.ceil(a.fill * a.sms),
        float(a.balance),
        a.min_chunk,
        a.sms * a.decode_ctas_per_sm,
    )


@_njit
def decode_features_ms(
    q, c, g, kv_heads, block_rows, cap, balance, min_chunk, slots, cw, cc, cm, cr, ct, cd
):  # pragma: no cover - compiled
    """The split-KV terms of CostModel.context_ms of the first len(q) entries (>= 1), from
    CostModel.context_args (compiled: callable from compiled code)."""
    wave, chunks, merge, reqs, tail = _decode_features(q, c, g, kv_heads, block_rows, cap, balance, min_chunk, slots)
    return cw * wave + cc * chunks + cm * merge + cr * reqs + ct * tail + cd


@_njit_inline
def prefill_ms_compiled(mode, coef, chunks, computed, pre, k):  # pragma: no cover - compiled
    """CostModel.prefill_ms of the first k prefills' chunks: prefill i computes chunks[i] new
    tokens over computed[pre[i]] cached ones (chunks of 0 tokens are skipped), with
    CostModel.prefill_args' (mode, coef) (0: no terms, 2: version 2), in prefill_ms's operations' order,
    so the same value."""
    if mode == 0:
        return 0.0
    tot = 0.0
    n = 0
    pc, pw, pk, pe, ps = coef[0], coef[1], coef[2], coef[3], coef[4]
    for i in range(k):
        q = chunks[i]
        if q:
            n += 1
            tot += q * (pc * computed[pre[i]] + pw * q + pk) + pe
    return tot + ps if n else 0.0


@_njit_inline
def context_ms_compiled(
    q,
    c,
    g,
    kv_heads,
    block_rows,
    cap,
    balance,
    min_chunk,
    slots,
    cw,
    cc,
    cm,
    cr,
    ct,
    cd,
    ra_on,
    rb,
    rq,
    rc,
    rtab,
    rshare,
    kv_slope,
    iratio,
    step,
):  # pragma: no cover - compiled
    """CostModel.context_ms of the first len(q) decode requests, from CostModel.context_args past
    its ``on`` flag (compiled: callable from compiled code, as a decode window's kernel does once
    per step): the split-KV terms plus, for a format-3 table, the requests' own attention less
    the forward table's share and the KV slope's, and the format-4/5 step terms: iratio the
    step_indexer's ratio (0: none), ``step`` [its ms per million cells, then BlockPool.packed() (the
    kinds' count first; 0 where the profile has no block_pool), then StepKeys.packed() where the
    profile has step_keys]. The requests are the step's only ones (no prompt chunks: a step with
    chunks prices block_pool with ``block_pool_ms(..., chunks=True)``). Precondition: len(q) >= 1;
    a step of more tokens than the dense table's share extrapolates its last slope."""
    out = 0.0
    if cw != 0.0 or cc != 0.0 or cm != 0.0 or cr != 0.0 or ct != 0.0 or cd != 0.0:
        out = decode_features_ms(q, c, g, kv_heads, block_rows, cap, balance, min_chunk, slots, cw, cc, cm, cr, ct, cd)
    if ra_on:
        n = 0
        ctx = 0
        for i in range(len(q)):
            n += q[i]
            ctx += c[i]
        m = len(rshare)
        share = rshare[n] if n < m else rshare[m - 1] + (rshare[m - 1] - rshare[m - 2]) * (n - m + 1)
        out += _request_attention(q, c, rb, rq, rc, rtab) - share - kv_slope * (ctx + n)
        if iratio > 0:
            out += step[0] * _indexer_excess_mcells(q, c, iratio)
        keys = 2 + 5 * int(step[1]) if len(step) > 1 else 1
        if keys > 2:
            out += block_pool_ms(q, c, step[1:keys], False)
        if len(step) > keys:
            out += _step_keys_ms(q, c, step[keys:])
    return out


@_njit_inline
def block_pool_ms(q, c, pool, chunks):  # pragma: no cover - compiled
    """The format-5 block_pool term of a step's decode requests (q_r query tokens over c_r cached
    ones) from the packed term (BlockPool.packed: the kinds' count, then ratio, ms_per_step,
    ms_per_block, priced_from_q and layers per kind); ``chunks``: the step also has prompt chunks,
    whose own pooling the prefill terms price (no per-step part). Module doc."""
    out = 0.0
    for j in range(int(pool[0])):
        b = 1 + 5 * j
        ratio, per_step, per_block, from_q = int(pool[b]), pool[b + 1], pool[b + 2], int(pool[b + 3])
        blocks = 0
        qmax = 0
        for i in range(len(q)):
            blocks += (c[i] + q[i]) // ratio - c[i] // ratio
            qmax = max(qmax, q[i])
        if blocks == 0 or (from_q > 0 and qmax >= from_q):
            continue
        out += per_block * blocks
        if not chunks:
            out += per_step
    return out


@_njit_inline
def _indexer_excess_mcells(q, c, ratio):  # pragma: no cover - compiled
    """(N x l_max - sum_r q_r l_r) / 1e6 of the requests (q_r query tokens over c_r cached ones):
    the indexer logits cells a longest-context indexer computes beyond each request's own width
    l_r = max(1, (c_r + q_r) // ratio) (format 4, module doc)."""
    n = 0
    own = 0
    lmax = 1
    for i in range(len(q)):
        li = max(1, (c[i] + q[i]) // ratio)
        n += q[i]
        own += q[i] * li
        lmax = max(lmax, li)
    return (n * lmax - own) / 1e6


@_njit_inline
def split_work(n, k, programs, block, min_chunk):  # pragma: no cover - compiled
    """Work items of one split-K attention call over n tokens, each with a list of k keys: 0 (not
    split) where n >= programs or one chunk max(min_chunk, ceil(n k / programs / block) x block)
    holds k keys; else n x ceil(k / chunk) (format 4 step_keys, module doc)."""
    if n >= programs or k <= 0:
        return 0
    want = -(-(n * k) // programs)
    chunk = max(min_chunk, -(-want // block) * block)
    if chunk >= k:
        return 0
    return n * (-(-k // chunk))


@_njit_inline
def _step_keys_ms(q, c, sk):  # pragma: no cover - compiled
    """The format-4 step_keys term of a step's requests (q_r query tokens over c_r cached ones,
    prefill chunks included): padded key cells and split-K combine per kind, from the packed term
    (StepKeys.packed)."""
    programs, block, min_chunk, per_work = int(sk[0]), int(sk[1]), int(sk[2]), sk[3]
    n = 0
    for i in range(len(q)):
        n += q[i]
    out = 0.0
    for j in range((len(sk) - 4) // 5):
        b = 4 + 5 * j
        layers, ratio, cap, window, coef = int(sk[b]), int(sk[b + 1]), int(sk[b + 2]), int(sk[b + 3]), sk[b + 4]
        wmax = 0
        own = 0
        for i in range(len(q)):
            w = (c[i] + q[i]) // ratio if ratio > 0 else 0
            if cap > 0:
                w = min(cap, w)
            wmax = max(wmax, w)
            own += q[i] * w
        out += coef * (n * wmax - own) / 1e6
        out += layers * per_work * split_work(n, window + wmax, programs, block, min_chunk)
    return out


@_njit
def _sift_down(free, size, p, v):  # pragma: no cover - compiled
    """Put v at position p of the 4-ary min-heap ``free`` (of ``size`` entries) and sift it down."""
    while True:
        ch = 4 * p + 1
        if ch >= size:
            break
        best, bv = ch, free[ch]
        for x in range(ch + 1, ch + 4):
            if free[x] < bv:
                best, bv = x, free[x]
        if bv >= v:
            break
        free[p] = bv
        p = best
    free[p] = v


@_njit
def _makespan(c, L, kv_heads, qblocks, slots, longest):  # pragma: no cover - compiled
    """The makespan (in KV tokens) of the split-KV chunk CTAs of one step run as a list schedule
    over ``slots`` CTA slots: the grid's dispatch order (KV head, then request and its chunks in
    order, then query block), each CTA on the first slot to free up, taking its chunk's tokens
    (L, the last chunk of a request its remainder). One longest chunk where the CTAs fit in one
    wave. Else the first ``slots`` CTAs each start at 0 on a slot of their own (every slot is
    free at 0 until all are taken), and the rest go through a 4-ary min-heap of the slots' free
    times (one replace-and-sift per CTA; which of two equally free slots a CTA takes does not
    change the free times, so neither the result)."""
    R = len(c)
    m = 0
    for i in range(R):
        m += (max(c[i], 1) + L - 1) // L
    m *= qblocks
    if m * kv_heads <= slots:
        return float(longest)
    dur = np.empty(m, dtype=np.int64)  # one KV head's CTAs, in dispatch order
    t = 0
    for i in range(R):
        ci = max(c[i], 1)
        k = (ci + L - 1) // L
        for j in range(k):
            d = L if j < k - 1 else ci - (k - 1) * L
            for _b in range(qblocks):
                dur[t] = d
                t += 1
    # the heap padded to whole groups of 4 children with slots that never free up
    size = slots + (-(slots - 1) % 4)
    free = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    for x in range(slots):  # CTA x of the dispatch order (head x // m) on slot x, from 0
        free[x] = dur[x % m]
    for p in range((size - 2) // 4, -1, -1):  # heapify bottom-up
        _sift_down(free, size, p, free[p])
    for x in range(slots, m * kv_heads):  # the rest, each on the earliest-free slot
        _sift_down(free, size, np.int64(0), free[0] + dur[x % m])  # (not a literal: one specialization)
    mx = free[0]
    for x in range(slots):
        mx = max(mx, free[x])
    return float(mx)


@_njit
def _decode_features(q, c, g, kv_heads, block_rows, cap, balance, min_chunk, slots):  # pragma: no cover - compiled
    R = len(q)
    qmax = 0
    qsum = 0
    tot = 0
    cmax = 1
    for i in range(R):
        qmax = max(qmax, q[i])
        qsum += q[i]
        tot += max(c[i], 1)
        cmax = max(cmax, c[i])
    per = kv_heads * max(1, -(-(g * qmax) // block_rows))
    n_t = -(-cap // per)
    L = -(-tot // n_t)
    if balance > 0:
        L = min(L, int(math.ceil(balance * tot / R)))
    L = max(min_chunk, L)
    n_chunks = 0
    kmax = 0
    for i in range(R):
        k = (max(c[i], 1) + L - 1) // L
        n_chunks += k
        kmax = max(kmax, k)
    longest = min(L, max(cmax, 1))  # the longest chunk present
    tail = longest * slots / per  # over every slot
    # the SMs' busy time (wave capacity): the makespan of the chunk CTAs' list schedule times
    # the slots, in KV tokens of one chunk's CTAs
    cap_tok = _makespan(c, L, kv_heads, per // kv_heads, slots, longest) * slots / per
    return cap_tok / 1000.0, per * n_chunks / 1000.0, kmax * g * qsum * kv_heads / 1e6, float(R), tail / 1000.0


def prefill_pairs(q: int, c: int, a: AttentionTerms) -> float:
    """Wave-counted causal pairs / 1e6 of one prefill chunk of q tokens over c cached ones: the
    ceil(q / block rows) x query heads CTAs run in waves of SMs x prefill CTAs per SM, each wave
    priced as full; equal to the chunk's pairs q (c + q / 2) (block-rounded) when the CTAs fill
    the waves exactly."""
    qb = -(-int(q) // a.block_rows)
    slots = a.sms * a.prefill_ctas_per_sm
    waves = -(-(qb * a.query_heads) // slots)
    return waves * slots / a.query_heads * a.block_rows * (c + 0.5 * q) / 1e6


@dataclass(frozen=True)
class StepKeyKind:
    """One attention kind of a format-4 ``step_keys`` term (module doc)."""

    layers: int
    ratio: int  # compression ratio of the entries it selects from (0: the window only)
    cap: int  # most selected entries per token (0: every visible entry)
    window: int  # raw keys of the sliding window, on every token's list
    ms_per_mcell: float  # padded key cells (token x key), all layers of the kind


@dataclass(frozen=True)
class StepKeys:
    """A format-4 ``step_keys`` term (module doc): the split-K rule and the kinds' key lists."""

    programs: int
    block: int
    min_chunk: int
    combine_ms_per_work: float
    kinds: tuple  # of StepKeyKind

    def packed(self, cost_scale: float = 1.0) -> np.ndarray:
        """[programs, block, min_chunk, combine_ms_per_work, then layers, ratio, cap, window,
        ms_per_mcell per kind], times in ms x cost_scale: the compiled pricing's form (_step_keys_ms)."""
        head = [self.programs, self.block, self.min_chunk, self.combine_ms_per_work * cost_scale]
        body = [v for k in self.kinds for v in (k.layers, k.ratio, k.cap, k.window, k.ms_per_mcell * cost_scale)]
        return np.array(head + body, dtype=np.float64)


@dataclass(frozen=True)
class BlockPoolKind:
    """One compression ratio of a format-5 ``block_pool`` term (module doc)."""

    ratio: int  # tokens pooled into one compressed entry
    layers: int  # layers of this ratio (stated; the costs are over all of them)
    ms_per_step: float  # once a step whose decode requests complete a block of this ratio
    ms_per_block: float  # per completed block
    priced_from_q: int  # the request table's records complete such blocks from this q on (0: never)


@dataclass(frozen=True)
class BlockPool:
    """A format-5 ``block_pool`` term (module doc): what pooling completed blocks costs."""

    kinds: tuple  # of BlockPoolKind
    source: str = ""  # how it was measured

    def packed(self, cost_scale: float = 1.0) -> np.ndarray:
        """[kinds, then ratio, ms_per_step, ms_per_block, priced_from_q, layers per kind], times in
        ms x cost_scale: the compiled pricing's form (block_pool_ms)."""
        body = [
            v
            for k in self.kinds
            for v in (k.ratio, k.ms_per_step * cost_scale, k.ms_per_block * cost_scale, k.priced_from_q, k.layers)
        ]
        return np.array([len(self.kinds)] + body, dtype=np.float64)


_NO_I64 = np.zeros(1, dtype=np.int64)  # placeholders of context_args without a format-3 table
_NO_F64 = np.zeros(2, dtype=np.float64)
_NO_TAB = np.zeros((1, 1, 1), dtype=np.float64)


@dataclass(frozen=True)
class RequestAttention:
    """A profile's per-request attention table (format 3; see the module doc). step_ms[b, j, k]:
    the attention of one step of batch[b] requests, each q[j] query tokens over ctx[k] cached ones
    (all layers, ms); forward_share_ms[i]: that attention as priced inside forward.ms[i]."""

    batch: np.ndarray  # int64, strictly increasing, >= 1
    q: np.ndarray  # int64, strictly increasing, >= 1
    ctx: np.ndarray  # int64, strictly increasing, >= 0
    step_ms: np.ndarray  # float64 [len(batch), len(q), len(ctx)]
    forward_share_ms: np.ndarray  # float64, one per forward-table size
    source: str = ""  # how the table was made
    indexer_ratio: int = 0  # format 4 step_indexer: compression ratio of the indexed keys (0: none)
    indexer_ms_per_mcell: float = 0.0  # format 4 step_indexer: ms per million logits cells, all layers
    step_keys: StepKeys | None = None  # format 4 step_keys: the executor's step-wide key lists (module doc)
    block_pool: BlockPool | None = None  # format 5 block_pool: pooling completed compressed-cache blocks


def request_attention_ms(q: Any, ctx: Any, ra: RequestAttention) -> float:
    """(1 / R) sum_i step_ms(R, q_i, ctx_i) of R decode requests (module doc). q >= 1, ctx >= 0,
    equal-length integer sequences; 0 for none. One compiled pass over the requests."""
    qa = np.asarray(q, dtype=np.int64)
    if not qa.size:
        return 0.0
    return float(_request_attention(qa, np.asarray(ctx, dtype=np.int64), ra.batch, ra.q, ra.ctx, ra.step_ms))


@_njit_inline
def _bracket(x, v):  # pragma: no cover - compiled
    """(i0, i1, weight of i1) of v on increasing x: clamped below, extrapolated past the end."""
    n = len(x)
    if n == 1 or v <= x[0]:
        return 0, 0, 0.0
    if v >= x[n - 1]:
        return n - 2, n - 1, (v - x[n - 2]) / (x[n - 1] - x[n - 2])
    i = 1
    while x[i] < v:
        i += 1
    return i - 1, i, (v - x[i - 1]) / (x[i] - x[i - 1])


@_njit_inline
def _bilinear(tab, b, j0, j1, wq, k0, k1, wc):  # pragma: no cover - compiled
    lo = tab[b, j0, k0] + (tab[b, j0, k1] - tab[b, j0, k0]) * wc
    hi = tab[b, j1, k0] + (tab[b, j1, k1] - tab[b, j1, k0]) * wc
    return lo + (hi - lo) * wq


@_njit_inline
def _request_attention(q, c, bx, qx, cx, tab):  # pragma: no cover - compiled
    R = len(q)
    nb = len(bx)
    scale = 1.0
    if R >= bx[nb - 1]:  # past the table: the last batch's per-request cost
        b0, b1, wb = nb - 1, nb - 1, 0.0
        scale = R / bx[nb - 1]
    else:
        b0, b1, wb = _bracket(bx, R)
    tot = 0.0
    for i in range(R):
        j0, j1, wq = _bracket(qx, q[i])
        k0, k1, wc = _bracket(cx, c[i])
        v = (1.0 - wb) * _bilinear(tab, b0, j0, j1, wq, k0, k1, wc)
        if wb > 0.0:
            v += wb * _bilinear(tab, b1, j0, j1, wq, k0, k1, wc)
        tot += max(v, 0.0)
    return tot * scale / R


@dataclass(frozen=True)
class PrefillTerms:
    """``prefill_terms`` version 2 (module doc): what a step's prompt chunks add to the forward
    table's price of their tokens as decode tokens."""

    cached_ms_per_mpair: float = 0.0  # per million (chunk token, cached token) pairs, >= 0
    within_ms_per_mpair: float = 0.0  # per million causal pairs within the chunk (q^2 / 2), >= 0
    token_ms_per_ktok: float = 0.0  # per 1000 prompt tokens, signed
    ms_per_chunk: float = 0.0  # per chunk, >= 0
    ms_per_step: float = 0.0  # once per step with prompt chunks, >= 0
    own_keys_tokens: int = 0  # format 4 step_keys: a decode token's visible tokens (0: not priced)
    fit: dict = field(default_factory=dict, compare=False)  # how the terms were fitted (provenance)


PREFILL_V2_KEYS = (
    "version",
    "cached_ms_per_mpair",
    "within_ms_per_mpair",
    "token_ms_per_ktok",
    "ms_per_chunk",
    "ms_per_step",
    "own_keys_tokens",
)


@dataclass(frozen=True)
class Profile:
    name: str
    provenance: dict
    kv_cache_gib: float
    kv_bytes_per_token: float
    cpu_overhead_ms: float
    capture_sizes: tuple
    forward: Table
    kv_ms_per_ktok: float
    draft: dict = field(default_factory=dict)  # kind -> Table keyed by request count
    prefill_discount_ms_per_ktok: float = 0.0  # prefill_terms.discount_ms_per_ktok (see module doc)
    prefill_attn_ms_per_mpair: float = 0.0  # prefill_terms.attention_ms_per_mpair
    prefill_ms_per_chunk: float = 0.0  # prefill_terms.ms_per_chunk
    prefill_v2: PrefillTerms | None = None  # prefill_terms version 2 (replaces the three above)
    source_path: str = ""
    extra: dict = field(default_factory=dict)  # other keys kept for provenance (fit errors...)
    max_model_len: int | None = None  # longest prompt + output (None: not limited)
    format_version: int = 1
    attention: AttentionTerms | None = None  # format 2: per-request attention terms
    request_attention: RequestAttention | None = None  # format 3: per-request attention table

    @property
    def gpus_per_replica(self) -> int:
        return int(self.provenance.get("gpus_per_replica", 1))

    @property
    def kv_capacity_blocks(self) -> int:
        return int(self.kv_cache_gib * 2**30 // (self.kv_bytes_per_token * KV_BLOCK_TOKENS))

    @property
    def label(self) -> str:
        """One line saying what this profile is and how it was obtained."""
        p = self.provenance
        return (
            f"{self.name} [{p.get('kind')}] {p.get('model')} on {p.get('hardware')} "
            f"x{p.get('gpus_per_replica')} ({p.get('method')}, {p.get('date')})"
        )


MAX_STEP_TOKENS = 10_000_000  # a table's token / request sizes
MAX_COST_MS = 1e6  # any one cost (ms): more is not a step of an engine
MAX_KV_CACHE_GIB = 1e6  # a replica's KV cache (a PiB)
MAX_GPUS_PER_REPLICA = 4096
MAX_MODEL_LEN = 100_000_000


def _table(raw, doc, keys: tuple, xkey: str) -> Table:
    from dsim import schema as S

    S.mapping(raw, doc, *keys, required=(xkey, "ms"))
    x = S.number_list(raw[xkey], doc, *keys, xkey, lo=1, hi=MAX_STEP_TOKENS, ints=True, increasing=True)
    ms = S.number_list(raw["ms"], doc, *keys, "ms", lo=0, hi=MAX_COST_MS)
    if len(x) != len(ms):
        raise InputError(f"{doc.at(*keys, 'ms')}: has {len(ms)} values, {xkey} has {len(x)} (one cost per size)")
    return Table(np.asarray(x, dtype=np.float64), np.asarray(ms, dtype=np.float64))


def profile_from_dict(d: dict, path: str = "<profile>", doc: Doc | None = None) -> Profile:
    """Validate a parsed profile; raise InputError naming the file, line (when ``doc`` carries
    the file's line marks, as load_profile's does), field and bad value, one field at a time."""
    from dsim import schema as S

    doc = doc if doc is not None else S.Doc(str(path))
    if not isinstance(d, dict):
        raise InputError(f"{doc.at()}: not a mapping (a profile has name, provenance, memory, ...)")
    for key in ("name", "provenance", "memory", "capture_sizes", "forward", "kv_ms_per_ktok", "cpu_overhead_ms"):
        if key not in d:
            raise InputError(f"{doc.at()}: missing field '{key}'")
    name = S.text(d["name"], doc, "name")
    prov = S.mapping(d["provenance"], doc, "provenance", required=PROVENANCE_FIELDS)
    if prov["kind"] not in PROFILE_KINDS:
        raise InputError(
            f"{doc.at('provenance', 'kind')}: must be {', '.join(PROFILE_KINDS[:-1])} or {PROFILE_KINDS[-1]}, "
            f"got {plain(prov['kind'])}"
        )
    gpr = S.integer(prov["gpus_per_replica"], doc, "provenance", "gpus_per_replica", lo=1, hi=MAX_GPUS_PER_REPLICA)
    prov = dict(prov, gpus_per_replica=gpr)
    mem = S.mapping(d["memory"], doc, "memory", required=("kv_cache_gib", "kv_bytes_per_token"))
    kv_gib = S.number(mem["kv_cache_gib"], doc, "memory", "kv_cache_gib", lo=0, lo_open=True, hi=MAX_KV_CACHE_GIB)
    kv_bpt = S.number(mem["kv_bytes_per_token"], doc, "memory", "kv_bytes_per_token", lo=1)
    caps = S.number_list(d["capture_sizes"], doc, "capture_sizes", lo=1, hi=MAX_STEP_TOKENS, ints=True, increasing=True)
    fwd = _table(d["forward"], doc, ("forward",), "tokens")
    missing = sorted(set(caps) - set(fwd.x.astype(int).tolist()))
    if missing:
        raise InputError(f"{doc.at('forward', 'tokens')}: capture sizes {missing[:5]} not profiled")
    draft = {}
    raw_draft = d.get("draft")
    if raw_draft is not None:
        S.mapping(raw_draft, doc, "draft")
        for kind, raw in raw_draft.items():
            if kind not in DRAFT_KINDS and kind not in DRAFT_LENGTH_KINDS:
                raise InputError(
                    f"{doc.at('draft', kind)}: unknown draft kind (known: {', '.join(DRAFT_KINDS)}, dspark@K)"
                )
            draft[kind] = _table(raw, doc, ("draft", kind), "requests")
    kv_slope = S.number(d["kv_ms_per_ktok"], doc, "kv_ms_per_ktok", lo=0, hi=MAX_COST_MS)
    cpu = S.number(d["cpu_overhead_ms"], doc, "cpu_overhead_ms", lo=0, hi=MAX_COST_MS)
    max_len = None
    if d.get("max_model_len") is not None:
        max_len = S.integer(d["max_model_len"], doc, "max_model_len", lo=1, hi=MAX_MODEL_LEN)
    elif prov.get("max_model_len") is not None:
        max_len = S.integer(prov["max_model_len"], doc, "provenance", "max_model_len", lo=1, hi=MAX_MODEL_LEN)
    else:
        max_len, src = model_context(prov.get("model"))
        if max_len is not None:
            prov = dict(prov, max_model_len_source=src)
    disc, attn, per_chunk, prefill_v2 = _prefill_terms(d.get("prefill_terms"), doc)
    version = 1
    if d.get("format_version") is not None:
        version = S.integer(d["format_version"], doc, "format_version", lo=1, hi=max(FORMAT_VERSIONS))
    attention = None
    if d.get("attention") is not None:
        if version < 2:
            raise InputError(f"{doc.at('attention')}: needs format_version: 2")
        attention = _attention_terms(d["attention"], doc)
    request_attention = None
    if d.get("request_attention") is not None:
        if version < 3:
            raise InputError(f"{doc.at('request_attention')}: needs format_version: 3")
        request_attention = _request_attention_table(d["request_attention"], doc, len(fwd.x))
        if request_attention.indexer_ratio and version < 4:
            raise InputError(f"{doc.at('request_attention', 'step_indexer')}: needs format_version: 4")
        if request_attention.step_keys and version < 4:
            raise InputError(f"{doc.at('request_attention', 'step_keys')}: needs format_version: 4")
        if request_attention.block_pool and version < 5:
            raise InputError(f"{doc.at('request_attention', 'block_pool')}: needs format_version: 5")
    if (
        prefill_v2 is not None
        and prefill_v2.own_keys_tokens
        and (request_attention is None or not request_attention.step_keys)
    ):
        raise InputError(f"{doc.at('prefill_terms', 'own_keys_tokens')}: needs request_attention.step_keys (format 4)")
    bound, bound_key = disc, "discount_ms_per_ktok"
    if prefill_v2 is not None:
        bound, bound_key = prefill_discount_bound_ms_per_ktok(prefill_v2, request_attention), "token_ms_per_ktok"
    # A prompt token's discount cannot exceed what the table charges a token: at every size the
    # forward cost must cover n discounted tokens (else a prefill step would cost less than nothing).
    bad = np.flatnonzero(fwd.ms < bound * fwd.x / 1000.0 - 1e-9)
    if len(bad):
        i = int(bad[0])
        what = (
            f"{bound:g}"
            if prefill_v2 is None
            else f"{prefill_v2.token_ms_per_ktok:g} (a prompt token {bound:g} ms per 1000 below a decode token)"
        )
        raise InputError(
            f"{doc.at('prefill_terms', bound_key)} {what}: exceeds forward.ms[{i}] "
            f"= {fwd.ms[i]:g} ms for {int(fwd.x[i])} tokens (inconsistent profile)"
        )
    known = {
        "name",
        "provenance",
        "memory",
        "capture_sizes",
        "forward",
        "kv_ms_per_ktok",
        "cpu_overhead_ms",
        "draft",
        "prefill_terms",
        "max_model_len",
        "format_version",
        "attention",
        "request_attention",
    }
    return Profile(
        name=name,
        provenance=prov,
        kv_cache_gib=kv_gib,
        kv_bytes_per_token=kv_bpt,
        cpu_overhead_ms=cpu,
        capture_sizes=tuple(caps),
        forward=fwd,
        kv_ms_per_ktok=kv_slope,
        draft=draft,
        prefill_discount_ms_per_ktok=disc,
        prefill_attn_ms_per_mpair=attn,
        prefill_ms_per_chunk=per_chunk,
        prefill_v2=prefill_v2,
        source_path=str(path),
        extra={k: v for k, v in d.items() if k not in known},
        max_model_len=max_len,
        format_version=version,
        attention=attention,
        request_attention=request_attention,
    )


REQUEST_ATTENTION_KEYS = ("batch", "q", "ctx", "step_ms", "forward_share_ms")


def _request_attention_table(raw: Any, doc: Any, n_forward: int) -> RequestAttention:
    from dsim import schema as S

    S.mapping(raw, doc, "request_attention", required=REQUEST_ATTENTION_KEYS)
    unknown = sorted(set(raw) - set(REQUEST_ATTENTION_KEYS) - {"source", "step_indexer", "step_keys", "block_pool"})
    if unknown:
        raise InputError(
            f"{doc.at('request_attention', unknown[0])}: unknown field (known: {', '.join(REQUEST_ATTENTION_KEYS)}, source, step_indexer, step_keys, block_pool)"
        )
    axes = {}
    for k, lo in (("batch", 1), ("q", 1), ("ctx", 0)):
        axes[k] = np.asarray(
            S.number_list(raw[k], doc, "request_attention", k, lo=lo, hi=MAX_MODEL_LEN, ints=True, increasing=True),
            dtype=np.int64,
        )
    shape = (len(axes["batch"]), len(axes["q"]), len(axes["ctx"]))
    rows = raw["step_ms"]
    if not isinstance(rows, list) or len(rows) != shape[0]:
        raise InputError(f"{doc.at('request_attention', 'step_ms')}: {shape[0]} rows (one per batch) of q x ctx costs")
    tab = np.empty(shape)
    for b, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != shape[1]:
            raise InputError(f"{doc.at('request_attention', 'step_ms', b)}: {shape[1]} rows (one per q) of ctx costs")
        for j, cell in enumerate(row):
            v = S.number_list(cell, doc, "request_attention", "step_ms", b, j, lo=0, hi=MAX_COST_MS)
            if len(v) != shape[2]:
                raise InputError(
                    f"{doc.at('request_attention', 'step_ms', b, j)}: has {len(v)} values, ctx has {shape[2]}"
                )
            tab[b, j] = v
    share = S.number_list(raw["forward_share_ms"], doc, "request_attention", "forward_share_ms", lo=0, hi=MAX_COST_MS)
    if len(share) != n_forward:
        raise InputError(
            f"{doc.at('request_attention', 'forward_share_ms')}: has {len(share)} values, forward.tokens has {n_forward}"
        )
    src = raw.get("source", "")
    ratio, mcell = 0, 0.0
    if raw.get("step_indexer") is not None:
        si = raw["step_indexer"]
        S.mapping(si, doc, "request_attention", "step_indexer", required=("ratio", "ms_per_mcell"))
        extra = sorted(set(si) - {"ratio", "ms_per_mcell"})
        if extra:
            raise InputError(
                f"{doc.at('request_attention', 'step_indexer', extra[0])}: unknown field (known: ratio, ms_per_mcell)"
            )
        ratio = S.integer(si["ratio"], doc, "request_attention", "step_indexer", "ratio", lo=1, hi=MAX_MODEL_LEN)
        mcell = S.number(
            si["ms_per_mcell"], doc, "request_attention", "step_indexer", "ms_per_mcell", lo=0, hi=MAX_COST_MS
        )
    return RequestAttention(
        axes["batch"],
        axes["q"],
        axes["ctx"],
        tab,
        np.asarray(share, dtype=np.float64),
        str(src) if src else "",
        indexer_ratio=int(ratio),
        indexer_ms_per_mcell=float(mcell),
        step_keys=_step_keys(raw["step_keys"], doc) if raw.get("step_keys") is not None else None,
        block_pool=_block_pool(raw["block_pool"], doc) if raw.get("block_pool") is not None else None,
    )


def priced_from_q(ratio: int, q_grid, ctx_grid) -> int:
    """The smallest q of the per-request table at which every record's requests complete a block of
    ``ratio`` (their c + q crosses a multiple of it at every table context), 0 if none does: the
    records from that q on already carry the pooling (module doc, format 5)."""
    for q in q_grid:
        if all((int(c) + int(q)) // ratio > int(c) // ratio for c in ctx_grid):
            return int(q)
    return 0


def _kind_entries(raw: Any, doc: Any, at: tuple, fields: tuple, what: str) -> list[tuple[int, dict]]:
    """(index, mapping) of a term's non-empty ``kinds`` list, each entry holding exactly ``fields``."""
    from dsim import schema as S

    kinds_raw = raw["kinds"]
    if not isinstance(kinds_raw, list) or not kinds_raw:
        raise InputError(f"{doc.at(*at, 'kinds')}: must be a non-empty list of {what}")
    for i, kr in enumerate(kinds_raw):
        S.mapping(kr, doc, *at, "kinds", i, required=fields)
        extra = sorted(set(kr) - set(fields))
        if extra:
            raise InputError(f"{doc.at(*at, 'kinds', i, extra[0])}: unknown field (known: {', '.join(fields)})")
    return list(enumerate(kinds_raw))


BLOCK_POOL_KIND_FIELDS = ("ratio", "layers", "ms_per_step", "ms_per_block", "priced_from_q")


def _block_pool(raw: Any, doc: Any) -> BlockPool:
    from dsim import schema as S

    at = ("request_attention", "block_pool")
    S.mapping(raw, doc, *at, required=("kinds",))
    extra = sorted(set(raw) - {"kinds", "source"})
    if extra:
        raise InputError(f"{doc.at(*at, extra[0])}: unknown field (known: kinds, source)")
    kinds = []
    for i, kr in _kind_entries(raw, doc, at, BLOCK_POOL_KIND_FIELDS, "compression ratios"):
        kinds.append(
            BlockPoolKind(
                ratio=S.integer(kr["ratio"], doc, *at, "kinds", i, "ratio", lo=1, hi=MAX_MODEL_LEN),
                layers=S.integer(kr["layers"], doc, *at, "kinds", i, "layers", lo=0, hi=100000),
                ms_per_step=S.number(kr["ms_per_step"], doc, *at, "kinds", i, "ms_per_step", lo=0, hi=MAX_COST_MS),
                ms_per_block=S.number(kr["ms_per_block"], doc, *at, "kinds", i, "ms_per_block", lo=0, hi=MAX_COST_MS),
                priced_from_q=S.integer(
                    kr["priced_from_q"], doc, *at, "kinds", i, "priced_from_q", lo=0, hi=MAX_MODEL_LEN
                ),
            )
        )
    ratios = [k.ratio for k in kinds]
    if len(set(ratios)) != len(ratios):
        raise InputError(f"{doc.at(*at, 'kinds')}: ratio {ratios} repeats a compression ratio")
    src = raw.get("source", "")
    return BlockPool(kinds=tuple(kinds), source=str(src) if src else "")


STEP_KEYS_FIELDS = ("programs", "block", "min_chunk", "combine_ms_per_work", "kinds")
STEP_KEY_KIND_FIELDS = ("layers", "ratio", "cap", "window", "ms_per_mcell")


def _step_keys(raw: Any, doc: Any) -> StepKeys:
    from dsim import schema as S

    at = ("request_attention", "step_keys")
    S.mapping(raw, doc, *at, required=STEP_KEYS_FIELDS)
    extra = sorted(set(raw) - set(STEP_KEYS_FIELDS))
    if extra:
        raise InputError(f"{doc.at(*at, extra[0])}: unknown field (known: {', '.join(STEP_KEYS_FIELDS)})")
    kinds = []
    for i, kr in _kind_entries(raw, doc, at, STEP_KEY_KIND_FIELDS, "attention kinds"):
        kinds.append(
            StepKeyKind(
                layers=S.integer(kr["layers"], doc, *at, "kinds", i, "layers", lo=0, hi=100000),
                ratio=S.integer(kr["ratio"], doc, *at, "kinds", i, "ratio", lo=0, hi=MAX_MODEL_LEN),
                cap=S.integer(kr["cap"], doc, *at, "kinds", i, "cap", lo=0, hi=MAX_MODEL_LEN),
                window=S.integer(kr["window"], doc, *at, "kinds", i, "window", lo=0, hi=MAX_MODEL_LEN),
                ms_per_mcell=S.number(kr["ms_per_mcell"], doc, *at, "kinds", i, "ms_per_mcell", lo=0, hi=MAX_COST_MS),
            )
        )
    return StepKeys(
        programs=S.integer(raw["programs"], doc, *at, "programs", lo=1, hi=10**7),
        block=S.integer(raw["block"], doc, *at, "block", lo=1, hi=MAX_MODEL_LEN),
        min_chunk=S.integer(raw["min_chunk"], doc, *at, "min_chunk", lo=1, hi=MAX_MODEL_LEN),
        combine_ms_per_work=S.number(raw["combine_ms_per_work"], doc, *at, "combine_ms_per_work", lo=0, hi=MAX_COST_MS),
        kinds=tuple(kinds),
    )


def _attention_terms(raw: Any, doc: Any) -> AttentionTerms:
    from dsim import schema as S

    fields = ATTENTION_SPLIT_FIELDS + ATTENTION_OCC_FIELDS + ATTENTION_COEF_FIELDS
    S.mapping(raw, doc, "attention", required=fields)
    fields = fields + ATTENTION_OPTIONAL_FIELDS
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise InputError(f"{doc.at('attention', unknown[0])}: unknown field (known: {', '.join(fields)})")
    v: dict[str, Any] = {}
    for k in ("query_heads", "kv_heads", "sms", "min_chunk", "block_rows") + ATTENTION_OCC_FIELDS:
        v[k] = S.integer(raw[k], doc, "attention", k, lo=1, hi=1 << 20)
    v["fill"] = S.number(raw["fill"], doc, "attention", "fill", lo=0, lo_open=True, hi=1e3)
    v["balance"] = S.number(raw["balance"], doc, "attention", "balance", lo=0, hi=1e3)
    for k in ATTENTION_COEF_FIELDS:
        v[k] = S.number(raw[k], doc, "attention", k, lo=0, hi=MAX_COST_MS)
    for k in ATTENTION_OPTIONAL_FIELDS:
        if k in raw:
            v[k] = S.number(raw[k], doc, "attention", k, lo=0, hi=MAX_COST_MS)
    if v["query_heads"] % v["kv_heads"]:
        raise InputError(f"{doc.at('attention', 'kv_heads')}: {v['kv_heads']} does not divide query_heads")
    return AttentionTerms(**v)


PREFILL_KEYS = ("discount_ms_per_ktok", "attention_ms_per_mpair", "ms_per_chunk")


def _prefill_terms(raw, doc) -> tuple[float, float, float, PrefillTerms | None]:
    from dsim import schema as S

    if raw is None:
        return 0.0, 0.0, 0.0, None
    if isinstance(raw, dict) and "version" in raw:
        ver = S.integer(raw["version"], doc, "prefill_terms", "version", lo=2, hi=2)
        if set(raw) - set(PREFILL_V2_KEYS):
            bad = sorted(set(raw) - set(PREFILL_V2_KEYS))[0]
            raise InputError(
                f"{doc.at('prefill_terms', bad)}: not a version-{ver} key (known: {', '.join(PREFILL_V2_KEYS)})"
            )
        v = {
            key: S.number(raw.get(key, 0.0), doc, "prefill_terms", key, lo=0, hi=MAX_COST_MS)
            for key in ("cached_ms_per_mpair", "within_ms_per_mpair", "ms_per_chunk", "ms_per_step")
        }
        tok = S.number(
            raw.get("token_ms_per_ktok", 0.0),
            doc,
            "prefill_terms",
            "token_ms_per_ktok",
            lo=-MAX_COST_MS,
            hi=MAX_COST_MS,
        )
        own = S.integer(
            raw.get("own_keys_tokens", 0), doc, "prefill_terms", "own_keys_tokens", lo=0, hi=MAX_STEP_TOKENS
        )
        return 0.0, 0.0, 0.0, PrefillTerms(token_ms_per_ktok=tok, own_keys_tokens=own, **v)
    if not isinstance(raw, dict) or set(raw) - set(PREFILL_KEYS):
        raise InputError(
            f"{doc.at('prefill_terms')}: a mapping of {', '.join(PREFILL_KEYS)} (or version: 2 and its keys)"
        )
    disc, attn, chunk = (
        S.number(raw.get(key, 0.0), doc, "prefill_terms", key, lo=0, hi=MAX_COST_MS) for key in PREFILL_KEYS
    )
    return disc, attn, chunk, None


def _own_key_cells(n_visible: int, ratio: int, cap: int) -> int:
    """Key entries beyond the window of a token over n_visible tokens (a step-keys kind)."""
    if not ratio:
        return 0
    w = n_visible // ratio
    return min(cap, w) if cap else w


def own_keys_ms(q: int, c: int, pt: PrefillTerms, ra: RequestAttention | None) -> float:
    """A chunk's own key lists beyond a decode token's (prefill_terms version 2, own_keys_tokens;
    module doc): the step-keys kinds' and the step indexer's cells at c + q visible tokens less
    those at own_keys_tokens, q tokens, at their ms per million cells. May be negative (a short
    chunk over no cache has shorter lists than the decode token it was priced as)."""
    if not pt.own_keys_tokens or ra is None or not ra.step_keys:
        return 0.0
    d, v = pt.own_keys_tokens, c + q
    out = 0.0
    for k in ra.step_keys.kinds:
        out += k.ms_per_mcell * (_own_key_cells(v, k.ratio, k.cap) - _own_key_cells(d, k.ratio, k.cap))
    if ra.indexer_ratio:
        r = ra.indexer_ratio
        out += ra.indexer_ms_per_mcell * (max(1, v // r) - max(1, d // r))
    return q * out / 1e6


def prefill_discount_bound_ms_per_ktok(pt: PrefillTerms, ra: RequestAttention | None) -> float:
    """The most a prompt token can cost less than a decode token under version-2 terms (ms per
    1000): a negative per-token term plus the decode token's own key cells (a chunk's own lists
    are at least empty), checked against the forward table as the version-1 discount is."""
    out = max(0.0, -pt.token_ms_per_ktok)
    # a chunk's own lists are shortest at one visible token
    return out + max(0.0, -1000.0 * own_keys_ms(1, 0, pt, ra))


def profile_to_dict(p: Profile) -> dict:
    d = {
        "name": p.name,
        "provenance": dict(p.provenance),
        "memory": {"kv_cache_gib": float(p.kv_cache_gib), "kv_bytes_per_token": float(p.kv_bytes_per_token)},
        "cpu_overhead_ms": float(p.cpu_overhead_ms),
        "capture_sizes": [int(c) for c in p.capture_sizes],
        "forward": {"tokens": [int(x) for x in p.forward.x], "ms": [round(float(v), 5) for v in p.forward.ms]},
        "kv_ms_per_ktok": float(p.kv_ms_per_ktok),
    }
    if p.max_model_len is not None:
        d["max_model_len"] = int(p.max_model_len)
    if p.prefill_discount_ms_per_ktok or p.prefill_attn_ms_per_mpair or p.prefill_ms_per_chunk:
        d["prefill_terms"] = {
            "discount_ms_per_ktok": float(p.prefill_discount_ms_per_ktok),
            "attention_ms_per_mpair": float(p.prefill_attn_ms_per_mpair),
        }
        if p.prefill_ms_per_chunk:
            d["prefill_terms"]["ms_per_chunk"] = float(p.prefill_ms_per_chunk)
    if p.prefill_v2 is not None:
        t = p.prefill_v2
        d["prefill_terms"] = {"version": 2}
        for key in PREFILL_V2_KEYS[1:]:
            v = getattr(t, key)
            if v:
                d["prefill_terms"][key] = int(v) if key == "own_keys_tokens" else round(float(v), 6)
    if p.format_version != 1:
        d["format_version"] = int(p.format_version)
    if p.attention is not None:
        d["attention"] = {k: getattr(p.attention, k) for k in ATTENTION_SPLIT_FIELDS + ATTENTION_OCC_FIELDS}
        d["attention"].update({k: float(getattr(p.attention, k)) for k in ATTENTION_COEF_FIELDS})
        d["attention"].update(
            {k: float(getattr(p.attention, k)) for k in ATTENTION_OPTIONAL_FIELDS if getattr(p.attention, k)}
        )
    if p.request_attention is not None:
        ra = p.request_attention
        d["request_attention"] = {
            "batch": [int(x) for x in ra.batch],
            "q": [int(x) for x in ra.q],
            "ctx": [int(x) for x in ra.ctx],
            "step_ms": [[[round(float(v), 5) for v in cell] for cell in row] for row in ra.step_ms],
            "forward_share_ms": [round(float(v), 5) for v in ra.forward_share_ms],
        }
        if ra.source:
            d["request_attention"]["source"] = ra.source
        if ra.indexer_ratio:
            d["request_attention"]["step_indexer"] = {
                "ratio": int(ra.indexer_ratio),
                "ms_per_mcell": float(ra.indexer_ms_per_mcell),
            }
        if ra.step_keys:
            sk = ra.step_keys
            d["request_attention"]["step_keys"] = {
                "programs": int(sk.programs),
                "block": int(sk.block),
                "min_chunk": int(sk.min_chunk),
                "combine_ms_per_work": float(sk.combine_ms_per_work),
                "kinds": [
                    {
                        f: (float(getattr(k, f)) if f == "ms_per_mcell" else int(getattr(k, f)))
                        for f in STEP_KEY_KIND_FIELDS
                    }
                    for k in sk.kinds
                ],
            }
    if p.request_attention is not None and p.request_attention.block_pool is not None:
        bp = p.request_attention.block_pool
        d["request_attention"]["block_pool"] = {
            "kinds": [
                {
                    f: (round(float(getattr(k, f)), 5) if f.startswith("ms_") else int(getattr(k, f)))
                    for f in BLOCK_POOL_KIND_FIELDS
                }
                for k in bp.kinds
            ]
        }
        if bp.source:
            d["request_attention"]["block_pool"]["source"] = bp.source
    if p.draft:
        d["draft"] = {
            k: {"requests": [int(x) for x in t.x], "ms": [round(float(v), 5) for v in t.ms]} for k, t in p.draft.items()
        }
    d.update(p.extra)
    return d


def save_profile(p: Profile, path: str | Path, what: str = "--out") -> None:
    """Write whole or not at all, never over anything but a regular file (dsim.outputs)."""
    from dsim.outputs import write_file

    write_file(path, yaml.safe_dump(profile_to_dict(p), sort_keys=False, width=120), what)


def _profile_dir() -> Path:
    """profiles/ of the source checkout dsim runs from, else the copy installed as dsim/profiles."""
    here = Path(__file__).resolve().parents[1]  # the dsim package
    if (here.parent / "pyproject.toml").is_file() and (here.parent / "profiles").is_dir():
        return here.parent / "profiles"
    return here / "profiles"


PROFILE_DIR = _profile_dir()
DEFAULT_PROFILE = "deepseek-v4-flash-h200-dp8-ep8"


def resolve_profile_path(name_or_path: str) -> Path:
    """A YAML path, a shipped profile's name, or a model name (llama-3.1-8b, qwen3-8b, ...): the
    measured H200 profile of that model where one exists, else its analytical one (the fallback)."""
    s = str(name_or_path)
    if not s.strip():
        raise InputError("--profile: empty (a profile name or a .yaml path)")
    p = Path(s).expanduser()
    pathlike = p.suffix.lower() in (".yaml", ".yml", ".json") or "/" in s or "\\" in s
    if not pathlike:
        for stem in (s, f"h200-{s}", f"analytical-{s}-h200x1"):
            for cand in sorted(PROFILE_DIR.rglob(f"{stem}.yaml")):
                if "models" not in cand.parts:
                    return cand
    if p.is_dir():
        raise InputError(f"{p}: is a directory, not a profile file")
    if p.is_file():
        return p
    if pathlike:
        raise InputError(f"{p}: profile file not found")
    known = sorted(q.stem for q in PROFILE_DIR.rglob("*.yaml") if "models" not in q.parts)
    raise InputError(f"{s}: profile not found (a .yaml path or one of: {', '.join(known)})")


def load_profile(name_or_path: str | None = None) -> Profile:
    """A validated profile by name or path; its max_model_len defaults to the profile's
    provenance.max_model_len, else none (requests limited by the KV cache only)."""
    from dsim import schema as S

    path = resolve_profile_path(DEFAULT_PROFILE if name_or_path is None else name_or_path)
    d, doc = S.read_document(path, kind="json" if path.suffix.lower() == ".json" else "yaml")
    return profile_from_dict(d, str(path), doc)


@functools.lru_cache(maxsize=64)
def model_context(model: Any) -> tuple[int | None, str]:
    """(max_model_len, where it came from) for a profile that carries none: the model config's
    max_position_embeddings (profiles/models/MODEL.json), what vLLM takes as max_model_len when
    it is not given. (None, "") for a model without a shipped config."""
    from dsim.profiling.models import MODEL_DIR

    if not isinstance(model, str) or not model or "/" in model or model.startswith("."):
        return None, ""
    p = MODEL_DIR / f"{model}.json"
    try:
        cfg = json.loads(p.read_text(encoding="utf-8")) if p.is_file() and p.stat().st_size < 1 << 20 else None
    except (OSError, ValueError):
        return None, ""
    n = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_MODEL_LEN:
        return None, ""
    return n, (
        f"max_position_embeddings of profiles/models/{model}.json (the profile carries no max_model_len; "
        "vLLM's default)"
    )


def draft_extrapolation_slope(x: np.ndarray, ms: np.ndarray) -> float:
    """ms per request past a drafter table's last size: the least-squares slope of its top quarter
    (sizes >= 3/4 of the last; at least the last two points), >= 0. x: increasing sizes. One slope over the last
    two points of a fine grid (vLLM's capture sizes end 496, 512) would carry their timing noise
    to every larger batch; on a power-of-two grid the top quarter is those two points."""
    if len(x) < 2:
        return 0.0
    top = x >= 0.75 * x[-1]
    if top.sum() < 2:
        top = np.zeros(len(x), dtype=bool)
        top[-2:] = True
    xs, ys = x[top].astype(float), ms[top].astype(float)
    dx = xs - xs.mean()
    var = float((dx * dx).sum())
    if var <= 0.0:  # one size repeated (a loaded table's sizes are strictly increasing)
        return 0.0
    return max(float((dx * (ys - ys.mean())).sum()) / var, 0.0)


class CostModel:
    """Answers "how long does this step take" for one replica.

    step_ms(n_tokens, kv_tokens): target forward of n_tokens tokens reading kv_tokens KV entries,
    vectorized over numpy arrays, every token priced as a decode/verify token; a step with prefill
    chunks adds ``prefill_ms(chunks)``. Does not include drafting or CPU scheduling overhead.
    """

    def __init__(self, profile: Profile, cost_scale: float = 1.0):
        self.profile = profile
        x = profile.forward.x
        ms = np.maximum.accumulate(profile.forward.ms) * cost_scale  # vLLM: force non-decreasing
        self.limit = int(profile.capture_sizes[-1])
        self.kv_ms_per_tok = profile.kv_ms_per_ktok * cost_scale / 1000.0
        self.cpu_overhead_ms = profile.cpu_overhead_ms
        self.prefill_discount_ms_per_tok = profile.prefill_discount_ms_per_ktok * cost_scale / 1000.0
        self.prefill_attn_ms_per_pair = profile.prefill_attn_ms_per_mpair * cost_scale / 1e6
        self.prefill_ms_per_chunk = profile.prefill_ms_per_chunk * cost_scale
        self.attention = a = profile.attention
        self._split_kv_terms = a is not None and bool(
            a.wave_ms_per_ktok
            or a.chunk_ms_per_kcta
            or a.merge_ms_per_mcell
            or a.ms_per_request
            or a.tail_ms_per_ktok
            or a.decode_step_ms
        )
        self._req_coef = (
            (a.ms_per_request * cost_scale, a.tail_ms_per_ktok * cost_scale, a.decode_step_ms * cost_scale)
            if a is not None
            else (0.0, 0.0, 0.0)
        )
        self.request_attention = ra = profile.request_attention
        self.has_context_terms = self._split_kv_terms or ra is not None
        self._context_args: tuple | None = None
        self._compiled_args: tuple | None = None  # context_args past its on flag (context_ms's call)
        # context_ms reads the step's prefill chunks only for a format-4 step indexer
        self.context_reads_chunks = bool(ra is not None and (ra.indexer_ratio or ra.step_keys or ra.block_pool))
        self._step_keys = ra.step_keys.packed(cost_scale) if ra is not None and ra.step_keys else None
        self._block_pool = ra.block_pool.packed(cost_scale) if ra is not None and ra.block_pool else np.zeros(1)
        self._ctx_coef = (
            (a.wave_ms_per_ktok * cost_scale, a.chunk_ms_per_kcta * cost_scale, a.merge_ms_per_mcell * cost_scale)
            if a is not None
            else (0.0, 0.0, 0.0)
        )
        self._wpair_ms = a.prefill_ms_per_mpair * cost_scale if a is not None else 0.0
        self._prefill_v2 = pt = profile.prefill_v2
        if pt is not None:
            # per chunk: cached pairs, within pairs, per token, per chunk; per step; own-key cells at the
            # profile's step-keys and indexer prices (those carry cost_scale through their own tables)
            self._v2_coef = (
                pt.cached_ms_per_mpair * cost_scale / 1e6,
                pt.within_ms_per_mpair * cost_scale / 2e6,
                pt.token_ms_per_ktok * cost_scale / 1000.0,
                pt.ms_per_chunk * cost_scale,
                pt.ms_per_step * cost_scale,
            )
            self._v2_own = (pt, profile.request_attention, cost_scale) if pt.own_keys_tokens else None
        self.has_prefill_terms = bool(
            self.prefill_discount_ms_per_tok
            or self.prefill_attn_ms_per_pair
            or self.prefill_ms_per_chunk
            or self._wpair_ms
            or (pt is not None and (any(self._v2_coef) or self._v2_own is not None))
        )
        # Dense lookup up to the limit: the next profiled size at or above n (graph padding).
        n = np.arange(self.limit + 1)
        idx = np.searchsorted(x, np.maximum(n, 1), side="left")
        self._below = ms[np.minimum(idx, len(x) - 1)]
        self._below_list = self._below.tolist()
        # Above the limit: interpolate over points >= limit, extrapolate the last slope.
        above = x >= self.limit
        self._ax = x[above]
        self._ams = ms[above]
        if len(self._ax) >= 2:
            self._slope = (self._ams[-1] - self._ams[-2]) / (self._ax[-1] - self._ax[-2])
        else:  # only the limit point: extrapolate the slope of the last two points overall
            self._slope = (ms[-1] - ms[-2]) / (x[-1] - x[-2]) if len(x) >= 2 else 0.0
        self._slope = float(max(self._slope, 0.0))
        if pt is not None:
            bound = prefill_discount_bound_ms_per_ktok(pt, profile.request_attention) * cost_scale / 1000.0
            if bound > self._slope + 1e-12:
                raise InputError(
                    f"{profile.source_path or profile.name}: prefill_terms (version 2) let a prompt token cost "
                    f"{bound / cost_scale * 1000:g} ms per 1000 tokens less than a decode token: more than the forward "
                    f"table's last slope ({self._slope / cost_scale * 1000:g}, extrapolated past {int(x[-1])} tokens) "
                    "(inconsistent profile)"
                )
        if self.prefill_discount_ms_per_tok > self._slope + 1e-12:
            # past the table the last slope is extrapolated: it must also pay for a prompt token's
            # discount, else a large prefill step would cost less than nothing
            raise InputError(
                f"{profile.source_path or profile.name}: prefill_terms.discount_ms_per_ktok "
                f"{profile.prefill_discount_ms_per_ktok:g}: exceeds the forward table's last slope "
                f"({self._slope / cost_scale * 1000:g} ms per 1000 tokens, extrapolated past "
                f"{int(x[-1])} tokens) (inconsistent profile)"
            )
        self._ax_list, self._ams_list = self._ax.tolist(), self._ams.tolist()
        self._above_memo: dict[int, float] = {}  # step_ms_one's sizes above the limit, as read
        if ra is not None:
            # format 3: the step's own attention replaces the share the forward table priced it at, looked
            # up at the size forward_ms looks up (the next profiled size to the limit, interpolated above)
            self._ra_tab = np.ascontiguousarray(ra.step_ms * cost_scale)
            share = ra.forward_share_ms * cost_scale
            self._share_below = share[np.minimum(idx, len(x) - 1)].tolist()
            self._share_ax, self._share_ams = x[above], share[above]
        # The whole curve up to a large step as one array: the verify-budget policies evaluate
        # it at every b in 0..R*K each step.
        grid = np.arange(DENSE_TOKENS + 1)
        self._dense = self._below[np.minimum(grid, self.limit)].copy()
        self._dense[self.limit + 1 :] = self._above(grid[self.limit + 1 :])
        self._draft = {}
        self._draft_slope = {}
        for kind, t in profile.draft.items():
            self._draft[kind] = (t.x, np.maximum.accumulate(t.ms) * cost_scale)
            self._draft_slope[kind] = draft_extrapolation_slope(*self._draft[kind])

    def prefill_ms(self, chunks: Any) -> float:
        """What a step's prefill chunks add to step_ms (which prices every token as a decode
        token): for each (q, c), q new prompt tokens over c cached ones, -discount x q + attention
        x q (c + q / 2) + ms_per_chunk. 0 without prefill terms. Postcondition: step_ms + prefill_ms >= 0 for the
        chunks of any step (the table covers the discount at every profiled size, checked by
        profile_from_dict, and past the table its last slope does, checked here on construction)."""
        if not self.has_prefill_terms:
            return 0.0
        if self._prefill_v2 is not None:
            return self._prefill_v2_ms(chunks)
        d, a, e = self.prefill_discount_ms_per_tok, self.prefill_attn_ms_per_pair, self.prefill_ms_per_chunk
        if self.attention is None:
            return sum(q * (a * (c + 0.5 * q) - d) + e for q, c in chunks)
        w, at = self._wpair_ms, self.attention
        return sum(q * (a * (c + 0.5 * q) - d) + e + w * prefill_pairs(q, c, at) for q, c in chunks)

    def prefill_args(self) -> tuple[int, np.ndarray] | None:
        """prefill_ms's terms for compiled callers (``prefill_ms_compiled``): (0, zeros) without
        prefill terms; (2, [cached, within, per token, per chunk, per step]) for version 2
        without own key lists or wave-counted pairs (the composed profiles'); None for the rest
        (priced in Python)."""
        coef = np.zeros(5)
        if not self.has_prefill_terms:
            return 0, coef
        if self._prefill_v2 is None or self._v2_own is not None or self._wpair_ms:
            return None
        coef[:] = self._v2_coef
        return 2, coef

    def _prefill_v2_ms(self, chunks: Any) -> float:
        """prefill_ms under prefill_terms version 2 (module doc)."""
        pc, pw, pk, pe, ps = self._v2_coef
        own = self._v2_own
        tot, n = 0.0, 0
        for q, c in chunks:
            if not q:
                continue
            n += 1
            tot += q * (pc * c + pw * q + pk) + pe
            if own is not None:
                tot += own[2] * own_keys_ms(int(q), int(c), own[0], own[1])
            if self._wpair_ms:
                tot += self._wpair_ms * prefill_pairs(q, c, self.attention)
        return tot + ps if n else 0.0

    def context_ms(self, q: Any, ctx: Any, chunks: Any = ()) -> float:
        """What a step's decode/verify requests' unequal contexts add to step_ms (which prices
        attention by total KV alone): the split-KV wave, chunk and merge terms of the profile's
        ``attention`` (module doc). q: query tokens per decode request (>= 1), ctx: its cached
        tokens before the step (>= 0), equal-length integer sequences; prefill chunks are priced
        by prefill_ms, not here. With a format-3 ``request_attention`` table it also replaces the
        attention that step_ms priced for these requests (their forward-table share and KV slope)
        by their own (module doc): that part may be negative, step_ms + context_ms stays >= 0.
        Postcondition: >= 0 without a request table; exactly 0 for a profile without the terms
        (format 1), so results made from such profiles do not change. ``chunks``: the step's
        prefill chunks (query tokens, cached tokens), read only by a format-4 ``step_indexer``
        (they share the step's longest-context indexer; module doc)."""
        if not self.has_context_terms or not len(q):
            return 0.0
        args = self._compiled_args
        if args is None:
            args = self._compiled_args = self.context_args()[1:]
        qa = np.ascontiguousarray(q, dtype=np.int64)
        ca = np.ascontiguousarray(ctx, dtype=np.int64)
        if self.request_attention is None:  # split-KV terms only: the compiled function's first part
            return float(decode_features_ms(qa, ca, *args[:13]))
        ch = [(int(x), int(c)) for x, c in chunks if x] if self.context_reads_chunks else ()
        if not ch:
            return float(context_ms_compiled(qa, ca, *args))
        # the format-4 step terms (step indexer, step key lists) see the prefill chunks' tokens too:
        # priced over requests and chunks together, the rest over the requests alone
        iratio, step = args[-2:]
        out = context_ms_compiled(qa, ca, *args[:-2], 0, step[:1])
        out += self._step_call_share_ms(int(qa.sum()), sum(x for x, _ in ch))
        if self._block_pool[0]:  # the decode requests' own blocks: the chunks price theirs
            out += block_pool_ms(qa, ca, self._block_pool, True)
        qi = np.concatenate([qa, np.array([x for x, _ in ch], dtype=np.int64)])
        ci = np.concatenate([ca, np.array([c for _, c in ch], dtype=np.int64)])
        if iratio:
            out += step[0] * _indexer_excess_mcells(qi, ci, iratio)
        keys = 2 + 5 * int(self._block_pool[0])
        if len(step) > keys:
            out += _step_keys_ms(qi, ci, step[keys:])
        return float(out)

    def _step_call_share_ms(self, n: int, p: int) -> float:
        """What context_ms adds back, on a format-4 profile, for a step of n decode/verify tokens beside
        p prompt tokens (module doc, "one attention call"): context_ms_compiled took out S(n), the
        forward share of n tokens alone; the decode requests' part of the share S(n + p) that
        step_ms charged is S(1) + (S(n + p) - S(1)) x n / (n + p)."""
        if not p or not n:
            return 0.0
        big = self._forward_share(n + p)
        one = self._forward_share(1)
        return self._forward_share(n) - (one + (big - one) * n / (n + p))

    def _forward_share(self, n: int) -> float:
        """The attention share of forward_ms(n) (format 3; module doc)."""
        if n <= self.limit:
            return float(self._share_below[max(n, 1)])
        ax, ams = self._share_ax, self._share_ams
        if len(ax) < 2:
            return float(ams[-1]) * n / float(ax[-1])
        if n >= ax[-1]:
            return float(ams[-1] + (ams[-1] - ams[-2]) / (ax[-1] - ax[-2]) * (n - ax[-1]))
        return float(np.interp(n, ax, ams))

    def _forward_shares(self, m: int) -> np.ndarray:
        """_forward_share(n) for n = 0..m-1 as one array (the same operations elementwise)."""
        n = np.arange(m)
        out = np.empty(m, dtype=np.float64)
        k = min(m, self.limit + 1)
        out[:k] = np.asarray(self._share_below, dtype=np.float64)[np.maximum(n[:k], 1)]
        if m > k:
            hi, top = n[k:], out[k:]
            ax, ams = self._share_ax, self._share_ams
            if len(ax) < 2:
                top[:] = float(ams[-1]) * hi / float(ax[-1])
            else:
                ext = hi >= ax[-1]
                top[ext] = ams[-1] + (ams[-1] - ams[-2]) / (ax[-1] - ax[-2]) * (hi[ext] - ax[-1])
                top[~ext] = np.interp(hi[~ext], ax, ams)
        return out

    def context_args(self) -> tuple:
        """context_ms's parameters as plain numbers and arrays, for compiled callers of
        context_ms_compiled (a decode window prices each of its steps with them): (on, group,
        kv_heads, block_rows, CTA cap, balance, min_chunk, chunk slots, wave, chunk, merge,
        per-request, schedule-tail and decode-step coefficients: the split-KV terms, or placeholders with zero coefficients where the profile
        has none; then the format-3 table: on, batch, q, ctx, step costs, the forward table's
        attention share at every step size up to the dense table's end or the table's last point, whichever is further, and the KV slope).
        ``on`` is False for a profile without context terms. Built once per cost model (every
        replica of a simulation shares it)."""
        if self._context_args is None:
            self._context_args = self._build_context_args()
        return self._context_args

    def _build_context_args(self) -> tuple:
        a = self.attention
        if self._split_kv_terms:
            cw, cc, cm = self._ctx_coef
            split = (
                *split_kv_params(a),
                float(cw),
                float(cc),
                float(cm),
                float(self._req_coef[0]),
                float(self._req_coef[1]),
                float(self._req_coef[2]),
            )
        else:
            split = (1, 1, 1, 1, 0.0, 1, 1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        ra = self.request_attention
        if ra is None:
            table = (False, _NO_I64, _NO_I64, _NO_I64, _NO_TAB, _NO_F64, 0.0, 0, np.zeros(1))
        else:
            # to the table's last point at least: context_ms_compiled extrapolates past the array's
            # end with its last slope, which is then the last segment's, as _forward_share's
            m = max(len(self._dense), int(self.profile.forward.x[-1]) + 2)
            share = self._forward_shares(m)
            table = (
                True,
                ra.batch,
                ra.q,
                ra.ctx,
                self._ra_tab,
                share,
                float(self.kv_ms_per_tok),
                int(ra.indexer_ratio),
                np.concatenate(
                    [
                        [float(ra.indexer_ms_per_mcell)],
                        self._block_pool,
                        self._step_keys if self._step_keys is not None else [],
                    ]
                ).astype(np.float64),
            )
        return (bool(self.has_context_terms), *split, *table)

    def forward_ms(self, n_tokens: Any) -> Any:
        """Target forward cost of n tokens at zero context (scalar or array)."""
        if isinstance(n_tokens, (int, np.integer)):
            n = int(n_tokens)
            if n <= self.limit:
                return float(self._below_list[n])
            return self._above_scalar(n)
        n = np.asarray(n_tokens, dtype=np.int64)
        if n.ndim and n.size:
            top = n.max()
            if top <= self.limit:  # the common case: one table lookup
                return self._below[n]
            if top < len(self._dense):  # within a step's token budget
                return self._dense[n]
        small = np.minimum(n, self.limit)
        out = self._below[small]
        if np.any(n > self.limit):
            big = n > self.limit
            nb = n[big] if n.ndim else n
            val = self._above(nb)
            if n.ndim:
                out = out.copy()
                out[big] = val
            else:
                out = val
        return out if n.ndim else float(out)

    def _above_scalar(self, n: int) -> float:
        ax, ams = self._ax_list, self._ams_list
        if n >= ax[-1]:
            return ams[-1] + self._slope * (n - ax[-1])
        i = bisect.bisect_right(ax, n)  # ax[i-1] <= n < ax[i]
        x0, x1 = ax[i - 1], ax[i]
        return ams[i - 1] + (ams[i] - ams[i - 1]) * (n - x0) / (x1 - x0)

    def _above(self, n):
        """Cost above the capture limit: interpolation, then last-slope extrapolation."""
        val = np.interp(n, self._ax, self._ams)
        return np.where(n > self._ax[-1], self._ams[-1] + self._slope * (n - self._ax[-1]), val)

    def step_ms(self, n_tokens: Any, kv_tokens: Any) -> Any:
        return self.forward_ms(n_tokens) + self.kv_ms_per_tok * np.asarray(kv_tokens, dtype=np.float64)

    def forward_table(self) -> np.ndarray:
        """forward_ms(n) for n = 0..DENSE_TOKENS as one read-only float64 array (the dense lookup
        compiled code reads; non-decreasing). Past its end call forward_ms."""
        v = self._dense.view()
        v.flags.writeable = False
        return v

    def forward_args(self) -> tuple:
        """step_ms_one's tables for compiled code (dsim.engine.compiled_sched._forward_ms, the same
        operations): (forward ms at 0..limit tokens, the profiled sizes from the limit on and
        their ms, the last slope past them, the limit)."""
        return self._below, self._ax, self._ams, self._slope, self.limit

    def step_ms_one(self, n_tokens: int, kv_tokens: int) -> float:
        """step_ms for one step (Python scalars: the scheduler's every-step call)."""
        n = int(n_tokens)
        if n <= self.limit:
            f = self._below_list[n]
        else:  # (the scheduler asks for a few hundred sizes, each many times)
            f = self._above_memo.get(n)
            if f is None:
                f = self._above_memo[n] = self._above_scalar(n)
        return f + self.kv_ms_per_tok * kv_tokens

    def step_cost_row(self, n0: int, n1: int, kv_tokens: Any, extra_ms: float = 0.0) -> np.ndarray:
        """The dense step-cost row the verify-budget policies price budgets with: float64[n1 - n0],
        element i = forward_ms(n0 + i) + kv_ms_per_tok x kv_tokens + extra_ms (a new array).
        Preconditions: 0 <= n0 <= n1. Postcondition: non-decreasing (the forward table is forced
        non-decreasing on load), and equal to step_ms(np.arange(n0, n1), kv_tokens) + extra_ms."""
        if n1 <= len(self._dense):
            return self._dense[n0:n1] + (self.kv_ms_per_tok * float(kv_tokens) + extra_ms)
        out = self.step_ms(np.arange(n0, n1), kv_tokens)
        if extra_ms:
            out += extra_ms
        return out

    def draft_table_ms(self, kind: str, n_requests: int) -> float | None:
        """Draft cost from the profile's table for `kind` at n_requests, or None if absent."""
        t = self._draft.get(kind)
        if t is None or n_requests <= 0:
            return None if t is None else 0.0
        x, ms = t
        if n_requests <= x[-1]:
            # Drafter graphs are captured per batch size too: the next profiled size at or above.
            return float(ms[min(np.searchsorted(x, n_requests, side="left"), len(x) - 1)])
        return float(ms[-1] + self._draft_slope[kind] * (n_requests - x[-1]))

    def draft_table_ms_upto(self, kind: str, n_max: int) -> np.ndarray | None:
        """``draft_table_ms(kind, n)`` for n = 0..n_max as one float64 array (the same operations
        element by element), or None if the profile has no table for `kind`."""
        t = self._draft.get(kind)
        if t is None:
            return None
        x, ms = t
        n = np.arange(n_max + 1)
        inside = n <= x[-1]
        out = np.empty(n_max + 1)
        out[inside] = ms[np.minimum(np.searchsorted(x, n[inside], side="left"), len(x) - 1)]
        out[~inside] = ms[-1] + self._draft_slope[kind] * (n[~inside] - x[-1])
        out[0] = 0.0
        return out
