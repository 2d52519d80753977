"""The verify-budget policies and SGLang's verify modes as compiled kernels (numba, nopython,
cached on disk).

``step_windows`` / ``policy_windows``: the six budget policies (fixed, threshold, vllm, paper,
paper-production, sglang) on one cost row per step, with the same operations in the same order as
the numpy definitions documented in ``dsim.spec.budget`` (so the windows are identical, ties
included), and the sorts and selections they read; ``verify_commit`` / ``verify_arrays``: the
verify modes (drafts verified, commit cap) of a window.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from dsim.engine.compiled_bundles import (
    COMPACT,
    FIXED,
    PAPER,
    PAPER_PRODUCTION,
    STATIC,
    THRESHOLD,
    VLLM,
    PolicyBudget,
    PolicyConfidences,
)

# ---- verify-budget policies -------------------------------------------------------------------


@njit(cache=True, inline="always")
def _radix_scatter(a, b, cnt, sh, mask, n):
    """One LSD pass: cnt (the digit histogram of a[:n]) turned into start offsets, then a[:n]
    scattered stably into b by digit (a >> sh) & mask."""
    tot = 0
    for d in range(cnt.shape[0]):
        c = cnt[d]
        cnt[d] = tot
        tot += c
    for i in range(n):
        x = a[i]
        d = (x >> sh) & mask
        b[cnt[d]] = x
        cnt[d] += 1


@njit(cache=True)
def _sort_desc(v, out):
    """out = v sorted descending (float32, non-negative finite values; equal values are
    indistinguishable, so every method below gives the same array). Up to 48 values an
    insertion sort, below 192 numba's np.sort (the radix passes' histograms cost more than the
    values there); above, LSD radix sort on the bit patterns (non-negative floats order as
    their bits): four 8-bit passes, from 512 values on three 11-bit passes with the three digit
    histograms counted in one read. A pass whose digit is the same for every value is skipped."""
    n = v.shape[0]
    if n <= 48:
        for i in range(n):
            x = v[i]
            j = i
            while j > 0 and out[j - 1] < x:
                out[j] = out[j - 1]
                j -= 1
            out[j] = x
        return
    if n < 192:
        tmp = np.sort(v)
        for i in range(n):
            out[i] = tmp[n - 1 - i]
        return
    a = v.view(np.uint32).copy()
    b = np.empty_like(a)
    if n >= 512:
        cnt3 = np.zeros((3, 2048), np.int64)
        for i in range(n):
            x = a[i]
            cnt3[0, x & np.uint32(2047)] += 1
            cnt3[1, (x >> np.uint32(11)) & np.uint32(2047)] += 1
            cnt3[2, x >> np.uint32(22)] += 1
        for p in range(3):
            sh = np.uint32(11 * p)
            cnt = cnt3[p]
            if cnt[(a[0] >> sh) & np.uint32(2047)] == n:
                continue
            _radix_scatter(a, b, cnt, sh, np.uint32(2047), n)
            a, b = b, a
    else:
        cnt = np.zeros(256, np.int64)
        for p in range(4):
            sh = np.uint32(8 * p)
            cnt[:] = 0
            for i in range(n):
                cnt[(a[i] >> sh) & np.uint32(255)] += 1
            if cnt[(a[0] >> sh) & np.uint32(255)] == n:
                continue
            _radix_scatter(a, b, cnt, sh, np.uint32(255), n)
            a, b = b, a
    fa = a.view(np.float32)
    for i in range(n):
        out[i] = fa[n - 1 - i]


@njit(cache=True)
def _kth_largest(v, k):
    """The value at index k (0-based) of v sorted descending, without sorting: the same value a
    full sort puts there. For the policies' scores (non-negative finite float32, which order as
    their bit patterns) a radix selection: the top 10 bits' histogram picks the digit holding
    rank k, then bits 11-21 and 0-10 of the values with that prefix, a small remainder sorted
    (branch-free counting passes: a quickselect's data-dependent partition branches mispredict
    on random scores, about 2.5x slower at 1,792 scores). Other input: the quickselect."""
    n = v.shape[0]
    if n <= 64:
        return _kth_quickselect(v, k)
    a = v.view(np.uint32)
    cnt = np.zeros(2048, np.int64)
    top = 0
    for i in range(n):
        d = np.int64(a[i] >> np.uint32(22))
        cnt[d] += 1
        if d > top:
            top = d
    if top >= 510:  # from 0x7F800000 on: an infinity, a NaN or a negative value (-0.0 too)
        return _kth_quickselect(v, k)
    d = top
    while cnt[d] <= k:  # (descending: ranks from the largest digit down)
        k -= cnt[d]
        d -= 1
    m = cnt[d]
    b = np.empty(m, np.uint32)
    j = 0
    for i in range(n):
        x = a[i]
        if np.int64(x >> np.uint32(22)) == d:
            b[j] = x
            j += 1
    for sh in (11, 0):
        if m <= 32:
            break
        s = np.uint32(sh)
        cnt[:] = 0
        top = 0
        for i in range(m):
            d = np.int64((b[i] >> s) & np.uint32(2047))
            cnt[d] += 1
            if d > top:
                top = d
        d = top
        while cnt[d] <= k:
            k -= cnt[d]
            d -= 1
        if cnt[d] == m:  # every value left has this digit
            continue
        j = 0
        for i in range(m):
            x = b[i]
            if np.int64((x >> s) & np.uint32(2047)) == d:
                b[j] = x
                j += 1
        m = j
    c = b[:m].copy()
    c.sort()  # ascending bit patterns = ascending values
    return c.view(np.float32)[m - 1 - k]


@njit(cache=True)
def _kth_quickselect(v, k):
    """``_kth_largest`` by quickselect on a copy (median-of-three pivots, three-way partition)."""
    a = v.copy()
    lo = 0
    hi = a.shape[0] - 1
    while True:
        if hi - lo < 16:
            sub = np.sort(a[lo : hi + 1])  # ascending
            return sub[hi - k]
        mid = (lo + hi) // 2
        x, y, z = a[lo], a[mid], a[hi]
        if x < y:
            x, y = y, x
        if y < z:
            y, z = z, y
            if x < y:
                x, y = y, x
        piv = y  # the median of the three
        # descending three-way partition: [lo, lt) > piv, [lt, gt] == piv, (gt, hi] < piv
        lt = lo
        gt = hi
        i = lo
        while i <= gt:
            e = a[i]
            if e > piv:
                a[i] = a[lt]
                a[lt] = e
                lt += 1
                i += 1
            elif e < piv:
                a[i] = a[gt]
                a[gt] = e
                gt -= 1
            else:
                i += 1
        if k < lt:
            hi = lt - 1
        elif k > gt:
            lo = gt + 1
        else:
            return piv


@njit(cache=True)
def _ratio_argmax(srt, RK, n_samp, row, extra, limit):
    """argmax over b in 0..limit of (n_samp + top-b sum) / (row[b] + extra), the first maximum
    (a NaN counts as the maximum, as np.argmax does)."""
    cs = 0.0
    best = -np.inf
    bi = 0
    for b in range(limit + 1):
        if b > 0:
            cs += np.float64(srt[b - 1])
        r = (n_samp + cs) / (row[b] + extra)
        if np.isnan(r):
            return b
        if r > best:
            best = r
            bi = b
    return bi


# From this many scores on, the vllm / paper-production budget reads them in any order
# (``_ratio_argmax_any``); below, the sorted scores (one sort, whose order also gives the top-B
# threshold), where the digit tables would cost more than the sort.
GROUPED_MIN = 768


@njit(cache=True)
def _sort_small(g):
    """g (uint32) sorted ascending in place: insertion sort up to 32 values, else numba's sort."""
    c = g.shape[0]
    if c > 32:
        g.sort()
        return
    for i in range(1, c):
        x = g[i]
        j = i
        while j > 0 and g[j - 1] > x:
            g[j] = g[j - 1]
            j -= 1
        g[j] = x


