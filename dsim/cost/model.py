"""Step-cost model: how long one engine step takes.

A profile file (YAML) carries provenance and tables; ``CostModel`` answers
``step_ms(n_tokens, kv_tokens)`` for a target forward/verify step and ``draft_table_ms`` for the
drafter, with vLLM's adaptive-verification semantics (docs/user/semantics.md §5):

- at or below the CUDA-graph capture limit a step of n tokens runs the graph of the next captured
  size, so cost is a step function: the table value at the smallest profiled size >= n;
- above the limit steps run without full graphs: linear interpolation between profiled points,
  last-slope extrapolation past the largest one;
- the measured curve is made non-decreasing (running maximum) first, as vLLM does.

Preconditions: n_tokens >= 1, kv_tokens >= 0. Postcondition: step_ms is non-decreasing in both.

The profile's prefill terms (``prefill_terms`` versions 1 and 2) and attention sections (formats 2
to 5), what each prices and the rules ``prefill_ms`` and ``context_ms`` apply:
docs/dev/profile-format-history.md (the "module doc" the comments below cite).
"""

from __future__ import annotations

import bisect
from typing import Any

import numpy as np

from dsim.cost.attention import (
    _NO_F64,
    _NO_I64,
    _NO_TAB,
    RequestTableTerms,
    SplitKVCoefs,
    _indexer_excess_mcells,
    _step_keys_ms,
    block_pool_ms,
    context_ms_compiled,
    decode_features_ms,
    own_keys_ms,
    prefill_discount_bound_ms_per_ktok,
    prefill_pairs,
    split_kv_params,
)
from dsim.cost.profile import DENSE_TOKENS, Profile
from dsim.errors import InputError


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
        split, coefs, table = args
        qa = np.ascontiguousarray(q, dtype=np.int64)
        ca = np.ascontiguousarray(ctx, dtype=np.int64)
        if self.request_attention is None:  # split-KV terms only: the compiled function's first part
            return float(decode_features_ms(qa, ca, split, coefs))
        ch = [(int(x), int(c)) for x, c in chunks if x] if self.context_reads_chunks else ()
        if not ch:
            return float(context_ms_compiled(qa, ca, split, coefs, table))
        # the format-4 step terms (step indexer, step key lists) see the prefill chunks' tokens too:
        # priced over requests and chunks together, the rest over the requests alone
        iratio, step = table[-2:]
        out = context_ms_compiled(qa, ca, split, coefs, (*table[:-2], 0, step[:1]))
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
        """context_ms's parameters as plain numbers and arrays in three bundles, for compiled
        callers of context_ms_compiled (a decode window prices each of its steps with them):
        (on, split, coefs, table): ``on`` False for a profile without context terms; split the
        split-KV structure (dsim.cost.attention.SplitKV's fields) and coefs its terms'
        coefficients (SplitKVCoefs': wave, chunk, merge, per-request, schedule-tail, decode-step),
        placeholders with zero coefficients where the profile has none; table the format-3 to 5
        request table (RequestTableTerms': on, batch, q, ctx, step costs, the forward table's
        attention share at every step size up to the dense table's end or the table's last point,
        whichever is further, the KV slope, the indexer ratio, the step terms). Plain tuples (the
        compiled boundary's rule). Built once per cost model (every replica of a simulation
        shares it)."""
        if self._context_args is None:
            self._context_args = self._build_context_args()
        return self._context_args

    def _build_context_args(self) -> tuple:
        a = self.attention
        if self._split_kv_terms:
            cw, cc, cm = self._ctx_coef
            split = split_kv_params(a)
            coefs = SplitKVCoefs(
                wave=float(cw),
                chunk=float(cc),
                merge=float(cm),
                request=float(self._req_coef[0]),
                tail=float(self._req_coef[1]),
                step=float(self._req_coef[2]),
            )
        else:
            split = (1, 1, 1, 1, 0.0, 1, 1)
            coefs = SplitKVCoefs(0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
        ra = self.request_attention
        if ra is None:
            table = RequestTableTerms(False, _NO_I64, _NO_I64, _NO_I64, _NO_TAB, _NO_F64, 0.0, 0, np.zeros(1))
        else:
            # to the table's last point at least: context_ms_compiled extrapolates past the array's
            # end with its last slope, which is then the last segment's, as _forward_share's
            m = max(len(self._dense), int(self.profile.forward.x[-1]) + 2)
            share = self._forward_shares(m)
            table = RequestTableTerms(
                on=True,
                batch=ra.batch,
                q=ra.q,
                ctx=ra.ctx,
                step_ms=self._ra_tab,
                forward_share=share,
                kv_slope=float(self.kv_ms_per_tok),
                indexer_ratio=int(ra.indexer_ratio),
                step=np.concatenate(
                    [
                        [float(ra.indexer_ms_per_mcell)],
                        self._block_pool,
                        self._step_keys if self._step_keys is not None else [],
                    ]
                ).astype(np.float64),
            )
        return (bool(self.has_context_terms), split, tuple(coefs), tuple(table))

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
        """step_ms_one's tables for compiled code (dsim.engine.compiled_general_steps._forward_ms, the same
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
