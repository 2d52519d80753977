"""Speculative methods, the acceptance model and the confidence head.

Public API (see docs/dev/architecture.md, "Spec interface"):

* ``make_method(name, k=None, adaptive=False) -> SpecMethod``; ``SpecMethod.draft_ms(cost, n)``.
* ``load_acceptance(name_or_path, method) -> AcceptanceCurves`` (presets in ``dsim/presets``,
  YAML/JSON files, ``const:P`` or an inline ``"math=0.9,0.8;chat=0.7"`` string);
  ``parse_acceptance(arg)`` for the inline forms.
* ``AcceptanceModel(curves, class_names, k, ...)``: ``request_latent(rng, cls)``,
  ``sample(rng, cls, latent, steps) -> StepDraws`` ([steps, R, K] arrays, the engine's compiled
  sampler dsim.engine.compiled_step.draw_slots), ``kernel_params()``.
* ``SpecConfig`` (what the user asks for; the one home of ``verify_mode``) and
  ``SpecRuntime.build(config, class_names, cost, ...)`` (method, acceptance model, budget policy,
  verify mode: what an engine replica uses).
* ``accepted_prefix(accept, window)``: leading accepted drafts inside the verify window.
* ``head_quality(conf, accept, mask=None) -> (auc, ece)``.

Acceptance model (docs/user/semantics.md §3). For a request r of class c, at step t and draft position k::

    logit p_true[t, r, k] = logit P[c, k] + shift[c, k]
                            + sigma_request * z_r          (per request, fixed: its difficulty)
                            + sigma_step    * u_{t, r}     (per step, shared by the block)
                            + sigma_token   * v_{t, r, k}  (per draft token)

with z, u, v independent standard normals. P[c, k] is the preset's conditional acceptance (the
probability that draft k is accepted given drafts 1..k-1 were, the quantity of the DSpark paper's
Fig. 2). ``shift`` is solved once with Gauss-Hermite quadrature so the noise does not move the
means. Two ways to preserve them (``preserve=``):

* ``"chain"`` (default): the *conditional* acceptance given the accepted prefix equals P[c, k],
  i.e. E[prod_{j<=k} p_true_j] = prod_{j<=k} P[c, j] for every k. This keeps the expected
  emitted tokens tau = 1 + sum_k prod_{j<=k} P_j (the chain identity, docs/user/semantics.md §1) at the
  published value for a fixed block, which is what throughput depends on. Without it the shared
  latent terms make surviving prefixes easier than average and inflate tau.
* ``"marginal"``: E[p_true_k] = P[c, k] position by position (each draft's unconditional mean).

Default noise levels (our choices, documented assumptions): sigma_request = 0.8 and
sigma_step = 0.5 (moderate persistent and bursty difficulty), sigma_token = 3.0. The token term is
large because per-token acceptance is strongly bimodal in practice (most drafts are near-certain,
a few are forks): published confidence heads reach ROC-AUC 0.81-0.90 (docs/user/semantics.md §3), and that is
only possible when p_true itself spreads widely. With sigma_token = 3 a perfect head reaches an
AUC of about 0.92-0.93 on the Fig. 2 curves; with sigma_token = 0 the ceiling is about 0.75.

Confidence head: ``logit(c) = (logit(p_true) + N(0, s^2)) / T``. ``s`` is set by bisection so the
ROC-AUC of c against the realized per-draft accept outcomes equals ``head_auc`` (default 0.85;
published 0.81-0.90), on a fixed-seed calibration sample (equal class mix, all K positions, each
draft's own outcome, prefix ignored). Even a perfect head (c = p_true) has AUC < 1 because the
outcome is a coin flip; when the target exceeds that ceiling s = 0 and ``head_notes`` says so.
``T`` is set from ``head_ece`` (default 0.01 = calibrated, as after the paper's sequential
temperature scaling; raw heads are 3-8%): the ECE-minimising T when the target is at or below the
minimum, else the overconfident T < T* whose ECE equals the target. Modes: ``"model"``,
``"perfect"`` (c = p_true), ``"useless"`` (c = P[c, k], the class-position curve: no per-request
information).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numba import njit

from dsim.errors import InputError

__all__ = [
    "METHODS",
    "METHOD_KINDS",
    "MethodKind",
    "register_method",
    "SpecMethod",
    "make_method",
    "AcceptanceCurves",
    "parse_acceptance",
    "load_acceptance",
    "preset_names",
    "AcceptanceModel",
    "StepDraws",
    "SpecConfig",
    "SpecRuntime",
    "accepted_prefix",
    "head_quality",
    "chain_tau",
]

PRESET_DIR = Path(__file__).parent.with_name("presets")

# --------------------------------------------------------------------------------------------
# Methods and draft cost
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MethodKind:
    """What a speculative method is, declared once where it is registered (``register_method``):

    * ``name``: its ``--methods`` / ``make_method`` name; ``aliases``: other spellings;
    * ``default_k``: drafts per request per step when k is not given (0: it does not draft);
    * ``k_max``: the largest k it takes (k in 1..k_max for a drafting method);
    * ``has_head``: its drafter carries a confidence head (its confidences are sampled by the
      head model and scored; adaptive verification needs one);
    * ``model_head``: it needs layers trained for the target model (its own MTP layers, a DSpark
      drafter: ``dsim.spec.capability.method_fit`` checks the profile for them);
    * ``acceptance``: the acceptance preset it is sized on unless one is given.

    Its draft cost is ``SpecMethod.draft_ms`` (the profile's drafter table, else a stated
    fraction of a target forward)."""

    name: str
    default_k: int
    k_max: int
    has_head: bool
    model_head: bool
    acceptance: str
    aliases: tuple[str, ...] = ()


METHOD_KINDS: dict[str, MethodKind] = {}  # name -> kind, in registration order
_ALIASES: dict[str, str] = {}  # other spellings -> name


def register_method(kind: MethodKind) -> MethodKind:
    """Register a method kind under its name and aliases."""
    for spelling in (kind.name, *kind.aliases):
        if spelling in METHOD_KINDS or spelling in _ALIASES:
            raise ValueError(f"method spelling {spelling!r} registered twice")
    METHOD_KINDS[kind.name] = kind
    _ALIASES.update({a: kind.name for a in kind.aliases})
    return kind


register_method(
    MethodKind(
        "none", default_k=0, k_max=0, has_head=False, model_head=False, acceptance="deepseek-v4", aliases=("no", "off")
    )
)
register_method(
    MethodKind(
        "mtp",
        default_k=1,
        k_max=16,
        has_head=False,
        model_head=True,
        acceptance="deepseek-v4",
        aliases=("mtp1", "mtp-1"),
    )
)
register_method(
    MethodKind(
        "eagle3",
        default_k=7,
        k_max=16,
        has_head=False,
        model_head=False,
        acceptance="qwen3-4b-fig2",
        aliases=("eagle", "eagle-3"),
    )
)
register_method(
    MethodKind(
        "block",
        default_k=7,
        k_max=16,
        has_head=False,
        model_head=False,
        acceptance="qwen3-4b-fig2",
        aliases=("dflash",),
    )
)
register_method(
    MethodKind("dspark", default_k=7, k_max=16, has_head=True, model_head=True, acceptance="deepseek-v4", aliases=())
)
METHODS = tuple(METHOD_KINDS)

# Default draft-cost fractions of a target forward, used only when the cost profile has no
# table for the method (cost.draft_table_ms(kind, n) returns None).
MTP_FRACTION_PER_DRAFT = 0.05
"""MTP: one MTP module (one transformer layer + the shared output head) per draft. A 61-layer
model's layer is 1/61 = 1.6% of the weights, but the vocabulary projection and the small-batch
fixed cost make the measured share larger; we use 0.05 x forward(n_requests) per draft."""
EAGLE3_FRACTION_PER_STEP = 0.06
"""EAGLE-3: K sequential forwards of a one-layer draft head over n_requests tokens each, each
about 0.06 x a target forward of n_requests tokens (small-batch decode is weight-read and
launch bound, so a 1-layer head plus the LM head costs several % of the target)."""
BLOCK_FRACTION = 0.12
"""Block drafter (DFlash): one parallel pass of a deeper (about 5-layer) drafter over
n_requests x K tokens, about 0.12 x a target forward of n_requests x K tokens."""
DSPARK_OVERHEAD = 0.01
"""DSpark: the block pass plus a tiny sequential confidence/refinement head; DSpark paper Fig. 4
reports +0.2-1.3% end-to-end latency over the parallel drafter; we add 1% to the block cost."""


@dataclass(frozen=True)
class SpecMethod:
    """A speculative method: ``name`` in METHODS, ``k`` drafts per request per step (0 for none),
    ``adaptive``: verify window chosen per step by a budget policy (DSpark only)."""

    name: str
    k: int
    adaptive: bool = False

    @property
    def drafts(self) -> bool:
        """The method drafts tokens (every method but none)."""
        return self.k > 0

    @property
    def has_head(self) -> bool:
        """The method's drafter carries a confidence head (``MethodKind.has_head``: DSpark only): its
        confidences are sampled by the head model and scored (AUC, ECE); the others use the class curve."""
        return METHOD_KINDS[self.name].has_head

    @property
    def model_head(self) -> str | None:
        """What the method needs of the target model (dsim.capability checks it): ``mtp`` its own
        MTP layers, ``dspark`` a DSpark drafter trained for it; None for the others (no drafts, or a
        separate draft model that can be trained for any target)."""
        return self.name if METHOD_KINDS[self.name].model_head else None

    def draft_ms(self, cost: Any, n_requests: int) -> float:
        """Draft time (ms) for one step with ``n_requests`` decoding requests.

        ``cost`` is duck-typed: ``cost.draft_table_ms(kind, n) -> float | None`` (profiled table,
        None when absent) and ``cost.forward_ms(n_tokens) -> float`` (target forward at zero
        context). Tables: mtp = one MTP layer for k = 1 (x k); eagle3 = ONE sequential draft step
        (x K); block = one parallel pass; dspark = its own table (a fixed K: the profile's K-position table
        ``dspark@K`` where it has one), else the block table x 1.01.
        Without tables the module-level fractions above apply.
        """
        n = int(n_requests)
        if self.name == "none" or self.k <= 0 or n <= 0:
            return 0.0
        table = getattr(cost, "draft_table_ms", None)

        def tab(kind: str) -> float | None:
            return None if table is None else table(kind, n)

        k = self.k
        if self.name == "mtp":
            t = tab("mtp")
            return float(k * t) if t is not None else float(k * MTP_FRACTION_PER_DRAFT * cost.forward_ms(n))
        if self.name == "eagle3":
            t = tab("eagle3")
            return float(k * t) if t is not None else float(k * EAGLE3_FRACTION_PER_STEP * cost.forward_ms(n))
        if self.name == "block":
            t = tab("block")
            return float(t) if t is not None else float(BLOCK_FRACTION * cost.forward_ms(n * k))
        if self.name == "dspark":
            # K shorter than the profile's draft block: the drafter runs K positions per request
            t = tab(f"dspark@{k}")
            if t is None:
                t = tab("dspark")
            if t is not None:
                return float(t)
            t = tab("block")
            base = t if t is not None else BLOCK_FRACTION * cost.forward_ms(n * k)
            return float(base * (1.0 + DSPARK_OVERHEAD))
        raise InputError(f"method: unknown method {self.name!r}")

    def draft_ms_upto(self, cost: Any, n_max: int) -> np.ndarray:
        """``draft_ms(cost, n)`` for n = 0..n_max as one float64 array: from the profile's table in
        one vectorized pass (``cost.draft_table_ms_upto``, the same operations element by element),
        else size by size."""
        upto = getattr(cost, "draft_table_ms_upto", None)
        k = self.k
        if self.name != "none" and k > 0 and upto is not None:
            if self.name in ("mtp", "eagle3"):
                t = upto(self.name, n_max)
                if t is not None:
                    return k * t
            elif self.name == "block":
                t = upto("block", n_max)
                if t is not None:
                    return t
            elif self.name == "dspark":
                t = upto(f"dspark@{k}", n_max)
                if t is None:
                    t = upto("dspark", n_max)
                if t is not None:
                    return t
        return np.array([self.draft_ms(cost, n) for n in range(n_max + 1)], dtype=np.float64)


def make_method(name: str, k: int | None = None, adaptive: bool = False) -> SpecMethod:
    """Build a SpecMethod. ``name``: none, mtp, eagle3, block (alias dflash), dspark.
    ``k`` defaults to 1 for mtp and 7 for eagle3/block/dspark (the paper's block size).
    ``adaptive=True`` is only meaningful for dspark (the only method with a confidence head)."""
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in METHODS:
        raise InputError(f"method: unknown method {name!r} (choose from {', '.join(METHODS)}, dflash)")
    if key == "none":
        if adaptive:
            raise InputError("method: adaptive verification needs drafts (method none has none)")
        return SpecMethod("none", 0, False)
    kind = METHOD_KINDS[key]
    kk = kind.default_k if k is None else int(k)
    if kk < 1 or kk > kind.k_max:
        raise InputError(f"method: k must be in 1..{kind.k_max} for {key}, got {k}")
    m = SpecMethod(key, kk, bool(adaptive))
    if adaptive and not m.has_head:
        raise InputError(f"method: adaptive verification needs a confidence head (dspark), not {key}")
    return m


# --------------------------------------------------------------------------------------------
# Acceptance curves (presets, files, inline strings)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AcceptanceCurves:
    """Conditional acceptance per class and draft position.

    ``curves[class][k-1]`` = P(draft k accepted | drafts 1..k-1 accepted). ``curve(cls, K)`` pads
    a short curve with its last value and truncates a long one. Classes not present use the
    ``default`` curve; a set without ``default`` uses the position-wise mean of its classes."""

    curves: Mapping[str, tuple]
    source: str = ""
    name: str = ""
    method: str | None = None
    model: str = ""  # the model the curves were measured or derived for (a file's `model:`), if said
    models: tuple = ()  # the model ids (profiles' provenance.model) they are for (a file's `models:`)

    def __post_init__(self):
        if not self.curves:
            raise InputError(f"acceptance {self.name}: no curves")
        for c, v in self.curves.items():
            if len(v) == 0:
                raise InputError(f"acceptance {self.name}: class {c}: empty curve")
            for p in v:
                if not (0.0 <= float(p) <= 1.0) or not math.isfinite(float(p)):
                    raise InputError(f"acceptance {self.name}: class {c}: probability {p} not in [0, 1]")

    @property
    def classes(self) -> tuple:
        return tuple(self.curves)

    @property
    def k(self) -> int:
        return max(len(v) for v in self.curves.values())

    def default_curve(self) -> np.ndarray:
        if "default" in self.curves:
            return np.asarray(self.curves["default"], dtype=np.float64)
        kmax = self.k
        return np.mean([_pad(v, kmax) for v in self.curves.values()], axis=0)

    def curve(self, cls: str, k: int) -> np.ndarray:
        """Curve of class ``cls`` (falls back to the default) as float64[k]."""
        v = self.curves.get(cls)
        v = self.default_curve() if v is None else np.asarray(v, dtype=np.float64)
        return _pad(v, k)

    def tau(self, cls: str, k: int | None = None) -> float:
        """Expected emitted tokens per step with a fixed block of k (chain identity)."""
        return chain_tau(self.curve(cls, self.k if k is None else k))


def _pad(v, k: int) -> np.ndarray:
    v = np.asarray(v, dtype=np.float64)
    if k <= len(v):
        return v[:k].copy()
    return np.concatenate([v, np.full(k - len(v), v[-1])])


def chain_tau(p: Any) -> float:
    """tau = 1 + sum_k prod_{j<=k} p_j (docs/user/semantics.md §1; DSpark paper section 3)."""
    p = np.asarray(p, dtype=np.float64)
    return float(1.0 + np.cumprod(p).sum())


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def _probability(v, what: str) -> float:
    """A probability as written by the user: a finite number in [0, 1] (not a string or bool)."""
    from dsim.errors import plain

    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise InputError(f"{what}: must be a probability (a number in [0, 1]), got {plain(v)}")
    f = float(v)
    if not (math.isfinite(f) and 0.0 <= f <= 1.0):
        raise InputError(f"{what}: must be in [0, 1], got {plain(v)}")
    return f


def parse_acceptance(arg: str) -> AcceptanceCurves:
    """Inline curves: ``const:P`` (one constant p, class default, one position: padded to any K),
    ``"math=0.9,0.8,0.7;chat=0.7,0.5"`` (per class, ``;``-separated) or ``"0.9,0.8"`` (default)."""
    from dsim.errors import shown

    s = str(arg).strip()
    if not s:
        raise InputError("--acceptance: empty (a preset name, a file, const:P or class=p1,p2,...)")
    if s.lower().startswith("const:"):
        try:
            p = float(s[6:])
        except ValueError:
            raise InputError(f"--acceptance: const:P needs a number, got {shown(s)}") from None
        p = _probability(p, f"--acceptance: {shown(s)}")
        return AcceptanceCurves({"default": (p,)}, source=f"constant p = {p} (user)", name=s)
    curves = {}
    for part in [x for x in s.split(";") if x.strip()]:
        if "=" in part:
            cls, vals = part.split("=", 1)
            cls = cls.strip()
        else:
            cls, vals = "default", part
        try:
            curve = tuple(float(x) for x in vals.split(",") if x.strip())
        except ValueError:
            raise InputError(f"--acceptance: {shown(part)}: expected comma-separated probabilities") from None
        if not cls or not curve:
            raise InputError(f"--acceptance: {shown(part)}: expected class=p1,p2,...")
        if cls in curves:
            raise InputError(f"--acceptance: class {shown(cls)} given twice")
        curves[cls] = tuple(_probability(x, f"--acceptance: {cls}[{i}]") for i, x in enumerate(curve))
    if not curves:
        raise InputError(f"--acceptance: empty curve string {shown(s)}")
    return AcceptanceCurves(curves, source=f"user curves {s!r}", name=s)


def _from_mapping(doc, where_: str, method: str | None, marks=None) -> AcceptanceCurves:
    """Curves from a parsed preset; errors name the file (``where_``) and, with ``marks`` (a
    dsim.schema.Doc), the line of the bad field."""
    from dsim import schema as Sch
    from dsim.errors import plain

    d = marks if marks is not None else Sch.Doc(where_)
    if not isinstance(doc, dict):
        raise InputError(f"{d.at()}: expected a mapping with 'classes' or 'methods'")
    src = str(doc.get("source", "") or "").strip()
    name = str(doc.get("name", where_))
    if "methods" in doc:
        methods = doc["methods"]
        if not isinstance(methods, dict) or not methods:
            raise InputError(f"{d.at('methods')}: expected a mapping method -> {{classes: ...}}")
        key = None
        if method is not None:
            m = _ALIASES.get(str(method).lower(), str(method).lower())
            key = m if m in methods else None
            if key is None:
                raise InputError(
                    f"{d.at('methods')}: no curve for method {method!r} (has {', '.join(map(str, methods))})"
                )
        elif len(methods) == 1:
            key = next(iter(methods))
        else:
            raise InputError(f"{d.at('methods')}: several methods ({', '.join(map(str, methods))}); name one")
        block = methods[key]
        if not isinstance(block, dict):
            raise InputError(f"{d.at('methods', key)}: expected a mapping with 'classes', got {plain(block)}")
        classes = block.get("classes")
        ckeys = ("methods", key, "classes")
        mname = key
    else:
        classes = doc.get("classes")
        ckeys = ("classes",)
        mname = method
    if not isinstance(classes, dict) or not classes:
        raise InputError(f"{d.at(*ckeys)}: expected a mapping class -> [p1, p2, ...]")
    curves = {}
    for c, v in classes.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            v = [v]
        if not isinstance(v, list) or not v:
            raise InputError(f"{d.at(*ckeys, c)}: expected a non-empty list of probabilities, got {plain(v)}")
        curves[str(c)] = tuple(Sch.number(x, d, *ckeys, c, i, lo=0.0, hi=1.0) for i, x in enumerate(v))
    models = doc.get("models")
    if models is None:
        models = []
    if not isinstance(models, list) or not all(isinstance(m, str) and m.strip() for m in models):
        raise InputError(
            f"{d.at('models')}: expected a list of model ids (e.g. [deepseek-v4-flash]), got {plain(models)}"
        )
    return AcceptanceCurves(
        curves, source=src, name=name, method=mname, model=str(doc.get("model") or ""), models=tuple(models)
    )


def load_acceptance(name_or_path: str, method: str | None = None) -> AcceptanceCurves:
    """Curves for ``method`` (none/mtp/eagle3/block/dflash/dspark) from a preset name
    (``preset_names()``), a ``.yaml``/``.yml``/``.json`` file with the preset schema, or an inline
    string (``parse_acceptance``). A file with ``methods:`` must have the method; a file with
    top-level ``classes:`` or an inline string applies to any method."""
    from dsim import schema as Sch
    from dsim.errors import shown

    s = str(name_or_path).strip()
    if not s:
        raise InputError("--acceptance: empty (a preset name, a file, const:P or class=p1,p2,...)")
    preset = PRESET_DIR / f"{s}.yaml" if "/" not in s and "\\" not in s else None
    path = None
    if preset is not None and preset.is_file():
        path = preset
    elif os.path.isdir(s):
        raise InputError(f"{s}: is a directory, not an acceptance file")
    elif os.path.isfile(s):
        path = Path(s)
    elif s.lower().endswith((".yaml", ".yml", ".json")):
        raise InputError(f"{s}: acceptance file not found")
    if path is None:
        if s.lower().startswith("const:") or "=" in s or "," in s or _is_float(s):
            return parse_acceptance(s)
        raise InputError(
            f"--acceptance: {shown(s)} is not a preset ({', '.join(preset_names())}), a file, const:P or class=p1,p2"
        )
    try:  # a file read again unchanged (every simulation of a plan builds its curves) is not re-parsed
        st = path.stat()
        key = (str(path.resolve()), st.st_mtime_ns, st.st_size, method)
    except OSError:
        key = None
    got = _LOADED.get(key) if key is not None else None
    if got is not None and got[0] == str(path):
        return got[1]
    doc, marks = Sch.read_document(path, kind="json" if path.suffix.lower() == ".json" else "yaml")
    curves = _from_mapping(doc, str(path), method, marks)
    if key is not None:
        _LOADED[key] = (str(path), curves)
    return curves


# (resolved path, mtime, size, method) -> (the path as given, its AcceptanceCurves: frozen)
_LOADED: dict = {}


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


# --------------------------------------------------------------------------------------------
# Acceptance model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepDraws:
    """One window of draws, arrays [steps, R, K]: the true conditional acceptance probability,
    the realized per-draft outcomes (independent per draft; prefix semantics are applied with
    ``accepted_prefix``) and the confidence head's output."""

    p_true: np.ndarray
    accept: np.ndarray
    conf: np.ndarray

    def full_block_accepted(self) -> np.ndarray:
        """Leading accepted drafts of the whole block (window K), int64[steps, R]."""
        return accepted_prefix(self.accept, self.accept.shape[-1])


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p):
    p = np.clip(np.asarray(p, dtype=np.float64), 1e-9, 1 - 1e-9)
    return np.log(p) - np.log1p(-p)