@njit(cache=True)
def _ratio_argmax_any(v, n_samp, row, extra, limit):
    """``_ratio_argmax`` of v sorted descending, from v in any order, sorting only the values
    near the maximum. Where the denominators row[b] + extra (b <= limit) are finite, positive
    and non-decreasing and the values lie in [0, 1]: a float32 value of exponent e is a multiple
    of 2^(e - 150), so the sums of values from exponent e_min = ceil(log2 len(v)) - 30 + 127 on
    are exact in float64 in any order (below 2^ceil(log2 len(v)), 53 bits); the top-b sum at
    each boundary of the 11-bit digit groups (exponent, three mantissa bits) is therefore the
    sorted loop's value, and so is the ratio there. A group whose bound (n_samp + the sum at its
    end) / (its first denominator) is below the best boundary ratio holds no maximum (rounding
    is monotone) and is skipped; the others are sorted and scanned in order, as the loop does,
    first maximum kept. The values below e_min (and zeros) come last, sorted, summed in order.
    Otherwise (and below GROUPED_MIN scores) the full sort and ``_ratio_argmax``."""
    N = v.shape[0]
    ok = N >= GROUPED_MIN and limit >= 64 and N < (1 << 24) and abs(n_samp) < np.inf
    if ok:
        # (counted without a branch or a carried value: the loop vectorises)
        nbad = 0
        for b in range(1, limit + 1):
            nbad += not (row[b] + extra >= row[b - 1] + extra)
        ok = nbad == 0 and row[0] + extra > 0 and row[limit] + extra < np.inf
    if not ok:
        srt = np.empty(N, np.float32)
        _sort_desc(v, srt)
        return _ratio_argmax(srt, N, n_samp, row, extra, limit)
    L = 0
    while (1 << L) < N:
        L += 1
    d_min = (L - 30 + 127) << 3  # the first digit of exponent e_min
    if d_min < 1:
        d_min = 1
    # Digits d_min..1016 have bins 1..1017 - d_min; bin 0 holds every value below (the tail,
    # sorted and walked as one group): only the bins in use are cleared and walked.
    nb = 1018 - d_min
    cnt = np.zeros(nb, np.int64)
    sums = np.zeros(nb, np.float64)
    a = v.view(np.uint32)
    for i in range(N):
        x = a[i]
        if x > np.uint32(0x3F800000):  # above 1.0, negative (-0.0 too) or NaN
            ok = False
            break
        d = np.int64(x >> np.uint32(20)) - d_min + 1
        if d < 0:
            d = 0
        cnt[d] += 1
        sums[d] += np.float64(v[i])
    if not ok:
        srt = np.empty(N, np.float32)
        _sort_desc(v, srt)
        return _ratio_argmax(srt, N, n_samp, row, extra, limit)
    # the best ratio at the groups' boundaries (exact top-b sums)
    best = n_samp / (row[0] + extra)
    cs = 0.0
    b = 0
    for d in range(nb - 1, 0, -1):
        c = cnt[d]
        if c == 0:
            continue
        b += c
        if b > limit:
            break
        cs += sums[d]
        r = (n_samp + cs) / (row[b] + extra)
        if r > best:
            best = r
    # the groups that may hold the maximum, gathered by bin (a counting sort's scatter)
    take = np.zeros(nb, np.bool_)
    start = np.zeros(nb, np.int64)
    cs = 0.0
    b = 0
    for d in range(nb - 1, 0, -1):
        c = cnt[d]
        if c == 0:
            continue
        if b >= limit:
            break
        end_cs = cs + sums[d]
        if not (n_samp + end_cs) / (row[b] + extra) < best:
            take[d] = True
        cs = end_cs
        b += c
    tail = cnt[0] if b < limit else 0
    take[0] = tail > 0
    pos = 0
    for d in range(nb - 1, -1, -1):
        if take[d]:
            start[d] = pos
            pos += cnt[d]
    buf = np.empty(pos, np.uint32)
    fill = start.copy()
    for i in range(N):
        x = a[i]
        d = np.int64(x >> np.uint32(20)) - d_min + 1
        if d < 0:
            d = 0
        if take[d]:
            buf[fill[d]] = x
            fill[d] += 1
    # the scan: skipped groups advance b and the (exact) sum; taken ones are sorted and walked
    bi = 0
    bestv = n_samp / (row[0] + extra)
    cs = 0.0
    b = 0
    for d in range(nb - 1, -1, -1):
        c = cnt[d]
        if c == 0:
            continue
        if b >= limit:
            return bi
        if not take[d]:
            cs += sums[d]
            b += c
            continue
        g = buf[start[d] : start[d] + c]
        _sort_small(g)  # ascending bit patterns = ascending values
        gf = g.view(np.float32)
        for q in range(c - 1, -1, -1):
            b += 1
            if b > limit:
                return bi
            cs += np.float64(gf[q])
            r = (n_samp + cs) / (row[b] + extra)
            if r > bestv:
                bestv = r
                bi = b
    return bi


