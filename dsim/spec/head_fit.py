"""Fitting a confidence head to its targets and scoring one: ``fit_head`` (the noise s, offset b
and temperature T of a noisy head, dsim.spec.heads), ``head_quality`` (ROC-AUC and ECE of
confidences against the realized outcomes, as a run reports them).

A noisy head (``model``): ``logit(c) = (logit(p_true) + s N(0, 1) - b) / T``. ``s`` is found by
root finding so the ROC-AUC of c against the realized per-draft accept outcomes equals
``head_auc`` (default 0.85; published 0.81-0.90), on a fixed-seed calibration sample (equal class
mix, all K positions, each draft's own outcome, prefix ignored: dsim.spec.acceptance
AcceptanceModel draws it). Even a perfect head (c = p_true) has AUC < 1 because the outcome is a
coin flip; when the target exceeds that ceiling s = 0 and the notes say so. ``b`` and ``T`` are
Platt scaling's offset and temperature, then ``T`` is set from ``head_ece`` (default 0.01 =
calibrated, as after the paper's sequential temperature scaling; raw heads are 3-8%): the
ECE-minimising T when the target is at or below the minimum, else the overconfident T < T* whose
ECE equals the target. The other heads are not fitted: ``perfect`` (c = p_true), ``useless``
(c = P[c, k], the class-position curve: no per-request information).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from dsim.kernel_cache import ensure_fresh
from dsim.spec.heads import HeadKind

__all__ = ["fit_head", "head_quality"]


ensure_fresh()  # (numba's cache does not see edits to the modules a kernel calls)


def sigmoid(x):
    """1 / (1 + e^-x), elementwise."""
    return 1.0 / (1.0 + np.exp(-x))


def fit_head(
    kind: HeadKind,
    x: np.ndarray,
    p: np.ndarray,
    y: np.ndarray,
    noise: np.ndarray,
    curve: np.ndarray,
    auc_target: float,
    ece_target: float,
) -> tuple:
    """Fit a head on a calibration sample: per draft the true acceptance's logit ``x`` and
    probability ``p``, the outcome ``y`` (bool), a standard normal ``noise`` and the class curve's
    value ``curve`` (float64 arrays of one shape). Returns (s, b, T, AUC ceiling, AUC achieved,
    ECE achieved, notes): s = b = 0 and T = 1 for a head that is not ``noisy``."""
    notes: list[str] = []
    ceiling = _auc(x, y)
    if not kind.noisy:
        c = curve if kind.class_curve else p
        return 0.0, 0.0, 1.0, ceiling, _auc(c, y), _ece(c, y), notes
    target = auc_target
    if target >= ceiling:
        s = 0.0
        notes.append(
            f"head-auc {target:.3f} is at or above the ceiling {ceiling:.3f} of a perfect head "
            f"for this preset and noise; using s = 0 (c = p_true before temperature)"
        )
    else:
        # AUC(x + s noise) falls from the ceiling towards 0.5 as s grows: bracket, then _root.
        def gap(sv: float) -> float:
            return _auc(x + sv * noise, y) - target

        lo, hi = 0.0, 1.0
        while gap(hi) > 0 and hi < 1e4:
            lo, hi = hi, hi * 2.0
        s = _root(gap, lo, hi, xtol=1e-4)
    z = x + s * noise
    # Platt scaling on the noisy logit: logit c = (z - b) / T. A noisy estimate needs an
    # offset as well as a temperature to be calibrated (the shift moves the logit's centre);
    # neither changes the ranking (AUC).
    a, c0 = _platt(z, y)
    T_cal, b = 1.0 / a, -c0 / a
    e_cal = _ece(sigmoid((z - b) / T_cal), y)
    T = T_cal
    if ece_target > e_cal:
        # overconfident side (smaller T, sharper), as raw heads are
        lo = 0.02 * T_cal

        def ece_gap(tv: float) -> float:
            return _ece(sigmoid((z - b) / tv), y) - ece_target

        if ece_gap(lo) < 0:
            T = lo
            notes.append(f"head-ece {ece_target} not reachable; T = {lo:.3g}")
        else:
            T = _root(ece_gap, lo, T_cal, xtol=1e-6 * T_cal)
    elif ece_target < e_cal - 0.002:
        notes.append(
            f"head-ece {ece_target} is below what the calibration sample reaches "
            f"({e_cal:.4f}); using the calibrated head"
        )
    c = sigmoid((z - b) / T)
    return float(s), float(b), float(T), ceiling, _auc(c, y), _ece(c, y), notes


def _root(f, lo: float, hi: float, xtol: float, iters: int = 60) -> float:
    """A root of f in [lo, hi] by the Illinois variant of false position (f(lo), f(hi) of
    opposite signs or zero; else the end nearer zero). Converges superlinearly on the smooth
    monotone gaps of the head fit, a dozen evaluations where bisection needs 25-30."""
    flo, fhi = f(lo), f(hi)
    if flo == 0 or fhi == 0 or (flo > 0) == (fhi > 0):
        return float(lo if abs(flo) <= abs(fhi) else hi)
    side = 0
    x = lo
    for _ in range(iters):
        x = (lo * fhi - hi * flo) / (fhi - flo)
        fx = f(x)
        if fx == 0:
            break
        if (fx > 0) == (fhi > 0):
            hi, fhi = x, fx
            if side == -1:
                flo *= 0.5
            side = -1
        else:
            lo, flo = x, fx
            if side == 1:
                fhi *= 0.5
            side = 1
        if hi - lo <= xtol:
            break
    return float(x)


def _platt(z, y, iters: int = 50):
    """1-D logistic regression y ~ sigmoid(a z + c) by damped Newton from a = 0; returns (a, c)."""
    y = y.astype(np.float64)
    ybar = min(max(y.mean(), 1e-6), 1 - 1e-6)
    theta = np.array([0.0, math.log(ybar / (1 - ybar))])

    def nll(t: np.ndarray) -> float:
        u = t[0] * z + t[1]
        return float((np.logaddexp(0.0, u) - y * u).sum())

    f = nll(theta)
    for _ in range(iters):
        q = sigmoid(theta[0] * z + theta[1])
        w = np.maximum(q * (1 - q), 1e-12)
        r = y - q
        g = np.array([(r * z).sum(), r.sum()])
        H = np.array([[(w * z * z).sum(), (w * z).sum()], [(w * z).sum(), w.sum()]])
        step = np.linalg.solve(H, g)
        lam = 1.0
        while lam > 1e-4:
            cand = theta + lam * step
            fc = nll(cand)
            if fc <= f:
                break
            lam *= 0.5
        theta, f_old, f = cand, f, fc
        if abs(f_old - f) < 1e-10 * max(1.0, abs(f)):
            break
    return max(float(theta[0]), 1e-6), float(theta[1])


# --------------------------------------------------------------------------------------------
# Helpers the engine calls
# --------------------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _rank_counts(pos, neg):
    """(sum over pos of #neg < x, sum of #neg <= x) for ascending pos and neg of one float
    dtype: one merge-like pass, as a binary search of each sorted needle counts. The third value
    is False where a NaN occurs (it orders with nothing; the caller takes the search)."""
    below = 0
    upto = 0
    i = 0
    j = 0
    n0 = neg.shape[0]
    n1 = pos.shape[0]
    if (n1 and pos[n1 - 1] != pos[n1 - 1]) or (n0 and neg[n0 - 1] != neg[n0 - 1]):  # (a sort puts NaNs last)
        return 0, 0, False
    for k in range(n1):
        x = pos[k]
        while i < n0 and neg[i] < x:
            i += 1
        if j < i:
            j = i
        while j < n0 and neg[j] <= x:
            j += 1
        below += i
        upto += j
    return below, upto, True


def _auc(score: np.ndarray, y: np.ndarray) -> float:
    """ROC-AUC = P(positive scores above a negative) + P(tie) / 2 (the Mann-Whitney statistic
    with average ranks): both classes sorted in their own float type (a float32 sort orders as
    the float64 one does), each positive counted against the negatives in one merge-like pass."""
    score = np.asarray(score)
    if score.dtype not in (np.float32, np.float64):
        score = score.astype(np.float64)
    score = score.ravel()
    y = np.asarray(y, dtype=bool).ravel()
    n1 = int(y.sum())
    n0 = y.size - n1
    if n1 == 0 or n0 == 0:
        return float("nan")
    pos = np.sort(score[y])
    neg = np.sort(score[~y])
    below, upto, ok = _rank_counts(pos, neg)
    if not ok:
        below = np.searchsorted(neg, pos, "left").sum()
        upto = np.searchsorted(neg, pos, "right").sum()
    return float(0.5 * (below + upto) / (n1 * n0))


def _ece(conf: np.ndarray, y: np.ndarray, bins: int = 10) -> float:
    """Expected calibration error with ``bins`` equal-width bins on [0, 1]."""
    c = np.asarray(conf, dtype=np.float64).ravel()
    y = np.asarray(y, dtype=np.float64).ravel()
    if c.size == 0:
        return float("nan")
    b = np.minimum((c * bins).astype(np.int64), bins - 1)
    sc = np.bincount(b, weights=c, minlength=bins)
    sy = np.bincount(b, weights=y, minlength=bins)
    return float(np.abs(sc - sy).sum() / c.size)


def head_quality(conf: np.ndarray, accept: np.ndarray, mask: np.ndarray | None = None) -> tuple[float, float]:
    """(ROC-AUC, ECE) of confidences against per-draft accept outcomes; ``mask`` (bool, same
    shape) selects the drafts to score (e.g. only verified ones). AUC is NaN when only one
    outcome occurs; ECE uses 10 equal-width bins."""
    conf = np.asarray(conf)
    accept = np.asarray(accept, dtype=bool)
    if mask is not None:
        m = np.asarray(mask, dtype=bool)
        conf, accept = conf[m], accept[m]
    return _auc(conf, accept), _ece(conf, accept)
