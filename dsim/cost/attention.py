"""Attention terms of a step's cost: the per-request sections a profile may carry (format 2
``attention``, ``AttentionTerms``; format 3 to 5 ``request_attention``, ``RequestAttention`` with its
step indexer, ``StepKeys`` and ``BlockPool``; ``prefill_terms`` version 2, ``PrefillTerms``) and the
functions that price a step's requests with them (compiled with numba where it is installed, callable
from the engine's compiled step code). What each term prices and why: docs/dev/profile-format-history.md
(the "module doc" the comments below cite)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from dsim.kernel_cache import ensure_fresh

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


ensure_fresh()  # (numba's cache does not see edits to the modules a kernel calls)


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
    return _decode_features(q, c, split_kv_params(a))


# The compiled pricing's bundles (docs/dev/architecture.md, "The compiled boundary"): they cross
# from Python as plain tuples (numba types a named tuple's fields in Python on every call), and
# each kernel names them on entry (``SplitKV(*split)``, free in compiled code).


class SplitKV(NamedTuple):
    """A profile's split-KV structure as plain numbers (``split_kv_params``)."""

    group: int  # query heads per KV head
    kv_heads: int
    block_rows: int  # query rows per attention CTA
    cta_cap: int  # chunk CTAs aimed at: ceil(fill x SMs)
    balance: float  # no chunk longer than balance x mean context (0: off)
    min_chunk: int  # shortest chunk (tokens)
    chunk_slots: int  # chunk-CTA slots of one wave: SMs x decode CTAs per SM


class SplitKVCoefs(NamedTuple):
    """The split-KV terms' coefficients (CostModel.context_args; all 0 where a profile has none)."""

    wave: float  # ms per 1000 tokens of wave capacity
    chunk: float  # ms per 1000 chunk CTAs
    merge: float  # ms per million merge-grid cells
    request: float  # ms per decode/verify request
    tail: float  # ms per 1000 tokens of schedule tail
    step: float  # ms once a step with decode/verify requests


class RequestTableTerms(NamedTuple):
    """A format-3 to 5 request-attention table as CostModel.context_args packs it (``on`` False
    and placeholders where a profile has none)."""

    on: bool
    batch: np.ndarray  # int64: the table's batch grid
    q: np.ndarray  # int64: its query-token grid
    ctx: np.ndarray  # int64: its context grid
    step_ms: np.ndarray  # float64 [batch, q, ctx]: its step costs
    forward_share: np.ndarray  # float64: the forward table's attention share by step size
    kv_slope: float  # ms per KV token (CostModel.kv_ms_per_tok)
    indexer_ratio: int  # the step indexer's compression ratio (0: none)
    step: np.ndarray  # float64: the indexer's ms per million cells, BlockPool.packed(), StepKeys.packed()


def split_kv_params(a: AttentionTerms) -> tuple:
    """The split-KV structure _decode_features reads, as a plain tuple of SplitKV's fields."""
    return tuple(
        SplitKV(
            group=a.group,
            kv_heads=a.kv_heads,
            block_rows=a.block_rows,
            cta_cap=math.ceil(a.fill * a.sms),
            balance=float(a.balance),
            min_chunk=a.min_chunk,
            chunk_slots=a.sms * a.decode_ctas_per_sm,
        )
    )


@_njit
def decode_features_ms(q, c, split, coefs):  # pragma: no cover - compiled
    """The split-KV terms of CostModel.context_ms of the first len(q) entries (>= 1), from
    CostModel.context_args' SplitKV and SplitKVCoefs (compiled: callable from compiled code)."""
    k = SplitKVCoefs(*coefs)
    wave, chunks, merge, reqs, tail = _decode_features(q, c, split)
    return k.wave * wave + k.chunk * chunks + k.merge * merge + k.request * reqs + k.tail * tail + k.step


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
def context_ms_compiled(q, c, split, coefs, table):  # pragma: no cover - compiled
    """CostModel.context_ms of the first len(q) decode requests, from CostModel.context_args past
    its ``on`` flag: split a SplitKV, coefs a SplitKVCoefs, table a RequestTableTerms (compiled:
    callable from compiled code, as a decode window's kernel does once per step): the split-KV
    terms plus, for a format-3 table, the requests' own attention less the forward table's share
    and the KV slope's, and the format-4/5 step terms: the table's indexer_ratio the
    step_indexer's ratio (0: none), its ``step`` [the indexer's ms per million cells, then
    BlockPool.packed() (the kinds' count first; 0 where the profile has no block_pool), then
    StepKeys.packed() where the profile has step_keys]. The requests are the step's only ones
    (no prompt chunks: a step with chunks prices block_pool with ``block_pool_ms(..., chunks=True)``).
    Precondition: len(q) >= 1; a step of more tokens than the dense table's share extrapolates
    its last slope."""
    k = SplitKVCoefs(*coefs)
    ra = RequestTableTerms(*table)
    out = 0.0
    if k.wave != 0.0 or k.chunk != 0.0 or k.merge != 0.0 or k.request != 0.0 or k.tail != 0.0 or k.step != 0.0:
        out = decode_features_ms(q, c, split, coefs)
    if ra.on:
        rshare, step, iratio = ra.forward_share, ra.step, ra.indexer_ratio
        n = 0
        ctx = 0
        for i in range(len(q)):
            n += q[i]
            ctx += c[i]
        m = len(rshare)
        share = rshare[n] if n < m else rshare[m - 1] + (rshare[m - 1] - rshare[m - 2]) * (n - m + 1)
        out += _request_attention(q, c, ra.batch, ra.q, ra.ctx, ra.step_ms) - share - ra.kv_slope * (ctx + n)
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
def _decode_features(q, c, split):  # pragma: no cover - compiled
    """(wave capacity, chunk CTAs, merge cells, requests, tail) of decode_features and
    request_features from a SplitKV (split)."""
    s = SplitKV(*split)
    g, kv_heads, block_rows, cap = s.group, s.kv_heads, s.block_rows, s.cta_cap
    balance, min_chunk, slots = s.balance, s.min_chunk, s.chunk_slots
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
