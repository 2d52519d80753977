"""One engine replica: a continuous-batching scheduler with vLLM V1 semantics (design.md 3.7).

Each step:
1. running requests first, in queue order: a decode takes 1 + its verify window, a prefill takes
   what is left of the token budget (chunked prefill), capped by long_prefill_token_threshold;
2. KV blocks (16 tokens) are allocated for the scheduled tokens; when they run out the engine
   preempts from the tail of the running queue (recompute later) and admits nobody this step;
3. waiting requests are admitted FCFS while the budget, the sequence cap and the KV cache allow;
   prefix-cache hits (full blocks already cached) reduce the tokens to compute;
4. the step's wall time = cost model (forward of n tokens reading kv tokens) + drafter + CPU
   scheduling overhead (hidden when async scheduling overlaps it with the GPU step);
5. prefills that finish their prompt sample one token; decodes emit accepted + 1 tokens.

State is arrays over requests (global per-request table) and the running batch; nothing is a
Python object per request or per token.

Decode-only stretches (nothing to admit, no prefill running) are simulated as a *window* of up to
``max_window`` steps at once ([k, R] arrays), then committed up to the first event (a completion,
a KV shortage, a wake-up by an arrival); later draws are discarded. This is exact: every committed
step is what a one-by-one loop would have produced with the same draws.
"""
from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import simpy

from dsim.cost import KV_BLOCK_TOKENS, CostModel


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 1024                 # vLLM default on H100/H200-class GPUs
    max_num_batched_tokens: int = 8192       # vLLM default on H100/H200-class GPUs
    long_prefill_token_threshold: int = 0    # 0: off
    enable_prefix_caching: bool = False
    async_scheduling: bool = False           # overlap CPU scheduling with the GPU step
    max_window: int = 32                     # decode steps simulated at once
    verify_mode: str = "compact"             # SGLang verify modes: static | compact | cap-accept
    record_shapes: bool = False              # keep each step's (query tokens, context) per request


@dataclass(frozen=True)
class StepRecord:
    """What one engine step produced (the per-step table has one row of these per step)."""
    replica: int
    t_end_s: float
    duration_ms: float
    n_requests: int          # scheduled requests
    n_decode: int            # requests verifying/decoding
    n_tokens: int            # tokens in the target forward
    prefill_tokens: int
    verify_draft_tokens: int  # draft tokens verified
    accepted_tokens: int
    emitted_tokens: int
    kv_tokens: int
    n_waiting: int


STEP_FIELDS = tuple(StepRecord.__dataclass_fields__)


def _subset(draws, keep):
    """The draws of the requests selected by `keep` (arrays are [k, R, K])."""
    return SimpleNamespace(p_true=draws.p_true[:, keep], accept=draws.accept[:, keep],
                           conf=draws.conf[:, keep])


class Requests:
    """Global per-request state arrays shared by all replicas of one simulation."""

    def __init__(self, workload, k: int):
        n = len(workload.prompt_tokens)
        self.n = n
        self.prompt = workload.prompt_tokens.astype(np.int64)
        self.output = workload.output_tokens.astype(np.int64)
        self.cls = workload.cls.astype(np.int64)
        self.arrival = np.full(n, np.nan)
        self.admit = np.full(n, np.nan)
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.last_emit = np.zeros(n)
        self.itl_max = np.zeros(n)
        self.emits = np.zeros(n, dtype=np.int64)
        self.computed = np.zeros(n, dtype=np.int64)
        self.generated = np.zeros(n, dtype=np.int64)
        self.blocks = np.zeros(n, dtype=np.int64)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.cached_tokens = np.zeros(n, dtype=np.int64)
        self.replica = np.full(n, -1, dtype=np.int64)
        self.latent = np.zeros(n)
        kk = max(k, 1)
        self.conf_prev = np.ones((n, kk), dtype=np.float32)
        self.conf_prev2 = np.ones((n, kk), dtype=np.float32)


