"""Reference (tests only): the numpy acceptance-model sampler the compiled draws replaced.

``RefSampler(model).sample(rng, cls, latent, steps)`` draws from the same model as
``AcceptanceModel.sample`` (dsim.engine.compiled_draws.draw_slots) with numpy Generators, DrawStream blocks
and float32 arrays; the compiled draws are checked against it in distribution."""

from __future__ import annotations

import numpy as np

from dsim.spec.acceptance import accepted_prefix


class StepDraws:
    """One window of draws, arrays [steps, R, K]: true conditional acceptance probability,
    realized per-draft outcomes (independent per draft; the engine applies prefix semantics with
    ``accepted_prefix``) and the confidence head's output. ``p_true`` is computed on first use
    from ``half_logit`` = logit(p_true) / 2 (times ``half_logit_scale``) when the sampler
    supplies that instead (the engine never reads it)."""

    __slots__ = ("accept", "conf", "_p", "_h", "_hs", "_acc_sentinel")

    def __init__(self, p_true, accept, conf, half_logit=None, accept_sentinel=None, half_logit_scale: float = 1.0):
        self._p, self._h, self._hs = p_true, half_logit, half_logit_scale
        self.accept = accept
        self.conf = conf
        # [steps, K + 1, R]: accept position-major plus a row of False (first-failure by argmin)
        self._acc_sentinel = accept_sentinel

    def full_block_accepted(self) -> np.ndarray:
        """Leading accepted drafts of the whole block (window K), int64[steps, R]."""
        if self._acc_sentinel is not None:
            return self._acc_sentinel.argmin(axis=1)
        return accepted_prefix(self.accept, self.accept.shape[-1])

    def full_block_accepted_first(self) -> np.ndarray:
        """``full_block_accepted()[0]``: the first step's, int64[R]."""
        if self._acc_sentinel is not None:
            return self._acc_sentinel[0].argmin(axis=0)
        return accepted_prefix(self.accept[0], self.accept.shape[-1])

    @property
    def p_true(self) -> np.ndarray:
        if self._p is None:
            p = np.tanh(self._h * np.float32(self._hs))  # p = (1 + tanh(logit / 2)) / 2
            p *= np.float32(0.5)
            p += np.float32(0.5)
            self._p = p
        return self._p