@njit(cache=True)
def _early_stop(srt, n_samp, row, extra, limit):
    """DSpark Algorithm 1: B = the number of leading strict rises of Theta(b), at most limit."""
    cs = np.float64(srt[0]) if limit > 0 else 0.0
    prev = n_samp / (row[0] + extra)
    for b in range(limit):
        cur = (n_samp + cs) / (row[b + 1] + extra)
        if not (cur - prev > 0):
            return b
        prev = cur
        if b + 1 < limit:
            cs += np.float64(srt[b + 1])
    return limit


@njit(cache=True)
def _top_b(flat, srt, B, K, R, out):
    """The B slots to the top-B positive scores (stable: ties to the earlier request-major index,
    so a request's slots are a prefix); out[r] = slots of request r. ``srt``: flat sorted
    descending, or an empty array (then the B-th largest score is selected from flat)."""
    RK = K * R
    for r in range(R):
        out[r] = 0
    if B <= 0 or RK == 0:
        return
    bb = B - 1 if B - 1 < RK - 1 else RK - 1
    thr = srt[bb] if srt.shape[0] == RK else _kth_largest(flat, bb)
    ngt = 0
    for i in range(RK):
        if flat[i] > thr:
            ngt += 1
    need = B - ngt
    ties = 0
    for r in range(R):  # (i = r K + j in order, without a division per score)
        c = 0
        for j in range(K):
            v = flat[r * K + j]
            if v > thr:
                sel = True
            elif v == thr:
                ties += 1
                sel = ties <= need
            else:
                sel = False
            if sel and v > 0:
                c += 1
        out[r] = c


