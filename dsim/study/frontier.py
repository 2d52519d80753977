"""The throughput / interactivity comparison of the DSpark paper (Sec. 5.4, Fig. 7-8).

A sweep gives, per method, points (per-user speed x = output tok/s per user, throughput per GPU
y = output tok/s per GPU), one per load level. From them:

* ``Frontier.from_points(x, y)``: the Pareto frontier (points no other point beats on both
  axes), sorted by x (y then falls), interpolated piecewise-linearly in log-log space between
  adjacent frontier points. Log-log makes a power law y = c x^-s exact, keeps the interpolant
  monotone between monotone points and treats ratios (the quantity compared) evenly across the
  decades a sweep spans. No extrapolation: outside the sampled span a query is out of range.
* ``throughput_gain_at_sla(a, b, sla)``: B's throughput per GPU at per-user speed ``sla`` over
  A's (the paper's "+51% throughput at 80 tok/s/user"). When A's sampled frontier does not reach
  the SLA the gain is unbounded (A cannot serve it) and reported as such; when the SLA is slower
  than a frontier's highest-load point, that frontier's value is a lower bound (more load was not
  sampled) and the result says so.
* ``speed_gain_at_throughput(a, b, t)``: B's per-user speed at throughput per GPU ``t`` over A's
  (the paper's "+60% TPS"); ``matched_throughput_gains(a, b)`` samples it on a log grid over the
  throughput span both frontiers cover and gives its range (the paper's "60% to 85%").
* ``paper_comparison(df, a, b, slas)``: all of it for two methods of a sweep table, as a
  ``Comparison`` record; ``format_comparison`` prints it, ``plot_comparison`` draws Fig. 7 and
  Fig. 8 style figures.
* ``step_at_speed`` / ``gain_split``: each method's step where its frontier meets one per-user
  speed (load, verify tokens, tau, step = tau / speed, split into the fixed one-token forward, the
  verified tokens, the drafter and the rest), and the throughput gain there as headroom over
  per-request cost (the exact identity below).

The paper constructs its matched-throughput gains at A's throughput at each SLA anchor (the
dashed lines of Fig. 7); ``Comparison.at_sla`` carries those as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from dsim.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

    from dsim.cost import Profile

# The paper's SLA anchors (tok/s/user), Sec. 5.4: V4-Flash 80 (moderate) and 120 (strict),
# V4-Pro 35 and 50.
PAPER_SLA_FLASH = (80.0, 120.0)
PAPER_SLA_PRO = (35.0, 50.0)


@dataclass(frozen=True)
class Value:
    """An interpolated value; ``bound`` is "" (inside the sampled span), "lower" (a lower bound:
    the query is past the frontier's highest-load end, where more load was not sampled) or
    "none" (out of reach: the frontier does not get there)."""

    value: float
    bound: str = ""

    @property
    def ok(self) -> bool:
        return self.bound == "" and math.isfinite(self.value)


@dataclass(frozen=True)
class Frontier:
    """Pareto frontier: ``user_tok_s`` strictly increasing, ``gpu_tok_s`` strictly decreasing."""

    user_tok_s: np.ndarray
    gpu_tok_s: np.ndarray
    label: str = ""

    @classmethod
    def from_points(cls, user_tok_s: Sequence[float], gpu_tok_s: Sequence[float], label: str = "") -> Frontier:
        x = np.asarray(user_tok_s, dtype=np.float64)
        y = np.asarray(gpu_tok_s, dtype=np.float64)
        if x.shape != y.shape or x.ndim != 1:
            raise InputError(f"frontier {label}: speed and throughput lists differ in length")
        ok = np.isfinite(x) & np.isfinite(y) & (x > 0) & (y > 0)
        x, y = x[ok], y[ok]
        if len(x) == 0:
            raise InputError(f"frontier {label}: no point with positive speed and throughput")
        # Pareto: walk by speed descending, keep a point only if its throughput beats every
        # faster point's (ties in speed: the higher throughput first).
        order = np.lexsort((-y, -x))
        keep_x: list[float] = []
        keep_y: list[float] = []
        best = -np.inf
        for i in order:
            if y[i] > best:
                if keep_x and math.log(x[i]) == math.log(keep_x[-1]):
                    # a speed one with the last kept in log space (the interpolation's axis, e.g.
                    # 500 and 500 - 6e-14): the higher throughput dominates
                    keep_x.pop()
                    keep_y.pop()
                keep_x.append(x[i])
                keep_y.append(y[i])
                best = y[i]
        return cls(np.array(keep_x[::-1]), np.array(keep_y[::-1]), label)

    @property
    def speed_span(self) -> tuple[float, float]:
        return float(self.user_tok_s[0]), float(self.user_tok_s[-1])

    @property
    def throughput_span(self) -> tuple[float, float]:
        return float(self.gpu_tok_s[-1]), float(self.gpu_tok_s[0])

    def throughput_at(self, user_tok_s: float) -> Value:
        """Throughput per GPU when every user must get at least ``user_tok_s``."""
        lo, hi = self.speed_span
        s = float(user_tok_s)
        if s > hi:
            return Value(0.0, "none")
        if s < lo:
            return Value(float(self.gpu_tok_s[0]), "lower")
        return Value(_loglog(s, self.user_tok_s, self.gpu_tok_s))

    def speed_at(self, gpu_tok_s: float) -> Value:
        """Per-user speed at throughput ``gpu_tok_s`` per GPU."""
        lo, hi = self.throughput_span
        t = float(gpu_tok_s)
        if t > hi:
            return Value(0.0, "none")
        if t < lo:
            return Value(float(self.user_tok_s[-1]), "lower")
        return Value(_loglog(t, self.gpu_tok_s[::-1], self.user_tok_s[::-1]))


def _loglog(q: float, xs: np.ndarray, ys: np.ndarray) -> float:
    """Piecewise-linear interpolation of log y over log x (xs increasing)."""
    if len(xs) == 1:
        return float(ys[0])
    return float(np.exp(np.interp(math.log(q), np.log(xs), np.log(ys))))


@dataclass(frozen=True)
class Gain:
    """B over A at one anchor: ``a``, ``b`` the two values, ``gain`` = b / a - 1 (nan when not
    defined), ``note`` says why when a value is a bound or out of reach."""

    anchor: float
    a: Value
    b: Value
    gain: float
    note: str = ""


def _gain(anchor: float, va: Value, vb: Value, what: str, la: str, lb: str) -> Gain:
    if va.bound == "none" and vb.bound == "none":
        return Gain(anchor, va, vb, float("nan"), f"neither reaches {what}")
    if va.bound == "none":
        return Gain(anchor, va, vb, float("inf"), f"{la} does not reach {what}")
    if vb.bound == "none":
        return Gain(anchor, va, vb, -1.0, f"{lb} does not reach {what}")
    g = vb.value / va.value - 1.0
    notes = [
        f"{lab} value is a lower bound (beyond its highest sampled load)"
        for lab, v in ((la, va), (lb, vb))
        if v.bound == "lower"
    ]
    return Gain(anchor, va, vb, g, "; ".join(notes))


def throughput_gain_at_sla(a: Frontier, b: Frontier, sla_user_tok_s: float) -> Gain:
    return _gain(
        sla_user_tok_s,
        a.throughput_at(sla_user_tok_s),
        b.throughput_at(sla_user_tok_s),
        f"{sla_user_tok_s:g} tok/s/user",
        a.label or "A",
        b.label or "B",
    )


def speed_gain_at_throughput(a: Frontier, b: Frontier, gpu_tok_s: float) -> Gain:
    return _gain(
        gpu_tok_s,
        a.speed_at(gpu_tok_s),
        b.speed_at(gpu_tok_s),
        f"{gpu_tok_s:.0f} tok/s/GPU",
        a.label or "A",
        b.label or "B",
    )


@dataclass(frozen=True)
class MatchedRange:
    """Per-user speed gain of B over A across the throughput span both frontiers cover."""

    throughput_lo: float
    throughput_hi: float
    gain_min: float
    gain_max: float
    gain_at_lo: float  # at the low-throughput (low-load) end
    gain_at_hi: float  # at the high-throughput end
    grid: tuple = ()  # (throughput, gain) samples

    @property
    def empty(self) -> bool:
        return not math.isfinite(self.gain_min)


def matched_throughput_gains(a: Frontier, b: Frontier, n: int = 64) -> MatchedRange:
    lo = max(a.throughput_span[0], b.throughput_span[0])
    hi = min(a.throughput_span[1], b.throughput_span[1])
    nan = float("nan")
    if not (hi >= lo > 0):
        return MatchedRange(lo, hi, nan, nan, nan, nan)
    ts = np.geomspace(lo, hi, n) if hi > lo else np.array([lo])
    g = np.array([b.speed_at(t).value / a.speed_at(t).value - 1.0 for t in ts])
    return MatchedRange(
        float(lo),
        float(hi),
        float(g.min()),
        float(g.max()),
        float(g[0]),
        float(g[-1]),
        tuple(zip(ts.tolist(), g.tolist())),
    )


# ---- one sweep table -> the paper's comparison ----------------------------------------------


def default_user_sla(model: str | None) -> tuple[tuple[float, ...], str]:
    """The paper's SLA anchors for a model name: V4-Pro's for a Pro model, V4-Flash's otherwise
    (the DeepSeek-V4-class default and any other model; pass --user-sla for yours)."""
    m = (model or "").lower()
    if "pro" in m and ("v4" in m or "deepseek" in m):
        return PAPER_SLA_PRO, "the DSpark paper's V4-Pro anchors (Sec. 5.4)"
    if "flash" in m or "deepseek" in m:
        return PAPER_SLA_FLASH, "the DSpark paper's V4-Flash anchors (Sec. 5.4)"
    return PAPER_SLA_FLASH, "the DSpark paper's V4-Flash anchors (Sec. 5.4; not specific to this model)"


def parse_user_sla(s: str) -> tuple[float, ...]:
    """``"80,120"`` -> (80.0, 120.0): per-user speeds in tok/s/user, each > 0."""
    try:
        out = tuple(float(x) for x in str(s).split(",") if x.strip())
    except ValueError:
        raise InputError(f"--user-sla: expected comma-separated tok/s/user values, got {s!r}") from None
    if not out or any(not (v > 0) or not math.isfinite(v) for v in out):
        raise InputError(f"--user-sla: expected values > 0, got {s!r}")
    return out


@dataclass(frozen=True)
class Comparison:
    a: str
    b: str
    label_a: str
    label_b: str
    frontier_a: Frontier
    frontier_b: Frontier
    slas: tuple
    sla_source: str
    throughput_at_sla: tuple  # Gain per SLA (throughput per GPU)
    at_sla: tuple  # Gain per SLA: per-user speed at A's throughput at that SLA
    matched: MatchedRange
    verify: tuple = field(default=())  # (concurrency per GPU, A verify/req, B verify/req)


def paper_comparison(
    df: pd.DataFrame, a: str, b: str, slas: Sequence[float] | None = None, sla_source: str = ""
) -> Comparison:
    """The comparison for methods ``a`` (baseline) and ``b`` of a sweep table (dsim.study.sweep)."""
    for m in (a, b):
        if m not in set(df["method"]):
            raise InputError(f"comparison: method {m!r} not in the sweep ({', '.join(dict.fromkeys(df['method']))})")
    ga, gb = df[df.method == a], df[df.method == b]
    la, lb = str(ga["label"].iloc[0]), str(gb["label"].iloc[0])
    fa = Frontier.from_points(ga["output_tok_s_per_user"], ga["output_tok_s_per_gpu"], la)
    fb = Frontier.from_points(gb["output_tok_s_per_user"], gb["output_tok_s_per_gpu"], lb)
    slas = tuple(float(s) for s in (slas or PAPER_SLA_FLASH))
    thr = tuple(throughput_gain_at_sla(fa, fb, s) for s in slas)
    at = []
    for s in slas:
        ta = fa.throughput_at(s)
        if ta.ok:
            at.append(speed_gain_at_throughput(fa, fb, ta.value))
        else:
            at.append(
                Gain(
                    float("nan"),
                    ta,
                    Value(float("nan"), "none"),
                    float("nan"),
                    f"{la} has no in-span throughput at {s:g} tok/s/user",
                )
            )
    cg = "concurrency_per_gpu" if "concurrency_per_gpu" in df.columns else "concurrency"
    va = ga.set_index("concurrency")
    vb = gb.set_index("concurrency")
    verify = tuple(
        (
            float(va.loc[c, cg]),
            float(va.loc[c, "verify_tokens_per_request"]),
            float(vb.loc[c, "verify_tokens_per_request"]),
        )
        for c in sorted(set(va.index) & set(vb.index))
    )
    return Comparison(a, b, la, lb, fa, fb, slas, sla_source, thr, tuple(at), matched_throughput_gains(fa, fb), verify)


def _pct(g: float) -> str:
    if math.isnan(g):
        return "n/a"
    if g == float("inf"):
        return "unbounded"
    return f"{100 * g:+.0f}%"


def _v(v: Value, nd: int = 0) -> str:
    if v.bound == "none":
        return "not reached"
    return ("≥" if v.bound == "lower" else "") + f"{v.value:.{nd}f}"


def comparison_rows(c: Comparison) -> list[list[str]]:
    """Table rows: what, A, B, gain, note."""
    rows = []
    for s, g in zip(c.slas, c.throughput_at_sla):
        rows.append([f"throughput per GPU at {s:g} tok/s/user", _v(g.a), _v(g.b), _pct(g.gain), g.note])
    for s, g in zip(c.slas, c.at_sla):
        what = (
            f"per-user speed at {g.anchor:.0f} tok/s/GPU (A's throughput at {s:g} tok/s/user)"
            if not math.isnan(g.anchor)
            else f"per-user speed at A's throughput at {s:g} tok/s/user"
        )
        rows.append([what, _v(g.a, 1), _v(g.b, 1), _pct(g.gain), g.note])
    m = c.matched
    if m.empty:
        rows.append(
            ["per-user speed gain at matched throughput", "", "", "n/a", "the frontiers share no throughput span"]
        )
    else:
        rows.append(
            [
                f"per-user speed gain at matched throughput, {m.throughput_lo:.0f}-{m.throughput_hi:.0f} tok/s/GPU",
                "",
                "",
                f"{_pct(m.gain_min)} to {_pct(m.gain_max)}",
                f"low-load end {_pct(m.gain_at_lo)}, high-load end {_pct(m.gain_at_hi)}",
            ]
        )
    return rows


def format_comparison(c: Comparison) -> str:
    lines = [
        f"Paper comparison (DSpark paper Sec. 5.4): A = {c.label_a}, B = {c.label_b}; "
        f"frontier: Pareto points, piecewise-linear in log-log; SLA anchors {', '.join(f'{s:g}' for s in c.slas)} "
        f"tok/s/user ({c.sla_source or 'given'})"
    ]
    w = max(len(r[0]) for r in comparison_rows(c))
    for r in comparison_rows(c):
        lines.append(f"  {r[0]:<{w}}  A {r[1]:>10}  B {r[2]:>10}  gain {r[3]:>12}" + (f"  ({r[4]})" if r[4] else ""))
    if c.verify:
        lines.append(
            "  verify tokens per request (concurrency per GPU: A / B): "
            + ", ".join(f"{cg:g}: {va:.2f} / {vb:.2f}" for cg, va, vb in c.verify)
        )
    return "\n".join(lines)


def plot_comparison(
    df: pd.DataFrame, c: Comparison, out: str | Path, prefix: str = "", context: str = ""
) -> list[Path]:
    """paper_frontier.png (Fig. 7 style: both frontiers, the SLA anchors and gains) and
    paper_load.png (Fig. 8 style: throughput per GPU and verify tokens per request vs
    concurrency per GPU). `context` (dsim.study.figures.context_line): the titles' second line."""
    from dsim.study.figures import pair_colours, pyplot, save_figure, set_title

    plt = pyplot()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ca, cb = pair_colours(c.a, c.b)
    cols = {c.b: cb, c.a: ca}  # (c.a == c.b: one method, its own colour)
    fig, ax = plt.subplots(figsize=(6.6, 4.6))
    for name, f, lab in ((c.a, c.frontier_a, c.label_a), (c.b, c.frontier_b, c.label_b)):
        g = df[df.method == name]
        ax.scatter(g["output_tok_s_per_user"], g["output_tok_s_per_gpu"], s=14, color=cols[name], alpha=0.6)
        xs = np.geomspace(*f.speed_span, 60) if f.speed_span[1] > f.speed_span[0] else np.array(f.speed_span[:1])
        ax.plot(xs, [f.throughput_at(x).value for x in xs], color=cols[name], lw=2, label=lab)
    for s, g in zip(c.slas, c.throughput_at_sla):
        ax.axvline(s, color="#444", ls="--", lw=0.8)
        if g.a.ok and g.b.ok:
            ax.plot([s, s], [g.a.value, g.b.value], "o-", color="#333", ms=4)
            ax.annotate(
                f"{_pct(g.gain)} throughput", (s, g.b.value), xytext=(4, 4), textcoords="offset points", fontsize=7
            )
    for g in c.at_sla:
        if g.a.ok and g.b.ok:
            ax.plot([g.a.value, g.b.value], [g.anchor, g.anchor], "o--", color="#333", ms=4)
            ax.annotate(
                f"{_pct(g.gain)} per-user speed",
                (g.b.value, g.anchor),
                xytext=(4, -10),
                textcoords="offset points",
                fontsize=7,
            )
    ax.set_xlabel("per-user speed (output tok/s per user)")
    ax.set_ylabel("output tok/s per GPU")
    set_title(ax, "Throughput per GPU vs per-user speed (DSpark paper Fig. 7 style)", context)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    p1 = out / f"{prefix}paper_frontier.png"
    save_figure(fig, p1)

    cg = "concurrency_per_gpu" if "concurrency_per_gpu" in df.columns else "concurrency"
    fig, (a1, a2) = plt.subplots(2, 1, figsize=(6.4, 6.4), sharex=True)
    for name, lab in ((c.a, c.label_a), (c.b, c.label_b)):
        g = df[df.method == name].sort_values(cg)
        a1.plot(g[cg], g["output_tok_s_per_gpu"], "o-", color=cols[name], label=lab)
        a2.plot(g[cg], g["verify_tokens_per_request"], "o-", color=cols[name], label=lab)
    a1.set_ylabel("output tok/s per GPU")
    a2.set_ylabel("verified tokens per request per step")
    a2.set_xlabel("concurrent requests per GPU")
    set_title(a1, "Throughput and verify budget vs load (DSpark paper Fig. 8 style)", context)
    for ax in (a1, a2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    p2 = out / f"{prefix}paper_load.png"
    save_figure(fig, p2)
    return [p1, p2]


def fleet_gpus(profile: Profile, nodes: int, gpus_per_node: int) -> int:
    """GPUs a fleet of ``nodes`` nodes runs on: whole replicas of the profile's GPUs per replica
    (at least one replica per node), as dsim.sim counts them."""
    gpr = max(1, int(profile.gpus_per_replica))
    return int(nodes) * max(1, int(gpus_per_node) // gpr) * gpr


def concurrency_from_per_gpu(per_gpu: Sequence[int], profile: Profile, nodes: int, gpus_per_node: int) -> list[int]:
    """Total closed-loop users for per-GPU concurrency levels (the paper's Fig. 8 axis)."""
    g = fleet_gpus(profile, nodes, gpus_per_node)
    return [int(c) * g for c in per_gpu]


def pick_pair(methods: Sequence[str]) -> tuple[str, str] | None:
    """The pair the paper compares in a sweep's methods: MTP-1 (baseline) and DSpark (adaptive
    first: dspark, dspark5, ...; else a fixed one) when both run, else the first and the last
    method; None for a single method."""
    ms = list(methods)
    if len(ms) < 2:
        return None
    a = "mtp" if "mtp" in ms else ms[0]
    ds = [m for m in ms if m.startswith("dspark")]
    b = next((m for m in ds if not m.endswith("-fixed")), ds[0] if ds else ms[-1])
    return (a, b) if a != b else (ms[0], ms[-1])


# ---- the network's floor under a per-GPU load ---------------------------------------------------
# Where each routed expert sits on its own GPU (EP = the routed experts), a token's MoE layer sends
# top-k copies of its hidden state out (FP8 with 1 x 128 block scales, fp32) and receives top-k
# bf16 rows back (DeepEP's low-latency dispatch / combine formats), nearly all across nodes; a NIC
# is full duplex, so what bounds a step is the bytes one way. Priced against nothing else (no
# compute, no drafter, no latency), the step cannot be shorter than those bytes over the NIC.
FP8_SCALE_BLOCK = 128  # DeepSeek's activation block (1 x 128) with one fp32 scale


def a2a_bytes_per_token(
    hidden: int, topk: int, moe_layers: int, combine_bytes: float = 2.0, copies: float | None = None
) -> int:
    """Bytes one token moves one way through its GPU's NIC over the target's MoE layers:
    dispatch copies x (hidden FP8 + hidden / 128 fp32 scales) and combine copies x hidden x
    combine_bytes (bf16: 2, DeepEP's low-latency format; FP8 with its block scales: about 1.03;
    10-bit: 1.25). copies: the token's copies that cross the NIC (default top-k: every routed
    expert on another node, one expert per GPU; see remote_copies for layouts that share nodes)."""
    n = topk if copies is None else copies
    dispatch = n * (hidden + 4 * (-(-hidden // FP8_SCALE_BLOCK)))
    combine = n * combine_bytes * hidden
    return int(moe_layers * (dispatch + combine))


def remote_copies(topk: int, experts: int, nodes: int, dedupe: bool) -> float:
    """Expected copies of one token's hidden state that leave its node per MoE layer, its top-k
    routed experts drawn uniformly without replacement from `experts` spread evenly over `nodes`
    nodes (V4's router: a plain top-k, no node-limited selection). Without dedupe every remote
    expert gets its own copy (DeepEP's low-latency kernels): k (nodes - 1) / nodes. With dedupe one
    copy per remote node hit, forwarded over NVLink inside it (DeepEP's normal kernels):
    (nodes - 1) (1 - C(experts - per_node, k) / C(experts, k))."""
    if nodes <= 1:
        return 0.0
    if not dedupe:
        return topk * (nodes - 1) / nodes
    per_node = experts / nodes
    miss = math.prod((experts - per_node - i) / (experts - i) for i in range(topk))  # node not hit
    return (nodes - 1) * (1.0 - miss)


@dataclass(frozen=True)
class NetworkFloor:
    """The per-GPU all-to-all bandwidth a measured (per-GPU load, throughput) point needs if the
    step did nothing but move its tokens' MoE bytes: tokens per step x bytes per token / step,
    step = tokens emitted per step per request (tau) / per-user speed."""

    method: str
    requests_per_gpu: float
    throughput_tok_s_per_gpu: float
    verify_tokens_per_request: float
    tau: float
    step_ms: float
    bytes_per_token: int
    required_gb_s: float


def network_floor(
    method: str,
    requests_per_gpu: float,
    throughput_tok_s_per_gpu: float,
    verify_tokens_per_request: float,
    tau: float,
    bytes_per_token: int,
) -> NetworkFloor:
    if min(requests_per_gpu, throughput_tok_s_per_gpu, verify_tokens_per_request, tau) <= 0:
        raise ValueError("network_floor: load, throughput, verify tokens and tau must be > 0")
    speed = throughput_tok_s_per_gpu / requests_per_gpu  # tok/s per user
    step_s = tau / speed
    moved = requests_per_gpu * verify_tokens_per_request * bytes_per_token
    return NetworkFloor(
        method=method,
        requests_per_gpu=float(requests_per_gpu),
        throughput_tok_s_per_gpu=float(throughput_tok_s_per_gpu),
        verify_tokens_per_request=float(verify_tokens_per_request),
        tau=float(tau),
        step_ms=1e3 * step_s,
        bytes_per_token=int(bytes_per_token),
        required_gb_s=moved / step_s / 1e9,
    )


# ---- a method's step at a per-user SLA, and why the throughput gain there is what it is ----------
# In a decode-dominated closed loop a request's speed is tokens emitted per step / step time, so at
# per-user speed s a method with acceptance length tau runs steps of tau / s. Its step is the
# profile's forward of one token (what every step pays however few tokens it holds: weights, the
# all-to-all latency floors, the one-token attention) plus what its C requests add (their verified
# tokens' forward, the drafter, attention over their contexts). At one s both methods serve
# C x s tok/s/GPU, so B's throughput gain over A is C_B / C_A - 1, which splits exactly into
#   C_B / C_A = [(t_B - fixed) / (t_A - fixed)] / [per-request cost_B / per-request cost_A],
# per-request cost = (t - fixed) / C: how much more of its step B has beyond the fixed part (its
# step is about tau_B / tau_A times A's), over how much more each of its requests costs.


@dataclass(frozen=True)
class StepAtSpeed:
    """One method's step where its frontier gives per-user speed ``user_tok_s``: the load
    (requests in decode per GPU = throughput / speed), verify tokens per request, tau, the step
    (tau / speed) and its split: the fixed step (forward of one token), the verified tokens'
    forward beyond it, the drafter, and the rest: attention over the requests' contexts beyond the
    zero-context forward table, and the steps' variation around these means (tokens per step vary
    with the budget and the load, the cost curve is not linear, the speed is a mean over requests
    of 1 / TPOT)."""

    method: str
    user_tok_s: float
    requests_per_gpu: float
    verify_tokens_per_request: float
    tau: float
    step_ms: float
    fixed_ms: float
    verify_ms: float
    draft_ms: float
    rest_ms: float

    @property
    def per_request_us(self) -> float:
        """What each request adds to the step beyond the fixed part, us."""
        return 1e3 * (self.step_ms - self.fixed_ms) / self.requests_per_gpu


def _loglog_at(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    """Piecewise log-log interpolation of ys over xs (xs increasing, all > 0) at x inside them."""
    return _loglog(x, xs, ys) if len(xs) > 1 else float(ys[0])


def step_at_speed(
    points: pd.DataFrame,
    method: str,
    user_tok_s: float,
    forward_ms: Callable[[int], float],
    draft_ms: Callable[[int], float],
) -> StepAtSpeed | None:
    """``method``'s step at ``user_tok_s`` on its Pareto frontier (the points the throughput gain
    is read on: columns output_tok_s_per_gpu, output_tok_s_per_user, verify_tokens_per_request,
    acceptance_length, one row per load), priced by the profile's ``forward_ms(tokens)`` and
    ``draft_ms(requests)`` for one GPU. The load is the frontier's throughput there / the speed;
    verify tokens and tau are interpolated log-log between the same two frontier points. None
    when the frontier does not reach the speed inside its sampled span."""
    g = points[points["method"] == method]
    f = Frontier.from_points(g["output_tok_s_per_user"], g["output_tok_s_per_gpu"], method)
    thr = f.throughput_at(user_tok_s)
    if not thr.ok:
        return None
    on = g[g["output_tok_s_per_user"].isin(f.user_tok_s) & g["output_tok_s_per_gpu"].isin(f.gpu_tok_s)]
    on = on.sort_values("output_tok_s_per_user").drop_duplicates("output_tok_s_per_user", keep="last")
    xs = on["output_tok_s_per_user"].to_numpy(np.float64)
    b = _loglog_at(xs, on["verify_tokens_per_request"].to_numpy(np.float64), user_tok_s)
    tau = _loglog_at(xs, on["acceptance_length"].to_numpy(np.float64), user_tok_s)
    c = thr.value / user_tok_s
    step = 1e3 * tau / user_tok_s
    fixed = float(forward_ms(1))
    verify = float(forward_ms(max(1, round(c * b)))) - fixed
    draft = float(draft_ms(max(1, round(c))))
    return StepAtSpeed(method, float(user_tok_s), c, b, tau, step, fixed, verify, draft, step - fixed - verify - draft)


@dataclass(frozen=True)
class GainSplit:
    """B's throughput gain at one per-user speed, C_B / C_A = headroom / cost_ratio exactly:
    ``headroom`` = (t_B - fixed) / (t_A - fixed), ``cost_ratio`` = per-request cost B / A."""

    a: StepAtSpeed
    b: StepAtSpeed
    headroom: float
    cost_ratio: float

    @property
    def gain(self) -> float:
        return self.headroom / self.cost_ratio - 1.0

    @property
    def fixed_share_a(self) -> float:
        """The fixed step's share of A's step at this speed."""
        return self.a.fixed_ms / self.a.step_ms


def gain_split(a: StepAtSpeed, b: StepAtSpeed) -> GainSplit:
    if a.fixed_ms != b.fixed_ms:
        raise ValueError("gain_split: the two steps must come from one profile (equal fixed step)")
    if min(a.step_ms, b.step_ms) <= a.fixed_ms:
        raise ValueError("gain_split: a step at or below the fixed step holds no requests")
    return GainSplit(a, b, (b.step_ms - b.fixed_ms) / (a.step_ms - a.fixed_ms), b.per_request_us / a.per_request_us)