class RefSampler:
    """The numpy sampler of an AcceptanceModel (its attributes are read, nothing is changed)."""

    def __init__(self, model):
        self.m = model

    def __getattr__(self, name):
        return getattr(self.m, name)

    def sample(self, rng, cls, latent, steps: int) -> StepDraws:
        """Draw ``steps`` consecutive steps for R requests (class indices ``cls`` int[R], latents
        from ``request_latent``); ``rng`` a Generator or a DrawStream (the engine's, cheaper per
        call). Returns StepDraws of logical shape [steps, R, K] (float32/bool/float32); see
        ``sample_slots``."""
        cls = np.asarray(cls, dtype=np.intp)
        st = rng if isinstance(rng, DrawStream) else DrawStream(rng, block=0)
        return self.sample_slots(st, self.slot_offsets(cls, latent), steps)

    def sample_slots(self, st: DrawStream, off: np.ndarray, steps: int) -> StepDraws:
        """``steps`` steps of draws for the slots whose ``slot_offsets`` are ``off`` [K, R].

        Works on the half-logit scaled by 1/T, g = (logit p_true / 2) / T: p = sigmoid(x) =
        (1 + tanh(x / 2)) / 2, so the outcome u < p is atanh(2u - 1) / T < g, and the head's
        confidence is (1 + tanh(g + (s z - b) / (2T))) / 2. The noise terms (sigma_token z,
        atanh(2u - 1), s z - b, all scaled) come pre-transformed from ``st`` a block at a time,
        so a step is a few array operations whatever R (the per-call overhead, not the
        arithmetic, is what costs at these sizes). The arrays are transposed views of
        position-major [steps, K, R] buffers: per-position work over the batch runs along
        contiguous rows, and ``draws.conf[t].T`` is a contiguous [K, R] array."""
        steps = int(steps)
        R = off.shape[-1]
        K = self.k
        if K == 0 or R == 0 or steps == 0:
            z = np.zeros((steps, R, K), dtype=np.float32)
            return StepDraws(z, np.zeros((steps, R, K), dtype=bool), z.copy())
        n = steps * K * R
        shape = (steps, K, R)
        blk = st.take(self, n, self._token_block)  # [3, n]: g noise, threshold, head noise
        g = blk[0].reshape(shape)
        if self.sigma_step:
            g += st.take((self, "step"), steps * R, self._step_block).reshape(steps, 1, R)
        g += off[:K]
        acc_s = np.empty((steps, K + 1, R), dtype=bool)
        np.less(blk[1].reshape(shape), g, out=acc_s[:, :K])
        acc_s[:, K] = False
        accept = acc_s[:, :K]
        p = None
        if self.head == "model":
            conf = blk[2].reshape(shape)
            conf += g
            np.tanh(conf, out=conf)
            conf *= np.float32(0.5)
            conf += np.float32(0.5)
        elif self.head == "perfect":  # T = 1 here
            conf = p = np.tanh(g)
            p *= np.float32(0.5)
            p += np.float32(0.5)
        elif self.head == "useless":
            conf = np.broadcast_to(off[K:], shape)  # read-only view: no information
        else:  # a registered head needs its reference here (tests/test_spec.py draws every one)
            raise ValueError(f"no reference draws for head {self.head!r}")
        t = (0, 2, 1)
        return StepDraws(
            None if p is None else p.transpose(t),
            accept.transpose(t),
            conf.transpose(t),
            half_logit=g.transpose(t),
            accept_sentinel=acc_s,
            half_logit_scale=self.head_temp,
        )

    def _token_block(self, rng: np.random.Generator, m: int) -> np.ndarray:
        """[3, m] float32: sigma_token z1 / (2T), atanh(2u - 1) / T, (s z2 - b) / (2T)."""
        inv_t = 1.0 / self.head_temp
        out = np.empty((3, m), dtype=np.float32)
        a, b = _normal_pair(rng, (m,))
        np.multiply(a, np.float32(0.5 * self.sigma_token * inv_t), out=out[0])
        u = rng.random(m, dtype=np.float32)
        u *= np.float32(2.0)
        u -= np.float32(1.0)
        with np.errstate(divide="ignore"):  # u = 0: atanh(-1) = -inf, never accepted
            np.arctanh(u, out=out[1])
        out[1] *= np.float32(inv_t)
        np.multiply(b, np.float32(0.5 * self.head_noise * inv_t), out=out[2])
        out[2] -= np.float32(0.5 * self.head_bias * inv_t)
        return out

    def _step_block(self, rng: np.random.Generator, m: int) -> np.ndarray:
        """float32[m]: the per-step shared noise sigma_step z / (2T)."""
        z = _normal_block(rng, m)
        z *= np.float32(0.5 * self.sigma_step / self.head_temp)
        return z


class DrawStream:
    """Random draws (float32) from one Generator, generated in blocks of ``block`` values and
    handed out as fresh, disjoint slices (callers may write into them).

    The engine draws a few thousand values per step; generating (and transforming) them a block
    at a time moves the per-call cost of the generator and of the transcendentals off the step
    loop. 2^14 values a block: small enough for each pass over a block to stay in cache (about
    9 ns per value for the engine's three streams, against 20 ns at 2^18 on this machine kind).
    ``take(key, n, make)`` serves n values of the stream ``key``, whose blocks ``make(rng, m)``
    builds (an array whose last axis has length m). Deterministic for a given Generator state and
    sequence of requests. ``block=0``: exactly what is asked (one-off callers)."""

    def __init__(self, rng: np.random.Generator, block: int = 1 << 14):
        self.rng = rng
        self.block = int(block)
        self._bufs: dict = {}  # key -> [block array, next index]

    def take(self, key, n: int, make) -> np.ndarray:
        b = self._bufs.get(key)
        if b is None or b[1] + n > b[0].shape[-1]:
            b = self._bufs[key] = [make(self.rng, max(n, self.block)), 0]
        i = b[1]
        b[1] = i + n
        return b[0][..., i : i + n]


def _normal_block(rng: np.random.Generator, m: int) -> np.ndarray:
    a, b = _normal_pair(rng, ((m + 1) // 2,))
    return np.concatenate([a, b])[:m]


def _normal_pair(rng: np.random.Generator, shape):
    """Two independent float32 standard-normal arrays of ``shape`` by Box-Muller (one log/sqrt
    per pair; about 2x faster than two ``standard_normal`` calls at these sizes)."""
    n = int(np.prod(shape))
    u = rng.random(2 * n, dtype=np.float32)
    r = u[:n]
    np.negative(r, out=r)
    np.log1p(r, out=r)  # log(1 - u), u in [0, 1): finite
    r *= np.float32(-2.0)
    np.sqrt(r, out=r)
    th = u[n:]
    th *= np.float32(2.0 * np.pi)
    a = np.cos(th)
    np.sin(th, out=th)
    a *= r
    th *= r
    return a.reshape(shape), th.reshape(shape)