class SpecStats:
    """Accumulators for speculative decoding outputs (vLLM counter form and per class)."""

    def __init__(self, k: int, n_classes: int, head_sample_cap: int = 200_000):
        self.k = k
        self.num_drafts = 0
        self.num_draft_tokens = 0           # vLLM counter: full K per draft round
        self.verified_draft_tokens = 0      # drafts actually verified (the window)
        self.accepted_per_pos = np.zeros(max(k, 1), dtype=np.int64)
        self.cls_rounds = np.zeros(n_classes)
        self.cls_emitted = np.zeros(n_classes)
        self.cls_verify = np.zeros(n_classes)
        self.cap = head_sample_cap
        self.head_conf: list = []
        self.head_acc: list = []
        self.head_n = 0


class Replica:
    """One engine replica driven by a simpy process."""

    def __init__(self, idx: int, env: simpy.Environment, reqs: Requests, cost: CostModel,
                 cfg: EngineConfig, spec, rng: np.random.Generator, stats: SpecStats,
                 on_finish, prefix_hashes=None, prefix_block_tokens: int = 512):
        self.idx = idx
        self.env = env
        self.R = reqs
        self.cost = cost
        self.cfg = cfg
        self.spec = spec                     # dsim.sim.SpecRuntime (method, acceptance, policy)
        self.K = spec.k if spec is not None else 0
        self.rng = rng
        self.stats = stats
        self.on_finish = on_finish
        self.running = np.zeros(0, dtype=np.int64)   # request ids in queue order
        self.waiting: deque = deque()
        self.free_blocks = cost.profile.kv_capacity_blocks
        self.total_blocks = self.free_blocks
        self.cpu_ms = 0.0 if cfg.async_scheduling else cost.cpu_overhead_ms
        self.steps: list = []                # StepRecord tuples
        self.itl_vals: list = []             # (gap_ms, count) pairs: ITL samples, run-length coded
        self.wake = env.event()
        self.idle = True
        self.prefix_hashes = prefix_hashes
        self.prefix_block_tokens = prefix_block_tokens
        self.prefix_cache: OrderedDict = OrderedDict()
        self.prefix_cap = max(1, self.total_blocks * KV_BLOCK_TOKENS // prefix_block_tokens)
        self.draft_cache: dict = {}
        self.shapes: list | None = [] if cfg.record_shapes else None   # for --step-log
        self.proc = env.process(self.loop())

    # ---- interface used by the router -------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self.running) + len(self.waiting)

    def submit(self, rid: int):
        self.waiting.append(rid)
        self.R.replica[rid] = self.idx
        if not self.wake.triggered:
            self.wake.succeed()

    # ---- helpers ----------------------------------------------------------------------------
    def _draft_ms(self, n: int) -> float:
        if self.K == 0 or n == 0:
            return 0.0
        v = self.draft_cache.get(n)
        if v is None:
            v = self.draft_cache[n] = float(self.spec.method.draft_ms(self.cost, n))
        return v

    def _prefix_hit_tokens(self, rid: int) -> int:
        if not self.cfg.enable_prefix_caching or self.prefix_hashes is None:
            return 0
        hashes = self.prefix_hashes[rid]
        hit = 0
        for h in hashes:
            h = int(h)
            if h in self.prefix_cache:
                self.prefix_cache.move_to_end(h)
                hit += 1
            else:
                break
        for h in hashes[hit:]:
            self.prefix_cache[int(h)] = True
        while len(self.prefix_cache) > self.prefix_cap:
            self.prefix_cache.popitem(last=False)
        # vLLM never serves the whole prompt from cache: the last token is recomputed.
        return int(min(hit * self.prefix_block_tokens, self.R.prompt[rid] - 1))

    def _release(self, rids):
        self.free_blocks += int(self.R.blocks[rids].sum())
        self.R.blocks[rids] = 0

    # ---- the step loop ----------------------------------------------------------------------
    def loop(self):
        env = self.env
        while True:
            if len(self.running) == 0 and not self.waiting:
                self.idle = True
                self.wake = env.event()
                yield self.wake
                self.idle = False
            if self._window_ok():
                yield from self._decode_window()
            else:
                dur_ms = self._general_step()
                if dur_ms is None:          # nothing could be scheduled: wait for an event
                    self.wake = env.event()
                    yield self.wake
                    continue
                yield env.timeout(dur_ms / 1000.0)
                self._commit_general()

    # A general step is computed at its start and committed at its end (its outcome is only
    # visible then); the pending outcome is kept here between the two.
    _pending = None

    def _general_step(self):
        R, cfg, K = self.R, self.cfg, self.K
        run = self.running
        budget = cfg.max_num_batched_tokens
        pending = R.prompt[run] + R.generated[run] - R.computed[run]
        is_dec = (pending == 1) & (R.generated[run] > 0)
        dec_ids = run[is_dec]
        windows = None
        if K > 0 and len(dec_ids):
            windows, draws = self._windows(dec_ids, 1, prefill_tokens=int(pending[~is_dec].sum()))
            wl = windows[0]
            verify = wl if cfg.verify_mode == "compact" else np.full_like(wl, K)
            need_dec = 1 + verify
        else:
            draws = None
            need_dec = np.ones(len(dec_ids), dtype=np.int64)
        need = pending.copy()
        thr = cfg.long_prefill_token_threshold
        if thr > 0:
            need = np.where(is_dec, need, np.minimum(need, thr))
        need[is_dec] = need_dec
        cum = np.cumsum(need)
        sched = np.minimum(need, np.maximum(budget - (cum - need), 0))
        # KV blocks for the scheduled tokens; preempt from the tail when they run out.
        preempted = False
        new_blocks = np.maximum(-(-(R.computed[run] + sched) // KV_BLOCK_TOKENS) - R.blocks[run], 0)
        while int(new_blocks.sum()) > self.free_blocks and len(run):
            victim = run[-1]
            self._release(np.array([victim]))
            R.computed[victim] = 0
            R.preemptions[victim] += 1
            self.waiting.appendleft(int(victim))
            run, sched, need, new_blocks, is_dec = run[:-1], sched[:-1], need[:-1], new_blocks[:-1], is_dec[:-1]
            if windows is not None:
                keep = np.isin(dec_ids, run)
                dec_ids, windows = dec_ids[keep], windows[:, keep]
                draws = _subset(draws, keep)
            preempted = True
        self.running = run
        nb = new_blocks
        self.free_blocks -= int(nb.sum())
        R.blocks[run] += nb
        used = int(sched.sum())
        # Admission: FCFS while budget, sequence cap and blocks allow (not after a preemption).
        admitted, admit_sched = [], []
        if not preempted:
            left = budget - used
            n_run = len(run)
            while self.waiting and left > 0 and n_run < cfg.max_num_seqs:
                rid = self.waiting[0]
                if R.computed[rid] == 0 and R.generated[rid] == 0 and np.isnan(R.admit[rid]):
                    hit = self._prefix_hit_tokens(rid)
                    R.cached_tokens[rid] = hit
                    R.computed[rid] = hit
                todo = int(R.prompt[rid] + R.generated[rid] - R.computed[rid])
                chunk = min(todo, left, thr) if thr > 0 else min(todo, left)
                blocks = -(-(int(R.computed[rid]) + chunk) // KV_BLOCK_TOKENS)
                if blocks > self.free_blocks:
                    break
                self.waiting.popleft()
                self.free_blocks -= blocks
                R.blocks[rid] = blocks
                if np.isnan(R.admit[rid]):
                    R.admit[rid] = self.env.now
                admitted.append(rid)
                admit_sched.append(chunk)
                left -= chunk
                n_run += 1
            if admitted:
                self.running = run = np.concatenate([run, np.array(admitted, dtype=np.int64)])
                sched = np.concatenate([sched, np.array(admit_sched, dtype=np.int64)])
                is_dec = np.concatenate([is_dec, np.zeros(len(admitted), dtype=bool)])
        n_tokens = int(sched.sum())
        if n_tokens == 0:
            self._pending = None
            return None
        kv = int((R.computed[run] + sched).sum())
        # Which requests sample this step: decodes, and prefills whose chunk ends their prompt.
        todo_all = R.prompt[run] + R.generated[run] - R.computed[run]
        samples = (sched > 0) & (sched >= todo_all)
        n_sample = int(samples.sum())
        dur = float(self.cost.step_ms(n_tokens, kv)) + self._draft_ms(n_sample) + self.cpu_ms
        self._pending = (run, sched, is_dec, samples, dec_ids, windows, draws, n_tokens, kv, dur)
        return dur

    def _windows(self, dec_ids, k, prefill_tokens=0):
        """Draft draws and verify windows for decode requests dec_ids over k steps."""
        R, sp, K = self.R, self.spec, self.K
        draws = sp.acceptance.sample(self.rng, R.cls[dec_ids], R.latent[dec_ids], k)
        if sp.method.adaptive:
            conf = draws.conf
            prev = np.empty_like(conf)
            prev[0] = R.conf_prev[dec_ids]
            prev[1:] = conf[:-1]
            prev2 = np.empty_like(conf)
            prev2[0] = R.conf_prev2[dec_ids]
            if k > 1:
                prev2[1] = R.conf_prev[dec_ids]
                prev2[2:] = conf[:-2]
            kv0 = float((R.computed[dec_ids] + 1).sum())
            cost = self.cost
            dms = self._draft_ms(len(dec_ids))
            cpu = self.cpu_ms
            ctx = sp.context(verify_ms=lambda n: cost.step_ms(n, kv0) + cpu, draft_ms=dms,
                             n_nondraft=np.full(k, len(dec_ids) + prefill_tokens, dtype=np.int64),
                             token_limit=self.cfg.max_num_batched_tokens, k_max=K)
            windows = sp.policy.windows(conf, prev, prev2, ctx).astype(np.int64)
        else:
            windows = np.full((k, len(dec_ids)), K, dtype=np.int64)
        return windows, draws

    def _emit(self, ids, emitted, t_end):
        """Record emission of `emitted` tokens by requests `ids` at time t_end (seconds)."""
        R = self.R
        first = R.generated[ids] == 0
        if first.any():
            R.first_token[ids[first]] = t_end
        old = ~first
        if old.any():
            oid = ids[old]
            gaps = (t_end - R.last_emit[oid]) * 1000.0
            R.itl_max[oid] = np.maximum(R.itl_max[oid], gaps)
            g0 = gaps[0]
            if np.all(gaps == g0):
                self.itl_vals.append((g0, len(gaps)))
            else:
                self.itl_vals.extend(zip(gaps.tolist(), [1] * len(gaps)))
            R.emits[oid] += 1
        R.last_emit[ids] = t_end
        R.generated[ids] += emitted

    def _spec_outcome(self, dec_ids, windows, draws, t):
        """Accepted drafts for step t of a window; updates counters. Returns accepted [R]."""
        sp, st, K, R = self.spec, self.stats, self.K, self.R
        wl = windows[t]
        commit = wl if self.cfg.verify_mode != "static" else np.full_like(wl, K)
        acc = sp.accepted_prefix(draws.accept[t], commit)
        st.num_drafts += len(dec_ids)
        st.num_draft_tokens += len(dec_ids) * K
        verified = wl if self.cfg.verify_mode == "compact" else np.full_like(wl, K)
        st.verified_draft_tokens += int(verified.sum())
        st.accepted_per_pos += np.bincount(np.minimum(acc, K), minlength=K + 1)[::-1].cumsum()[::-1][1:]
        cls = R.cls[dec_ids]
        st.cls_rounds += np.bincount(cls, minlength=len(st.cls_rounds))
        st.cls_emitted += np.bincount(cls, weights=acc + 1, minlength=len(st.cls_rounds))
        st.cls_verify += np.bincount(cls, weights=1 + verified, minlength=len(st.cls_rounds))
        if st.head_n < st.cap:
            st.head_conf.append(draws.conf[t].ravel())
            st.head_acc.append(draws.accept[t].ravel())
            st.head_n += draws.conf[t].size
        if sp.method.adaptive:
            R.conf_prev2[dec_ids] = R.conf_prev[dec_ids]
            R.conf_prev[dec_ids] = draws.conf[t]
        return acc, int(verified.sum())

    def _commit_general(self):
        p = self._pending
        self._pending = None
        run, sched, is_dec, samples, dec_ids, windows, draws, n_tokens, kv, dur = p
        R, now = self.R, self.env.now
        # Preemptions can only happen at schedule time, so `run` is still the running set.
        emitted = samples.astype(np.int64)
        accepted_total, verify_total = 0, 0
        dec_mask = is_dec & (sched > 0)
        if windows is not None and dec_mask.any():
            # Decodes cut by the token budget verify fewer drafts than planned.
            win = windows.copy()
            win[0] = np.minimum(win[0], sched[dec_mask] - 1)
            acc, verify_total = self._spec_outcome(dec_ids, win, draws, 0)
            emitted[dec_mask] = acc + 1
            accepted_total = int(acc.sum())
        remaining = R.output[run] - R.generated[run]
        emitted = np.minimum(emitted, remaining)
        if self.shapes is not None:
            m = sched > 0
            self.shapes.append((self.idx, now, sched[m].tolist(), R.computed[run][m].tolist(),
                                float(self.cost.step_ms(n_tokens, kv))))
        # KV now holds: prefills += chunk; decodes += 1 + accepted.
        R.computed[run] += np.where(dec_mask, emitted, sched)
        em_ids = run[emitted > 0]
        if len(em_ids):
            self._emit(em_ids, emitted[emitted > 0], now)
        prefill_tokens = int(sched[~dec_mask].sum())
        self.steps.append((self.idx, now, dur, int((sched > 0).sum()), int(dec_mask.sum()), n_tokens,
                           prefill_tokens, verify_total, accepted_total, int(emitted.sum()), kv,
                           len(self.waiting)))
        self._finish_done()

    def _finish_done(self):
        R = self.R
        run = self.running
        done = R.generated[run] >= R.output[run]
        if done.any():
            ids = run[done]
            R.finish[ids] = self.env.now
            self._release(ids)
            self.running = run[~done]
            for rid in ids.tolist():
                self.on_finish(rid)

    # ---- decode windows ---------------------------------------------------------------------
    def _window_ok(self) -> bool:
        run = self.running
        if len(run) == 0:
            return False
        if self.waiting and len(run) < self.cfg.max_num_seqs:
            return False
        R = self.R
        if np.any(R.prompt[run] + R.generated[run] - R.computed[run] != 1):
            return False
        return len(run) * (1 + self.K) <= self.cfg.max_num_batched_tokens

    def _decode_window(self):
        env, R, K, cfg = self.env, self.R, self.K, self.cfg
        run = self.running
        n = len(run)
        # Steps until the first possible completion bound the window (no draws wasted on them).
        remaining = R.output[run] - R.generated[run]
        k = int(min(cfg.max_window, max(1, remaining.min())))
        if K > 0:
            windows, draws = self._windows(run, k)
            commit = windows if cfg.verify_mode != "static" else np.full_like(windows, K)
            acc = self.spec.accepted_prefix(draws.accept, commit)           # [k, n]
            verified = windows if cfg.verify_mode == "compact" else np.full_like(windows, K)
            n_tok = n + verified.sum(axis=1)
        else:
            windows = draws = None
            acc = np.zeros((k, n), dtype=np.int64)
            n_tok = np.full(k, n)
        emit = acc + 1
        cum = np.cumsum(emit, axis=0)                                     # [k, n]
        done_at = cum >= remaining[None, :]
        # KV blocks: lookahead of 1 + K slots per step, as vLLM allocates for the drafts.
        comp0 = R.computed[run]
        need_blocks = -(-(comp0[None, :] + np.vstack([np.zeros((1, n), np.int64), cum[:-1]]) + 1 + K)
                        // KV_BLOCK_TOKENS)
        extra = np.maximum(need_blocks - R.blocks[run][None, :], 0).sum(axis=1)
        ok_blocks = extra <= self.free_blocks
        stop = np.flatnonzero(done_at.any(axis=1))
        last = int(stop[0]) if len(stop) else k - 1
        bad = np.flatnonzero(~ok_blocks)
        if len(bad):
            if bad[0] == 0:      # even one step needs a preemption: take the general path
                dur = self._general_step()
                yield env.timeout(dur / 1000.0)
                self._commit_general()
                return
            last = min(last, int(bad[0]) - 1)
        kv = (comp0.sum() + np.concatenate([[0], cum.sum(axis=1)[:-1]]) + n_tok)
        dur = self.cost.step_ms(n_tok, kv) + self._draft_ms(n) + self.cpu_ms            # [k]
        t_end = env.now + np.cumsum(dur) / 1000.0
        # Run until the last step ends or an arrival wakes us; then commit steps that ended
        # before the wake-up plus the one in flight.
        self.wake = env.event()
        t0 = env.now
        yield env.any_of([env.timeout(t_end[last] - t0), self.wake])
        if env.now < t_end[last] - 1e-12:
            last = int(np.searchsorted(t_end, env.now - 1e-12, side="left"))
            last = min(last, k - 1)
            if t_end[last] > env.now:
                yield env.timeout(t_end[last] - env.now)
        # Commit steps 0..last.
        for t in range(last + 1):
            if K > 0:
                a, vt = self._spec_outcome(run, windows, draws, t)
            else:
                a, vt = acc[t], 0
            em = np.minimum(a + 1, R.output[run] - R.generated[run])
            if self.shapes is not None:
                q = (1 + windows[t]) if (K > 0 and cfg.verify_mode == "compact") else np.full(n, 1 + K)
                self.shapes.append((self.idx, float(t_end[t]), q.tolist(), R.computed[run].tolist(),
                                    float(self.cost.step_ms(n_tok[t], kv[t]))))
            need = -(-(R.computed[run] + 1 + K) // KV_BLOCK_TOKENS)
            R.computed[run] += em
            grow = np.maximum(need - R.blocks[run], 0)
            self.free_blocks -= int(grow.sum())
            R.blocks[run] += grow
            self._emit_at(run, em, float(t_end[t]), float(dur[t]))
            self.steps.append((self.idx, float(t_end[t]), float(dur[t]), n, n, int(n_tok[t]), 0, int(vt),
                               int(a.sum()), int(em.sum()), int(kv[t]), len(self.waiting)))
        self._finish_done()

    def _emit_at(self, ids, emitted, t_end, dur_ms):
        """Emission inside a window: every request emitted in the previous step too, so each
        ITL sample equals the step duration except right after a general step."""
        R = self.R
        gaps = (t_end - R.last_emit[ids]) * 1000.0
        R.itl_max[ids] = np.maximum(R.itl_max[ids], gaps)
        if np.all(np.abs(gaps - dur_ms) < 1e-9):
            self.itl_vals.append((dur_ms, len(ids)))
        else:
            self.itl_vals.extend(zip(gaps.tolist(), [1] * len(gaps)))
        R.emits[ids] += 1
        R.last_emit[ids] = t_end
        R.generated[ids] += emitted