_GH_X, _GH_W = np.polynomial.hermite_e.hermegauss(48)  # probabilists' Hermite: weight exp(-x^2/2)
_GH_W = _GH_W / _GH_W.sum()


def _bisect_vec(f, target, lo=-40.0, hi=40.0, iters=70):
    """Vectorized bisection for increasing f: finds x with f(x) = target elementwise."""
    lo = np.full(np.shape(target), lo)
    hi = np.full(np.shape(target), hi)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        up = f(mid) < target
        lo = np.where(up, mid, lo)
        hi = np.where(up, hi, mid)
    return 0.5 * (lo + hi)


_SHIFT_CACHE: dict = {}


def _shifts_cached(P: np.ndarray, s_shared: float, s_token: float, preserve: str) -> np.ndarray:
    """``_shifts``, cached per process (plans and sweeps build the same model many times)."""
    key = (P.tobytes(), P.shape, s_shared, s_token, preserve)
    hit = _SHIFT_CACHE.get(key)
    if hit is None:
        hit = _SHIFT_CACHE[key] = _shifts(P, s_shared, s_token, preserve)
        hit.flags.writeable = False
        while len(_SHIFT_CACHE) > 64:
            _SHIFT_CACHE.pop(next(iter(_SHIFT_CACHE)))
    return hit