@njit(cache=True)
def _cap_fcfs(out, R, allowed):
    before = 0
    for r in range(R):
        l = out[r]
        v = allowed - before
        if v < 0:
            v = 0
        if v > l:
            v = l
        out[r] = v
        before += l


@njit(cache=True, inline="always")
def _scores(c, K, R, flat, srt):
    """The request-major survival scores of confidences c [>=K, R] (flat) and, where srt is
    not empty, the same sorted descending: S[j, r] = prod_{i<=j} clip(c[i, r], 0, 1) in float32 (the
    reference's order; +0.0 for non-positive values, a clipped -0.0 sorting with the zeros) at
    flat[r * K + j]."""
    for r in range(R):
        acc = np.float32(1.0)
        for j in range(K):
            x = c[j, r]
            if not x > 0:
                x = np.float32(0.0)
            elif x > 1:
                x = np.float32(1.0)
            if j == 0:
                acc = np.float32(x)
            else:
                acc = np.float32(acc * x)
            flat[r * K + j] = acc
    if srt.shape[0] == flat.shape[0]:
        _sort_desc(flat, srt)


@njit(cache=True)
def _windows_scored(code, tau, flat, srt, src, budget, K, R, out):
    """One step's verify windows (budget: a PolicyBudget of one step) from the scores already
    computed: ``flat`` (request-major
    survival of the confidences being verified), ``srt`` (flat sorted descending; may be empty
    for vllm and paper-production, which only need its B-th largest value) and ``src`` (the
    survival of the confidences vllm / paper-production budget from: from GROUPED_MIN scores on
    in any order, their budget being a function of the values only (``_ratio_argmax_any``),
    below sorted descending). K: positions in use (min(K, k_max))."""
    budget = PolicyBudget(*budget)
    row, extra, n_samp, n_nondraft, token_limit = (
        budget.row, budget.extra, budget.n_samp, budget.n_nondraft, budget.token_limit
    )  # fmt: skip
    RK = R * K
    allowed = token_limit - n_nondraft
    if allowed < 0:
        allowed = 0
    M = allowed if allowed < RK else RK
    if code == FIXED or code == THRESHOLD:
        if code == FIXED:
            for r in range(R):
                out[r] = K
        else:
            t32 = np.float32(tau)
            for r in range(R):
                c = 0
                for j in range(K):
                    if flat[r * K + j] >= t32:
                        c += 1
                out[r] = c
        _cap_fcfs(out, R, allowed)
        return
    if code == VLLM or code == PAPER_PRODUCTION:
        lim = M
        if code == PAPER_PRODUCTION:
            npos = 0
            for i in range(RK):
                if src[i] > 0:
                    npos += 1
            lim = M if M < npos else npos
        if RK >= GROUPED_MIN:
            B = _ratio_argmax_any(src, n_samp, row, extra, lim)
        else:
            B = _ratio_argmax(src, RK, n_samp, row, extra, lim)
        _top_b(flat, srt, B, K, R, out)
        return
    npos = 0
    for i in range(RK):
        if srt[i] > 0:
            npos += 1
    limit = M if M < npos else npos
    if code == PAPER:
        B = _early_stop(srt, n_samp, row, extra, limit)
    else:  # SGLANG
        B = _ratio_argmax(srt, RK, n_samp, row, extra, limit)
    _top_b(flat, srt, B, K, R, out)


