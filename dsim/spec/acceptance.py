"""The acceptance model: how likely each draft is to be accepted, and its draws.

Public API (see docs/dev/architecture.md, "Spec interface"):

* ``load_acceptance(name_or_path, method) -> AcceptanceCurves`` (presets in ``dsim/presets``,
  YAML/JSON files, ``const:P`` or an inline ``"math=0.9,0.8;chat=0.7"`` string);
  ``parse_acceptance(arg)`` for the inline forms; ``chain_tau(p)``, ``preset_names()``.
* ``AcceptanceModel(curves, class_names, k, ...)``: ``request_latent(rng, cls)``,
  ``sample(rng, cls, latent, steps) -> StepDraws`` ([steps, R, K] arrays, the engine's compiled
  sampler dsim.engine.compiled_draws.draw_slots), ``kernel_params()``.
* ``accepted_prefix(accept, window)``: leading accepted drafts inside the verify window.

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

The confidence head's kinds are dsim.spec.heads' registry; a noisy head is fitted to its targets
by dsim.spec.head_fit.fit_head.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dsim.errors import InputError
from dsim.spec.head_fit import fit_head, sigmoid
from dsim.spec.heads import head_kind
from dsim.spec.methods import canonical_method

__all__ = [
    "AcceptanceCurves",
    "parse_acceptance",
    "load_acceptance",
    "preset_names",
    "AcceptanceModel",
    "StepDraws",
    "accepted_prefix",
    "chain_tau",
]

PRESET_DIR = Path(__file__).parent.with_name("presets")

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
            m = canonical_method(method)
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
            return (sigmoid(x) * _GH_W).sum(-1)

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
            fk = (sigmoid(x) * _GH_W).sum(-1)  # [C, G]
            return (surv * fk * _GH_W).sum(-1)

        tk = target[:, k]
        ok = tk > 1e-12
        sh = _bisect_vec(f, np.where(ok, tk, 1e-12))
        shift[:, k] = sh
        x = (L[:, k] + sh)[:, None, None] + g[None, :, None] + s_token * _GH_X[None, None, :]
        surv = surv * (sigmoid(x) * _GH_W).sum(-1)
    return shift


class AcceptanceModel:
    """Samples true acceptance, outcomes and confidences for one method on one workload.

    ``curves``: AcceptanceCurves; ``class_names``: the workload's classes (index = ``cls``);
    ``k``: drafts per step (the method's K). Keyword options and defaults: ``sigma_request=0.8``,
    ``sigma_step=0.5``, ``sigma_token=3.0``, ``preserve="chain"``, ``head="model"``
    (any of dsim.spec.heads.HEADS), ``head_auc=0.85``, ``head_ece=0.01``, ``calib_seed=12345``.
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
        kind = head_kind(head)
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
        self.head_kind = kind
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
        """The draws' parameters as dsim.engine.compiled_bundles.DrawParams holds them after the run
        key: (head code, sigma_token / (2T), sigma_step / (2T), s / (2T), b / (2T), T)."""
        t = self.head_temp
        return (
            self.head_kind.code,
            0.5 * self.sigma_token / t,
            0.5 * self.sigma_step / t,
            0.5 * self.head_noise / t,
            0.5 * self.head_bias / t,
            t,
        )

    def sample(self, rng: np.random.Generator, cls: np.ndarray, latent: np.ndarray, steps: int) -> StepDraws:
        """Draw ``steps`` consecutive steps for R requests (class indices ``cls`` int[R], latents
        from ``request_latent``; the run key from ``rng``) with the engine's compiled sampler
        (dsim.engine.compiled_draws.draw_slots, every position's outcome drawn). Returns StepDraws of shape
        [steps, R, K] (float32 / bool / float32)."""
        from dsim.engine import compiled_bundles, compiled_draws

        cls = np.asarray(cls, dtype=np.intp)
        R, K, steps = int(cls.shape[0]), self.k, int(steps)
        if K == 0 or R == 0 or steps == 0:
            z = np.zeros((steps, R, K), dtype=np.float32)
            return StepDraws(z, np.zeros((steps, R, K), dtype=bool), z.copy())
        off = np.ascontiguousarray(self.slot_offsets(cls, latent))
        slots = np.zeros((R, compiled_bundles.NCOL), dtype=np.int64)
        slots[:, compiled_bundles.ID] = np.arange(R)
        conf = np.empty((steps, K, R), dtype=np.float32)
        p = np.empty((steps, K, R), dtype=np.float32)
        acc = np.empty((steps, K, R), dtype=bool)
        lead = np.empty((steps, R), dtype=np.int64)
        key = int(rng.integers(0, 2**63))
        draws = tuple(compiled_bundles.DrawParams(key, *self.kernel_params()))
        compiled_draws.draw_slots(draws, slots, off, R, K, steps, True, (conf, lead, acc, p))
        t = (0, 2, 1)
        return StepDraws(p.transpose(t), acc.transpose(t), conf.transpose(t))

    def slot_offsets(self, cls: np.ndarray, latent: np.ndarray) -> np.ndarray:
        """What is fixed for a request while it decodes, position-major float32 [K, R]: its half
        logit before noise, (logit P[c, k] + shift[c, k] + latent_r) / 2, divided by the head's
        temperature T (the scale the sampler works in); +-inf where P is exactly 1 / 0, which
        makes those drafts always / never accepted with confidence exactly 1 / 0. With the
        class-curve head (``HeadKind.class_curve``), K more rows: the class curve P[c, k] (its
        confidences). The engine keeps
        these per decode slot and passes them to the compiled sampler every step."""
        cls = np.asarray(cls, dtype=np.intp)
        if self.head_kind.class_curve:
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
        """Fit the head's noise s, offset b and temperature T on a fixed-seed sample
        (dsim.spec.head_fit.fit_head). Returns
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
        curve = np.broadcast_to(self.P[cls], (n_req, self.k)).ravel()
        return fit_head(self.head_kind, x, p, y, noise, curve, self.head_auc_target, self.head_ece_target)


_HEAD_CACHE: dict = {}


def accepted_prefix(accept: np.ndarray, window: int | np.ndarray) -> np.ndarray:
    """Number of leading True in ``accept[..., :window]`` (lossless prefix acceptance inside the
    verify window). ``accept`` bool[..., K], ``window`` int broadcastable to accept[..., 0]."""
    accept = np.asarray(accept, dtype=bool)
    K = accept.shape[-1]
    if K == 0:
        return np.zeros(np.broadcast_shapes(accept.shape[:-1], np.shape(window)), dtype=np.int64)
    first_false = np.where(accept.all(-1), K, np.argmin(accept, axis=-1))
    return np.minimum(first_false, np.asarray(window)).astype(np.int64)