def _shifts(P: np.ndarray, s_shared: float, s_token: float, preserve: str) -> np.ndarray:
    """Logit shifts [C, K] so the noisy model keeps the curve means (see module docstring)."""
    L = _logit(P)
    if s_shared == 0 and s_token == 0:
        return np.zeros_like(L)
    if preserve == "marginal":
        s_tot = math.hypot(s_shared, s_token)

        def f(shift: np.ndarray) -> np.ndarray:  # E[sigmoid(L + shift + s_tot Z)]
            x = (L + shift)[..., None] + s_tot * _GH_X
            return (_sigmoid(x) * _GH_W).sum(-1)

        return _bisect_vec(f, P)
    if preserve != "chain":
        raise InputError(f"acceptance: preserve must be 'chain' or 'marginal', got {preserve!r}")
    C, K = P.shape
    shift = np.zeros((C, K))
    g = s_shared * _GH_X  # shared (request + step) term, outer nodes
    # surv[c, i]: prod_{j<k} f_j(g_i), f_j = E_v sigmoid(L_j + shift_j + g + s_token v)
    surv = np.ones((C, g.size))
    target = np.cumprod(P, axis=1)

    for k in range(K):

        def f(sh: np.ndarray, k: int = k, surv: np.ndarray = surv) -> np.ndarray:
            x = (L[:, k] + sh)[:, None, None] + g[None, :, None] + s_token * _GH_X[None, None, :]
            fk = (_sigmoid(x) * _GH_W).sum(-1)  # [C, G]
            return (surv * fk * _GH_W).sum(-1)

        tk = target[:, k]
        ok = tk > 1e-12
        sh = _bisect_vec(f, np.where(ok, tk, 1e-12))
        shift[:, k] = sh
        x = (L[:, k] + sh)[:, None, None] + g[None, :, None] + s_token * _GH_X[None, None, :]
        surv = surv * (_sigmoid(x) * _GH_W).sum(-1)
    return shift