@njit(cache=True)
def step_windows(code, tau, confs, budget, k_max, out):
    """One step's verify windows (out int64[R]) from confidences [K, R] (confs: a
    PolicyConfidences): ``now`` (being verified), ``prev`` (one step earlier: vllm's budget) and
    ``old`` (two steps earlier: paper-production's). budget (a PolicyBudget): ``row[b]``, the
    step's cost of n_nondraft + b tokens for b = 0..M (M = min(max(token_limit - n_nondraft, 0),
    R x K)), ``extra`` added to every budget; ``n_samp``: E(b)'s sampling requests.
    Postconditions: 0 <= out <= min(K, k_max); sum(out) + n_nondraft <= token_limit."""
    confs = PolicyConfidences(*confs)
    now, prev, old = confs.now, confs.prev, confs.old
    Kfull, R = now.shape
    K = Kfull if Kfull < k_max else k_max
    if K < 0:
        K = 0
    RK = R * K
    flat = np.empty(RK, np.float32)
    none = np.empty(0, np.float32)
    if code == FIXED:
        _windows_scored(code, tau, flat, none, none, budget, K, R, out)
        return
    if code == THRESHOLD:
        _scores(now, K, R, flat, none)
        _windows_scored(code, tau, flat, none, none, budget, K, R, out)
        return
    if code == VLLM or code == PAPER_PRODUCTION:
        src_flat = np.empty(RK, np.float32)
        src_srt = np.empty(RK if RK < GROUPED_MIN else 0, np.float32)  # (sorted: see _windows_scored)
        _scores(prev if code == VLLM else old, K, R, src_flat, src_srt)
        _scores(now, K, R, flat, none)  # (top-B by selection: no sort)
        src = src_flat if RK >= GROUPED_MIN else src_srt
        _windows_scored(code, tau, flat, none, src, budget, K, R, out)
        return
    srt = np.empty(RK, np.float32)
    _scores(now, K, R, flat, srt)
    _windows_scored(code, tau, flat, srt, none, budget, K, R, out)


@njit(cache=True)
def policy_windows(code, tau, confs, budget, k_max, out):
    """``step_windows`` for k steps: confs (a PolicyConfidences) now / prev / old [k, K, R];
    budget (a PolicyBudget) rows [k or 1, L], extra, n_samp, n_nondraft [k]; out int64[k, R]."""
    confs, budget = PolicyConfidences(*confs), PolicyBudget(*budget)
    now, prev, old, rows = confs.now, confs.prev, confs.old, budget.row
    k = now.shape[0]
    for t in range(k):
        rt = t if rows.shape[0] > 1 else 0
        step = (rows[rt], budget.extra[t], budget.n_samp[t], budget.n_nondraft[t], budget.token_limit)
        step_windows(code, tau, (now[t], prev[t], old[t]), step, k_max, out[t])


@njit(cache=True, inline="always")
def verify_commit(mode, w, K):
    """SGLang verify modes: (drafts verified, commit cap) of a window w."""
    if mode == COMPACT:
        return w, w
    if mode == STATIC:
        return K, K
    return K, w  # CAP_ACCEPT


@njit(cache=True)
def verify_arrays(mode, win, K, verified, cap):
    """verify_commit over an int64 array (any shape flattened alike)."""
    w = win.ravel()
    v = verified.ravel()
    c = cap.ravel()
    for i in range(w.shape[0]):
        v[i], c[i] = verify_commit(mode, w[i], K)