class AcceptanceModel:
    """Samples true acceptance, outcomes and confidences for one method on one workload.

    ``curves``: AcceptanceCurves; ``class_names``: the workload's classes (index = ``cls``);
    ``k``: drafts per step (the method's K). Keyword options and defaults: ``sigma_request=0.8``,
    ``sigma_step=0.5``, ``sigma_token=3.0``, ``preserve="chain"``, ``head="model"``
    (or "perfect", "useless"), ``head_auc=0.85``, ``head_ece=0.01``, ``calib_seed=12345``.
    After construction: ``P`` [C, K] curves, ``shift`` [C, K], ``head_noise`` (s),
    ``head_temp`` (T), ``head_auc_ceiling``, ``head_auc_achieved``, ``head_ece_achieved``,
    ``head_notes`` (list of str), ``tau`` [C] (chain identity per class).
    """

    def __init__(
        self,
        curves: AcceptanceCurves,
        class_names: Sequence[str],
        k: int,
        *,
        sigma_request: float = 0.8,
        sigma_step: float = 0.5,
        sigma_token: float = 3.0,
        preserve: str = "chain",
        head: str = "model",
        head_auc: float = 0.85,
        head_ece: float = 0.01,
        calib_seed: int = 12345,
        calib_requests: int = 8192,
    ):
        if head not in ("model", "perfect", "useless"):
            raise InputError(f"head: expected model, perfect or useless, got {head!r}")
        for nm, v in (("sigma_request", sigma_request), ("sigma_step", sigma_step), ("sigma_token", sigma_token)):
            if not (v >= 0 and math.isfinite(v)):
                raise InputError(f"acceptance: {nm} must be >= 0, got {v}")
        if not (0.5 <= head_auc <= 1.0):
            raise InputError(f"head-auc: must be in [0.5, 1], got {head_auc}")
        if not (0.0 <= head_ece < 0.5):
            raise InputError(f"head-ece: must be in [0, 0.5), got {head_ece}")
        self.curves = curves
        self.class_names = tuple(class_names) if len(class_names) else ("default",)
        self.k = int(k)
        self.sigma_request = float(sigma_request)
        self.sigma_step = float(sigma_step)
        self.sigma_token = float(sigma_token)
        self.preserve = preserve
        self.head = head
        self.head_auc_target = float(head_auc)
        self.head_ece_target = float(head_ece)
        self.head_notes: list[str] = []
        K = self.k
        C = len(self.class_names)
        self.P = np.array([curves.curve(c, K) for c in self.class_names]).reshape(C, K)
        self.tau = np.array([chain_tau(self.P[i]) for i in range(C)])
        s_shared = math.hypot(self.sigma_request, self.sigma_step)
        self.shift = _shifts_cached(self.P, s_shared, self.sigma_token, preserve) if K else np.zeros((C, 0))
        # Base logit per class and position, float32 for sampling. Probabilities of exactly 0 or 1
        # stay exactly 0 / 1 (masks below).
        base = _logit(self.P) + self.shift
        self._base = base.astype(np.float32)
        self._half_baseT = np.ascontiguousarray(0.5 * self._base.T)  # [K, C]: sampling's half-logits
        self._zero = self.P <= 0.0
        self._one = self.P >= 1.0
        self._degenerate = bool(self._zero.any() or self._one.any())
        self._Pf = self.P.astype(np.float32)
        self._PfT = np.ascontiguousarray(self._Pf.T)
        self.head_noise = 0.0
        self.head_temp = 1.0
        self.head_bias = 0.0
        self.head_auc_ceiling = float("nan")
        self.head_auc_achieved = float("nan")
        self.head_ece_achieved = float("nan")
        if K:
            self._calibrate_head(calib_seed, calib_requests)

    # ---- sampling ---------------------------------------------------------------------------

    def request_latent(self, rng: np.random.Generator, cls) -> np.ndarray:
        """Per-request difficulty on the logit scale: sigma_request * N(0, 1), float32[R]."""
        n = int(np.shape(cls)[0])
        return (self.sigma_request * rng.standard_normal(n, dtype=np.float32)).astype(np.float32)

    def _logits(self, rng, cls, latent, steps, token_noise=None):
        R = int(np.shape(cls)[0])
        K = self.k
        x = rng.standard_normal((steps, R, K), dtype=np.float32) if token_noise is None else token_noise
        x *= np.float32(self.sigma_token)
        if self.sigma_step:
            x += np.float32(self.sigma_step) * rng.standard_normal((steps, R, 1), dtype=np.float32)
        x += self._base[cls] + np.asarray(latent, dtype=np.float32)[:, None]
        return x

    def kernel_params(self) -> tuple:
        """The draws' parameters as dsim.engine.compiled_step.DrawParams holds them after the run
        key: (head code, sigma_token / (2T), sigma_step / (2T), s / (2T), b / (2T), T)."""
        from dsim.engine import compiled_step as KS

        t = self.head_temp
        return (
            KS.HEAD_CODES[self.head],
            0.5 * self.sigma_token / t,
            0.5 * self.sigma_step / t,
            0.5 * self.head_noise / t,
            0.5 * self.head_bias / t,
            t,
        )

    def sample(self, rng: np.random.Generator, cls: np.ndarray, latent: np.ndarray, steps: int) -> StepDraws:
        """Draw ``steps`` consecutive steps for R requests (class indices ``cls`` int[R], latents
        from ``request_latent``; the run key from ``rng``) with the engine's compiled sampler
        (dsim.engine.compiled_step.draw_slots, every position's outcome drawn). Returns StepDraws of shape
        [steps, R, K] (float32 / bool / float32)."""
        from dsim.engine import compiled_step as KS

        cls = np.asarray(cls, dtype=np.intp)
        R, K, steps = int(cls.shape[0]), self.k, int(steps)
        if K == 0 or R == 0 or steps == 0:
            z = np.zeros((steps, R, K), dtype=np.float32)
            return StepDraws(z, np.zeros((steps, R, K), dtype=bool), z.copy())
        off = np.ascontiguousarray(self.slot_offsets(cls, latent))
        slots = np.zeros((R, KS.NCOL), dtype=np.int64)
        slots[:, KS.ID] = np.arange(R)
        conf = np.empty((steps, K, R), dtype=np.float32)
        p = np.empty((steps, K, R), dtype=np.float32)
        acc = np.empty((steps, K, R), dtype=bool)
        lead = np.empty((steps, R), dtype=np.int64)
        key = int(rng.integers(0, 2**63))
        draws = tuple(KS.DrawParams(key, *self.kernel_params()))
        KS.draw_slots(draws, slots, off, R, K, steps, True, (conf, lead, acc, p))
        t = (0, 2, 1)
        return StepDraws(p.transpose(t), acc.transpose(t), conf.transpose(t))

    def slot_offsets(self, cls: np.ndarray, latent: np.ndarray) -> np.ndarray:
        """What is fixed for a request while it decodes, position-major float32 [K, R]: its half
        logit before noise, (logit P[c, k] + shift[c, k] + latent_r) / 2, divided by the head's
        temperature T (the scale the sampler works in); +-inf where P is exactly 1 / 0, which
        makes those drafts always / never accepted with confidence exactly 1 / 0. With the
        "useless" head, K more rows: the class curve P[c, k] (its confidences). The engine keeps
        these per decode slot and passes them to the compiled sampler every step."""
        cls = np.asarray(cls, dtype=np.intp)
        if self.head == "useless":
            out = np.empty((2 * self.k, cls.shape[0]), dtype=np.float32)
            out[: self.k] = self._slot_offsets_model(cls, latent)
            out[self.k :] = self._PfT[:, cls]
            return out
        return self._slot_offsets_model(cls, latent)

    def _slot_offsets_model(self, cls, latent) -> np.ndarray:
        off = self._half_baseT[:, cls]  # [K, R], a new array
        off += np.multiply(latent, np.float32(0.5), dtype=np.float32)
        if self.head_temp != 1.0:
            off *= np.float32(1.0 / self.head_temp)
        if self._degenerate:
            off[self._zero[cls].T] = -np.inf
            off[self._one[cls].T] = np.inf
        return off

    # ---- head calibration -------------------------------------------------------------------

    def _calibrate_head(self, seed: int, n_req: int):
        key = (
            seed,
            n_req,
            self.P.tobytes(),
            self.P.shape,
            self.sigma_request,
            self.sigma_step,
            self.sigma_token,
            self.preserve,
            self.head,
            self.head_auc_target,
            self.head_ece_target,
        )
        hit = _HEAD_CACHE.get(key)
        if hit is None:
            hit = _HEAD_CACHE[key] = self._fit_head(seed, n_req)
            while len(_HEAD_CACHE) > 64:
                _HEAD_CACHE.pop(next(iter(_HEAD_CACHE)))
        (
            self.head_noise,
            self.head_bias,
            self.head_temp,
            self.head_auc_ceiling,
            self.head_auc_achieved,
            self.head_ece_achieved,
            notes,
        ) = hit
        self.head_notes.extend(notes)

    def _fit_head(self, seed: int, n_req: int) -> tuple:
        """Fit the head's noise s, offset b and temperature T on a fixed-seed sample. Returns
        (s, b, T, AUC ceiling, AUC achieved, ECE achieved, notes); deterministic in its inputs
        (cached per process: plans and sweeps build the same model many times)."""
        rng = np.random.default_rng(seed)
        C = len(self.class_names)
        cls = np.arange(n_req) % C
        latent = self.request_latent(rng, cls)
        x = self._logits(rng, cls, latent, 1).astype(np.float64).ravel()
        p = 1.0 / (1.0 + np.exp(-x))
        y = rng.random(x.shape) < p
        noise = rng.standard_normal(x.shape)
        notes: list[str] = []
        ceiling = _auc(x, y)
        if self.head != "model":
            c = p if self.head == "perfect" else np.broadcast_to(self.P[cls], (n_req, self.k)).ravel()
            return 0.0, 0.0, 1.0, ceiling, _auc(c, y), _ece(c, y), notes
        target = self.head_auc_target
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
        e_cal = _ece(_sigmoid((z - b) / T_cal), y)
        T = T_cal
        if self.head_ece_target > e_cal:
            # overconfident side (smaller T, sharper), as raw heads are
            lo = 0.02 * T_cal

            def ece_gap(tv: float) -> float:
                return _ece(_sigmoid((z - b) / tv), y) - self.head_ece_target

            if ece_gap(lo) < 0:
                T = lo
                notes.append(f"head-ece {self.head_ece_target} not reachable; T = {lo:.3g}")
            else:
                T = _root(ece_gap, lo, T_cal, xtol=1e-6 * T_cal)
        elif self.head_ece_target < e_cal - 0.002:
            notes.append(
                f"head-ece {self.head_ece_target} is below what the calibration sample reaches "
                f"({e_cal:.4f}); using the calibrated head"
            )
        c = _sigmoid((z - b) / T)
        return float(s), float(b), float(T), ceiling, _auc(c, y), _ece(c, y), notes


_HEAD_CACHE: dict = {}


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
        q = _sigmoid(theta[0] * z + theta[1])
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


def accepted_prefix(accept: np.ndarray, window: int | np.ndarray) -> np.ndarray:
    """Number of leading True in ``accept[..., :window]`` (lossless prefix acceptance inside the
    verify window). ``accept`` bool[..., K], ``window`` int broadcastable to accept[..., 0]."""
    accept = np.asarray(accept, dtype=bool)
    K = accept.shape[-1]
    if K == 0:
        return np.zeros(np.broadcast_shapes(accept.shape[:-1], np.shape(window)), dtype=np.int64)
    first_false = np.where(accept.all(-1), K, np.argmin(accept, axis=-1))
    return np.minimum(first_false, np.asarray(window)).astype(np.int64)


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


# --------------------------------------------------------------------------------------------
# The speculative runtime an engine replica uses
# --------------------------------------------------------------------------------------------

DEFAULT_ACCEPTANCE = {name: kind.acceptance for name, kind in METHOD_KINDS.items()}


def acceptance_name(acceptance: str | None, method: str) -> str:
    """The acceptance a method (a SpecMethod name) is sized on: the one given, else its default
    preset (DEFAULT_ACCEPTANCE)."""
    return acceptance or DEFAULT_ACCEPTANCE.get(method, "deepseek-v4")


@dataclass(frozen=True)
class SpecConfig:
    """What the user asks for: the method, its verify policy and mode, the acceptance curves and
    the confidence head's quality. ``verify_mode`` (SGLang's static | compact | cap-accept) lives
    here only: the engine reads it from the runtime built from this."""

    method: str = "none"  # none | mtp | eagle3 | block | dspark
    k: int | None = None  # drafts per step (default: 1 for mtp, 7 otherwise)
    adaptive: bool = False  # dspark: verify windows chosen per step by `policy`
    policy: str = "vllm"  # vllm | paper | paper-production | sglang | fixed | threshold
    verify_mode: str = "compact"  # static | compact | cap-accept
    acceptance: str | None = None  # preset name, file, inline curves or const:P
    head: str = "model"  # model | perfect | useless
    head_auc: float = 0.85
    head_ece: float = 0.01
    sigma_request: float | None = None
    sigma_step: float | None = None


@dataclass(frozen=True)
class SpecRuntime:
    """The speculative method, its acceptance model, verify-budget policy and verify mode, as an
    engine replica uses them. ``acceptance``, ``curves`` are None without drafts; ``policy`` is
    None unless the method is adaptive. Build with ``SpecRuntime.build``."""

    method: SpecMethod
    verify_mode: str
    acceptance: AcceptanceModel | None = None
    curves: AcceptanceCurves | None = None
    policy: object | None = None  # dsim.spec.budget.BudgetPolicy

    @property
    def k(self) -> int:
        return self.method.k

    @classmethod
    def build(
        cls,
        sc: SpecConfig,
        class_names: Sequence[str],
        cost: Any = None,
        *,
        max_num_seqs: int = 1024,
        max_num_batched_tokens: int = 8192,
        mean_context: float = 0.0,
    ) -> SpecRuntime:
        """From a SpecConfig for a workload's classes. ``cost`` (a CostModel) prices SGLang's
        additive table, built for ``max_num_seqs`` requests, ``max_num_batched_tokens`` tokens and
        a request's context read at ``mean_context`` tokens."""
        from dsim.spec import budget as P

        if sc.verify_mode not in P.VERIFY_MODES:
            raise InputError(f"--verify-mode: must be static, compact or cap-accept, got {sc.verify_mode!r}")
        method = make_method(sc.method, sc.k, sc.adaptive)
        if not method.drafts:
            return cls(method, sc.verify_mode)
        curves = load_acceptance(acceptance_name(sc.acceptance, method.name), method.name)
        opts = {}
        if sc.sigma_request is not None:
            opts["sigma_request"] = sc.sigma_request
        if sc.sigma_step is not None:
            opts["sigma_step"] = sc.sigma_step
        # Only a method with a confidence head calibrates one; the others use the class curve.
        head = sc.head if method.has_head else "useless"
        acceptance = AcceptanceModel(
            curves, class_names, method.k, head=head, head_auc=sc.head_auc, head_ece=sc.head_ece, **opts
        )
        policy = None
        if method.adaptive:
            if sc.policy == "sglang" and cost is not None:
                # SGLang prices a step with an additive table T(R, M) = bias + alpha(R) + theta(M),
                # built here from the profile; alpha carries the drafter and the context read
                # of a request at the workload's mean context.
                table = P.AdditiveCost.from_cost(
                    cost,
                    method,
                    max_requests=max_num_seqs,
                    max_tokens=max_num_batched_tokens,
                    kv_ms_per_request=cost.kv_ms_per_tok * mean_context,
                )
                policy = P.make_policy("sglang", cost=table)
            else:
                policy = P.make_policy(sc.policy)
        return cls(method, sc.verify_mode, acceptance, curves, policy)
