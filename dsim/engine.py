"""One engine replica: a continuous-batching scheduler with vLLM V1 semantics (docs/semantics.md §7).

Each step:
1. running requests first: a decode reserves 1 + K tokens and verifies 1 + its window, a prefill
   takes what is left of the token budget (chunked prefill), capped by long_prefill_token_threshold;
2. KV blocks (16 tokens) are allocated for the scheduled tokens; when they run out the engine
   preempts the most recently admitted request (recompute later) and admits nobody this step;
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

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import numpy as np
import simpy

from dsim.cost import KV_BLOCK_TOKENS, CostModel
from dsim.errors import InputError
from dsim.policy import verify_tokens_and_commit
from dsim.spec import DrawStream


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


class Requests:
    """Global per-request state arrays shared by all replicas of one simulation."""

    def __init__(self, workload, k: int):
        n = len(workload.prompt_tokens)
        self.n = n
        self.prompt = workload.prompt_tokens.astype(np.int64)
        self.output = workload.output_tokens.astype(np.int64)
        self.cls = workload.cls.astype(np.int64)
        self.arrival = np.full(n, np.nan)
        self.admit = [math.nan] * n
        self.first_token = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        self.last_emit = np.zeros(n)
        self.itl_max = np.zeros(n)
        self.emits = np.zeros(n, dtype=np.int64)
        # Scalar per-request state read and written one request at a time (admission, prefill)
        # lives in Python lists: indexing a list is several times cheaper than a numpy scalar.
        self.prompt_l = self.prompt.tolist()
        self.output_l = self.output.tolist()
        self.cls_l = self.cls.tolist()
        self.computed = [0] * n
        self.generated = [0] * n
        self.blocks = [0] * n
        self.preemptions = [0] * n
        self.seq = [0] * n                   # admission order on its replica (preemption victims)
        self.cached_tokens = [0] * n
        self.replica = np.full(n, -1, dtype=np.int64)
        self.latent = np.zeros(n)
        self.spec_counts: dict = {}          # rid -> (rounds, accepted, verified) while preempted
        # Per request, the float32 rows its decode slot carries (Replica.X; built by the first
        # replica): acceptance-model slot offsets, then the confidences of its previous draft
        # rounds (ones before its first; written back here when it is preempted).
        self.slot_rows: np.ndarray | None = None


class SpecStats:
    """Accumulators for speculative decoding outputs (vLLM counter form and per class)."""

    def __init__(self, k: int, n_classes: int, head_sample_cap: int = 60_000):
        self.k = k
        self.num_drafts = 0
        self.num_draft_tokens = 0           # vLLM counter: full K per draft round
        self.verified_draft_tokens = 0      # drafts actually verified (the window)
        # Histogram of accepted drafts per round (0..K); accepted_per_pos derives from it. Rounds
        # are buffered and counted 64 steps at a time (one bincount instead of one a step).
        self._hist = np.zeros(max(k, 1) + 1, dtype=np.int64)
        self._acc_buf: list = []
        # Verify utilization (SGLang/DSpark): drafts accepted within the chosen windows over drafts
        # the full block would have had accepted, from the same draws.
        self.accepted_in_window = 0
        self.accepted_full_block = 0
        self.cls_rounds = np.zeros(n_classes)
        self.cls_emitted = np.zeros(n_classes)
        self.cls_verify = np.zeros(n_classes)
        self.cap = head_sample_cap
        self.head_conf: list = []
        self.head_acc: list = []
        self.head_n = 0

    def add_accepted(self, acc: np.ndarray):
        """Accepted drafts of some rounds (any shape; the caller does not modify it later)."""
        self._acc_buf.append(acc.reshape(-1))
        if len(self._acc_buf) >= 64:
            self._count()

    def _count(self):
        if self._acc_buf:
            self._hist += np.bincount(np.concatenate(self._acc_buf), minlength=len(self._hist))
            self._acc_buf = []

    @property
    def accepted_hist(self) -> np.ndarray:
        self._count()
        return self._hist

    @property
    def accepted_per_pos(self) -> np.ndarray:
        """vLLM's counter form: rounds that accepted draft position j (1..K) = rounds with more
        than j - 1 accepted."""
        return self.accepted_hist[::-1].cumsum()[::-1][1:]


# Decode-slot columns: the running requests in decode state, in running-queue order.
_ID, _COMP, _END, _CLS, _EMITS = range(5)      # int64 columns of Replica.I
# Per-request speculative counters, summed per class when the request's row is flushed:
# draft rounds, drafts accepted (within the window), drafts verified.
_ROUNDS, _ASUM, _VSUM = range(5, 8)
_NCOL = 8
_LAST, _ITLMAX = range(2)                              # float64 columns of Replica.F


class Replica:
    """One engine replica driven by a simpy process.

    The running queue is (decode slots) + (requests still prefilling, in admission order).
    Decodes are scheduled before prefills, as vLLM's FCFS queue does when older requests are
    decoding; preemption picks the most recently admitted request by its admission number, since
    with long_prefill_token_threshold a newer short prompt can decode while an older one still
    prefills. Decode slots are two 2D arrays (int and float columns above) so that a
    step is a handful of numpy operations whatever the batch size; prefilling requests are a short
    Python list.
    """

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
        self.stream = DrawStream(rng)        # the draws' normals and uniforms, a block at a time
        self.stats = stats
        self.on_finish = on_finish
        self.I = np.zeros((0, _NCOL), dtype=np.int64)
        self.F = np.zeros((0, 2), dtype=np.float64)
        # Per decode slot, float32 rows aligned with I's rows (position-major [rows, slots]): the
        # acceptance model's slot offsets (what is fixed for a request while it decodes), then
        # the confidences of the previous draft round and, for the paper's production policy, of
        # the one before. Read every step, so they follow the slots instead of being gathered
        # from the request table (which keeps the confidences only across a preemption).
        K = self.K
        off = spec.acceptance.slot_offsets(reqs.cls, reqs.latent) if K else np.zeros((0, reqs.n), np.float32)
        self._off_rows = len(off)
        track = bool(K) and spec.method.adaptive
        track2 = track and getattr(spec.policy, "production", False)
        self._cp = slice(self._off_rows, self._off_rows + K) if track else None
        self._cp2 = slice(self._off_rows + K, self._off_rows + 2 * K) if track2 else None
        rows = self._off_rows + K * (track + track2)
        if K and (reqs.slot_rows is None or len(reqs.slot_rows) != rows):
            reqs.slot_rows = np.concatenate([off, np.ones((rows - len(off), reqs.n), dtype=np.float32)])
        self.X = np.zeros((rows, 0), dtype=np.float32)
        self.pre: list = []                  # request ids prefilling, in queue order
        self.admit_seq = 0
        self.waiting: deque = deque()
        self.kv_dec = 0                      # sum of the decode slots' KV tokens
        # A lower bound on the tokens any decode slot still has to emit: a slot emits at most
        # 1 + K per step, so no completion check is needed while it stays positive.
        self.left_lb = 0
        # KV blocks. A decode slot holds ceil((KV tokens + lookahead) / 16) blocks, lookahead = 1 + K
        # (vLLM allocates slots for the drafts), a function of its KV tokens: the total is
        # checked against a cheap upper bound from kv_dec and computed exactly only near a full cache.
        self.total_blocks = cost.profile.kv_capacity_blocks
        self.pre_blocks = 0                  # blocks held by requests still prefilling
        self.lookahead = 1 + self.K
        self.cpu_ms = 0.0 if cfg.async_scheduling else cost.cpu_overhead_ms
        self.prev_end = -1.0
        self._last_is_prev_end = True        # every decode slot last emitted at prev_end (see _itl)
        self.steps: list = []                # StepRecord tuples
        self.finished: list = []             # (slot rows, float rows, finish time) to flush
        self.itl_vals: list = []             # (gap_ms, count) pairs: ITL samples, run-length coded
        self.wake = env.event()
        self.prefix_hashes = prefix_hashes
        self.prefix_block_tokens = prefix_block_tokens
        self.prefix_cache: OrderedDict = OrderedDict()
        self.prefix_cap = max(1, self.total_blocks * KV_BLOCK_TOKENS // prefix_block_tokens)
        self.draft_cache: dict = {}
        self.shapes: list | None = [] if cfg.record_shapes else None   # for --step-log
        self.verify_mode = cfg.verify_mode
        # The verify-budget policy's one-step entry where it has one (vllm), else None.
        pol = getattr(spec, "policy", None) if spec is not None and spec.method.adaptive else None
        self._one_step = getattr(pol, "one_step", None)
        self._adaptive = pol is not None
        # Forward cost of every step size up to DENSE_TOKENS as a Python list: the hot loop's lookup.
        self._fwd_list = cost.forward_dense.tolist()
        self._kv_ms = cost.kv_ms_per_tok
        self.next_arrival = lambda: None      # set by the simulation: time of the next open-loop arrival
        self.proc = env.process(self.loop())

    # ---- interface used by the router -------------------------------------------------------
    @property
    def outstanding(self) -> int:
        return len(self.I) + len(self.pre) + len(self.waiting)

    def submit(self, rid: int):
        R = self.R
        # A request whose whole life cannot fit the KV cache would be preempted forever (vLLM
        # refuses to start with max_model_len above the cache): say so on arrival.
        need = -(-(R.prompt_l[rid] + R.output_l[rid] - 1 + self.lookahead) // KV_BLOCK_TOKENS)
        if need > self.total_blocks:
            raise InputError(f"request {rid}: {R.prompt_l[rid]} prompt + {R.output_l[rid]} output tokens "
                             f"need {need} KV blocks, the cache holds {self.total_blocks} "
                             f"(profile memory.kv_cache_gib)")
        self.waiting.append(rid)
        self.R.replica[rid] = self.idx
        if not self.wake.triggered:
            self.wake.succeed()

    # ---- helpers ----------------------------------------------------------------------------
    def _step_ms(self, n_tokens: int, kv: int) -> float:
        fl = self._fwd_list
        f = fl[n_tokens] if n_tokens < len(fl) else self.cost.forward_ms(n_tokens)
        return f + self._kv_ms * kv

    def _draft_ms(self, n: int) -> float:
        if self.K == 0 or n == 0:
            return 0.0
        v = self.draft_cache.get(n)
        if v is None:
            v = self.draft_cache[n] = float(self.spec.method.draft_ms(self.cost, n))
        return v

    def _prefix_hit_tokens(self, rid: int) -> int:
        """Tokens of rid's prompt served by the prefix cache: leading full blocks whose hashes
        some request has already computed on this replica."""
        if not self.cfg.enable_prefix_caching or self.prefix_hashes is None:
            return 0
        # Only full blocks can be shared: the last hash may cover a partial block.
        hashes = self.prefix_hashes[rid][: int(self.R.prompt_l[rid]) // self.prefix_block_tokens]
        hit = 0
        for h in hashes:
            h = int(h)
            if h in self.prefix_cache:
                self.prefix_cache.move_to_end(h)
                hit += 1
            else:
                break
        # vLLM never serves the whole prompt from cache: the last token is recomputed.
        return int(min(hit * self.prefix_block_tokens, self.R.prompt_l[rid] - 1))

    def _prefix_insert(self, rid: int, computed: int):
        """Register rid's prompt blocks that are now fully computed (and only those)."""
        hashes = self.prefix_hashes[rid]
        full = min(computed, int(self.R.prompt_l[rid])) // self.prefix_block_tokens
        for h in hashes[:full]:
            h = int(h)
            if h in self.prefix_cache:
                self.prefix_cache.move_to_end(h)
            else:
                self.prefix_cache[h] = True
        while len(self.prefix_cache) > self.prefix_cap:
            self.prefix_cache.popitem(last=False)

    # ---- the step loop ----------------------------------------------------------------------
    def loop(self):
        env = self.env
        while True:
            if len(self.I) == 0 and not self.pre and not self.waiting:
                self.wake = env.event()
                yield self.wake
            if self._window_ok():
                yield from self._decode_window()
                continue
            plan = self._plan_step(False)
            if plan is None:                 # nothing could be scheduled: wait for an event
                self.wake = env.event()
                yield self.wake
                continue
            yield env.timeout(plan[-1] / 1000.0)
            self._commit_step(plan)

    def _preempt_tail(self):
        """Preempt the request at the tail of the running queue, i.e. the most recently admitted
        one (recompute later). Prefilling requests are in admission order; with
        long_prefill_token_threshold a newer short prompt can be decoding while an older long one
        still prefills, so the decode slots are compared too."""
        R = self.R
        j = None
        if len(self.I):
            seqs = [R.seq[r] for r in self.I[:, _ID].tolist()]
            j = max(range(len(seqs)), key=seqs.__getitem__)
        if self.pre and (j is None or R.seq[self.pre[-1]] > seqs[j]):
            rid = self.pre.pop()
            self.pre_blocks -= int(R.blocks[rid])
        else:
            row, frow = self.I[j], self.F[j]
            rid = int(row[_ID])
            R.generated[rid] = R.output_l[rid] - int(row[_END] - row[_COMP])
            R.emits[rid] = row[_EMITS]
            R.spec_counts[rid] = (int(row[_ROUNDS]), int(row[_ASUM]), int(row[_VSUM]))
            R.last_emit[rid] = self.prev_end if self._last_is_prev_end else frow[_LAST]
            R.itl_max[rid] = frow[_ITLMAX]
            self.kv_dec -= int(row[_COMP])
            keep = np.ones(len(self.I), dtype=bool)
            keep[j] = False
            self.I, self.F = self.I[keep], self.F[keep]
            if self.K:
                R.slot_rows[:, rid] = self.X[:, j]    # its confidences, kept for its resumption
                self.X = self.X[:, keep]
        R.blocks[rid] = 0
        R.computed[rid] = 0
        R.preemptions[rid] += 1
        self.waiting.appendleft(rid)

    def _dec_blocks(self, exact: bool) -> int:
        """Blocks held by the decode slots: exact, or an upper bound from kv_dec alone
        (sum of ceil(x_i / 16) <= (sum x_i + 15 n) / 16)."""
        n, la = len(self.I), self.lookahead
        if not exact:
            return (self.kv_dec + n * (la + KV_BLOCK_TOKENS - 1)) // KV_BLOCK_TOKENS
        return int(((self.I[:, _COMP] + (la + KV_BLOCK_TOKENS - 1)) // KV_BLOCK_TOKENS).sum())

    def _fits(self, blocks: int) -> bool:
        """Can `blocks` more KV blocks be allocated? (the exact count only when the bound fails)"""
        free = self.total_blocks - self.pre_blocks
        return free - self._dec_blocks(False) >= blocks or free - self._dec_blocks(True) >= blocks

    def _plan_step(self, preempted: bool):
        """Schedule one step (vLLM V1 order). Returns the plan tuple, or None if nothing runs."""
        R, cfg, K = self.R, self.cfg, self.K
        I = self.I
        n_dec = len(I)
        budget = cfg.max_num_batched_tokens
        thr = cfg.long_prefill_token_threshold
        vc = draws = q = None
        cut = False
        dec_tokens = 0
        # vLLM schedules decodes first, each reserving 1 + K tokens (drafts the verify budget trims
        # do not return theirs), and the running prefills take what is left, in queue order.
        left = max(budget - n_dec * (1 + K), 0)
        chunks = []
        n_pre_sample = 0                     # prefills whose chunk ends their prompt sample a token
        for r in self.pre:
            todo = R.prompt_l[r] + R.generated[r] - R.computed[r]
            c = min(todo, left, thr) if thr > 0 else min(todo, left)
            chunks.append(c)
            n_pre_sample += c > 0 and c == todo
            left -= c
        if n_dec:
            if K:
                # the verify budget, priced with those prefill chunks
                windows, draws = self._windows(I, 1, sum(chunks), self._prefill_ms(chunks))
                vc = verify_tokens_and_commit(self.verify_mode, windows[0], K)   # (verified, commit cap)
                dec_tokens = n_dec + int(np.add.reduce(vc[0]))
            else:
                dec_tokens = n_dec
            if dec_tokens > budget:          # the budget cuts the decode queue (rare)
                qq = 1 + vc[0] if K else np.ones(n_dec, dtype=np.int64)
                cum = np.cumsum(qq)
                q = np.minimum(qq, np.maximum(budget - (cum - qq), 0))
                dec_tokens = budget
                cut = True
        # KV blocks for the scheduled tokens; preempt from the tail when they run out.
        pre_grow = [max(0, -(-(int(R.computed[r]) + c) // KV_BLOCK_TOKENS) - int(R.blocks[r]))
                    for r, c in zip(self.pre, chunks)]
        grow = sum(pre_grow)
        if not self._fits(grow):
            # (a lone request always fits: submit() checked its whole life against the cache)
            assert n_dec + len(self.pre) > 1, "KV accounting: a lone request does not fit"
            self._preempt_tail()
            return self._plan_step(True)
        for r, g in zip(self.pre, pre_grow):
            R.blocks[r] += g
        self.pre_blocks += grow
        # Admission: FCFS while budget, sequence cap and blocks allow (not after a preemption).
        if not preempted:
            n_run = n_dec + len(self.pre)
            while self.waiting and left > 0 and n_run < cfg.max_num_seqs:
                rid = self.waiting[0]
                # (also on re-admission after a preemption: its computed blocks stay cached)
                comp = hit = self._prefix_hit_tokens(rid)
                todo = int(R.prompt_l[rid] + R.generated[rid]) - comp
                c = min(todo, left, thr) if thr > 0 else min(todo, left)
                blocks = -(-(comp + c) // KV_BLOCK_TOKENS)
                if not self._fits(blocks):
                    break
                R.cached_tokens[rid] = hit
                R.computed[rid] = comp
                self.waiting.popleft()
                self.pre_blocks += blocks
                R.blocks[rid] = blocks
                if math.isnan(R.admit[rid]):
                    R.admit[rid] = self.env.now
                self.admit_seq += 1
                R.seq[rid] = self.admit_seq
                self.pre.append(rid)
                chunks.append(c)
                n_pre_sample += c == todo
                left -= c
                n_run += 1
        pre_tokens = sum(chunks)
        n_tokens = dec_tokens + pre_tokens
        if n_tokens == 0:
            return None
        kv = self.kv_dec + dec_tokens + sum(int(R.computed[r]) + c for r, c in zip(self.pre, chunks))
        n_sample = (n_dec if not cut else int((q > 0).sum())) + n_pre_sample
        fwd = self._step_ms(n_tokens, kv) + self._prefill_ms(chunks)
        dur = fwd + self._draft_ms(n_sample) + self.cpu_ms
        # q: tokens per decode slot, only when the budget cut the queue (else 1 + verified)
        return (n_dec, q, cut, vc, draws, list(self.pre), chunks, n_tokens, pre_tokens, kv, fwd, dur)

    def _prefill_ms(self, chunks) -> float:
        """The cost correction (CostModel.prefill_ms) of the prefill chunks of self.pre."""
        if not self.cost.has_prefill_terms:
            return 0.0
        return self.cost.prefill_ms((c, self.R.computed[r]) for r, c in zip(self.pre, chunks) if c)

    def _windows(self, I, k, prefill_tokens=0, prefill_ms=0.0):
        """Draft draws and verify windows for the decode slots over k steps (prefill_tokens and
        prefill_ms: the step's prefill tokens and their cost correction, for the budget's price)."""
        sp, K = self.spec, self.K
        draws = sp.acceptance.sample_slots(self.stream, self.X[:self._off_rows], k)
        if k == 1 and self._one_step is not None:
            # The every-step case: the policy's one-step entry, budgets priced by one cost row.
            n = len(I)
            cost, kv, cpu = self.cost, self.kv_dec + n, self.cpu_ms
            extra = cpu + self._draft_ms(n) + prefill_ms
            w = self._one_step(draws.conf[0], self.X[self._cp].T, n + prefill_tokens, float(n),
                               0.0, lambda n0, n1: cost.step_ms_range(n0, n1, kv, extra),
                               self.cfg.max_num_batched_tokens, K, in_unit=True)
            return w[None], draws
        if sp.method.adaptive:
            conf = draws.conf
            cp = self.X[self._cp].T                          # [R, K] views of [K, R] blocks
            cp2 = self.X[self._cp2].T if self._cp2 is not None else None
            prev = np.concatenate([cp[None], conf[:-1]]) if k > 1 else cp[None]
            if cp2 is None:
                prev2 = None               # only the paper's production variant reads it
            elif k == 1:
                prev2 = cp2[None]
            else:
                prev2 = np.concatenate([cp2[None], cp[None], conf[:-2]])
            cost, cpu = self.cost, self.cpu_ms
            n = len(I)
            dms = self._draft_ms(n)
            limit = self.cfg.max_num_batched_tokens
            # Each step's budget is priced at its own step's KV context, which depends on what the
            # window's earlier steps accepted. Solve it as a fixed point: price with a guess of the
            # contexts, derive the contexts those windows produce, repeat until the windows do not
            # change (then they are exactly what stepping one by one gives); else step by step.
            kv0 = self.kv_dec + n
            left0 = I[:, _END] - I[:, _COMP]
            kv_ms = self.cost.kv_ms_per_tok

            def contexts(win):
                commit = verify_tokens_and_commit(self.verify_mode, win, K)[1]
                acc = sp.accepted_prefix(draws.accept, commit)                       # [k, n]
                em = np.minimum(np.cumsum(acc + 1, axis=0), left0[None, :])
                em_step = np.diff(em, axis=0, prepend=0).sum(axis=1)
                return np.concatenate([[0], np.cumsum(em_step)[:-1]])                 # kv_t - kv0

            def solve(extra, rows=slice(None)):
                ctx = sp.context(verify_ms=lambda x: cost.step_ms(x, kv0) + cpu, draft_ms=dms,
                                 n_nondraft=np.full(len(extra), n + prefill_tokens, dtype=np.int64),
                                 token_limit=limit, k_max=K, step_extra_ms=extra)
                return sp.policy.windows(conf[rows], prev[rows], None if prev2 is None else prev2[rows],
                                         ctx).astype(np.int64)

            base = np.full(k, prefill_ms)          # (prefill chunks: single steps only)
            windows = solve(base)
            for _ in range(3):
                if k == 1:
                    break
                extra = base + kv_ms * contexts(windows)
                nxt = solve(extra)
                if np.array_equal(nxt, windows):
                    break
                windows = nxt
            else:
                for t in range(1, k):          # no fixed point: one step at a time
                    extra = base + kv_ms * contexts(windows)
                    windows[t] = solve(extra[t:t + 1], slice(t, t + 1))[0]
        else:
            windows = np.full((k, len(I)), K, dtype=np.int64)
        return windows, draws

    def _spec_account(self, I, draws, acc, verified, lead):
        """Counters for the first m steps of a window of the decode slots I (acc: accepted drafts,
        verified: drafts verified, lead: drafts the full block would have accepted, all [m, n],
        or [n] for one step). Returns (verified, accepted) drafts in total."""
        st, K = self.stats, self.K
        one = acc.ndim == 1
        m, n = (1, len(acc)) if one else acc.shape
        st.num_drafts += m * n
        st.num_draft_tokens += m * n * K
        acc_r = acc if one else np.add.reduce(acc, axis=0)
        ver_r = verified if one else np.add.reduce(verified, axis=0)
        vsum, asum = int(np.add.reduce(ver_r)), int(np.add.reduce(acc_r))
        st.verified_draft_tokens += vsum
        st.add_accepted(acc)
        if self._adaptive:
            st.accepted_in_window += asum
            st.accepted_full_block += int(np.add.reduce(lead, axis=None))
        I[:, _ROUNDS] += m                  # per class when the rows are flushed
        I[:, _ASUM] += acc_r
        I[:, _VSUM] += ver_r
        if st.head_n < st.cap and self.spec.method.name == "dspark":     # only DSpark has a head
            st.head_conf.append(draws.conf[:m].reshape(-1))
            st.head_acc.append(draws.accept[:m].reshape(-1))
            st.head_n += m * n * K
        if self._cp is not None:
            if self._cp2 is not None:                          # (the production policy's)
                self.X[self._cp2] = draws.conf[m - 2].T if m >= 2 else self.X[self._cp]
            self.X[self._cp] = draws.conf[m - 1].T
        return vsum, asum

    def _commit_step(self, plan):
        n_dec, q, cut, vc, draws, pre, chunks, n_tokens, pre_tokens, kv, fwd, dur = plan
        R, K, t = self.R, self.K, self.env.now
        I, F = self.I, self.F
        if self.shapes is not None:
            qd = q if q is not None else (1 + vc[0] if vc is not None else None)
            qs = ([] if not n_dec else (qd.tolist() if qd is not None else [1] * n_dec)) + chunks
            ctxs = I[:, _COMP].tolist() + [int(R.computed[r]) for r in pre]
            self.shapes.append((self.idx, t, [x for x in qs if x], [c for x, c in zip(qs, ctxs) if x], fwd))
        accepted = verified = emitted_total = 0
        n_dec_run = n_dec
        if n_dec:
            if K:
                ver, commit_w = vc
                if cut:     # a decode cut by the token budget verifies only the drafts it was given
                    given = np.maximum(q - 1, 0)
                    ver, commit_w = np.minimum(ver, given), np.minimum(commit_w, given)
                lead = draws.full_block_accepted_first()                   # the full block's
                acc = np.minimum(lead, commit_w)
                verified, accepted = self._spec_account(I, draws, acc, ver, lead)
                em = np.minimum(acc + 1, I[:, _END] - I[:, _COMP])
            else:
                em = 1
            if cut:
                em = np.where(q > 0, em, 0)
                n_dec_run = int((q > 0).sum())
            I[:, _COMP] += em
            emitted_total = int(em.sum()) if K or cut else n_dec
            self.kv_dec += emitted_total
            self.left_lb -= 1 + K
            self._itl(I, F, t, dur, None if not cut else q > 0)
        # Prefills: chunks computed; those that reach the end of their prompt sample a token.
        moved = []
        for rid, c in zip(pre, chunks):
            if c == 0:
                continue
            R.computed[rid] += c
            if self.cfg.enable_prefix_caching and self.prefix_hashes is not None:
                self._prefix_insert(rid, R.computed[rid])
            if R.computed[rid] == R.prompt_l[rid] + R.generated[rid]:
                emitted_total += 1
                g = R.generated[rid]
                if g == 0:
                    R.first_token[rid] = t
                else:                          # resumed after a preemption
                    gap = (t - R.last_emit[rid]) * 1000.0
                    self.itl_vals.append((gap, 1))
                    R.itl_max[rid] = max(R.itl_max[rid], gap)
                    R.emits[rid] += 1
                R.generated[rid] = g + 1
                R.last_emit[rid] = t
                moved.append(rid)
        if moved:
            mv = set(moved)
            self.pre = [r for r in self.pre if r not in mv]
            rows, frows = [], []
            for rid in moved:       # KV now holds the prompt + generated - 1 tokens
                p = int(R.prompt_l[rid])
                comp = p + int(R.generated[rid]) - 1
                end = p + int(R.output_l[rid]) - 1
                sc = R.spec_counts.pop(rid, (0, 0, 0))   # (after a preemption)
                rows.append((rid, comp, end, int(R.cls_l[rid]), int(R.emits[rid])) + sc)
                self.left_lb = min(self.left_lb, end - comp)
                self.pre_blocks -= int(R.blocks[rid])       # now counted from the slot's KV tokens
                R.blocks[rid] = 0
                frows.append((t, float(R.itl_max[rid])))
                self.kv_dec += comp
            self.I = I = np.concatenate([I, np.array(rows, dtype=np.int64)])
            self.F = F = np.concatenate([F, np.array(frows, dtype=np.float64)])
            if K:
                self.X = np.concatenate([self.X, R.slot_rows[:, moved]], axis=1)
        self.prev_end = t
        self.steps.append((self.idx, t, dur, n_dec_run + sum(1 for c in chunks if c), n_dec_run, n_tokens,
                           pre_tokens, verified, accepted, emitted_total, kv, len(self.waiting)))
        self._finish_done()

    def _itl(self, I, F, t, dur, mask):
        """ITL samples of the decode slots emitting at t (all of them when mask is None).

        While ``_last_is_prev_end`` holds, every slot's last emission is ``prev_end`` and
        F[:, _LAST] is not kept up to date (it is written only when that stops holding)."""
        if mask is None and self._last_is_prev_end:
            # Everyone emitted at the previous step's end: every gap is this step's duration.
            self.itl_vals.append((dur, len(F)))
            np.maximum(F[:, _ITLMAX], dur, out=F[:, _ITLMAX])
            I[:, _EMITS] += 1
            return
        last = F[:, _LAST]
        if self._last_is_prev_end:
            last[:] = self.prev_end
        sel = slice(None) if mask is None else mask
        gaps = (t - last[sel]) * 1000.0
        self.itl_vals.extend(zip(gaps.tolist(), [1] * len(gaps)))
        F[sel, _ITLMAX] = np.maximum(F[sel, _ITLMAX], gaps)
        last[sel] = t
        I[sel, _EMITS] += 1
        self._last_is_prev_end = mask is None

    def _finish_done(self):
        I = self.I
        if not len(I) or self.left_lb > 0:
            return
        left = I[:, _END] - I[:, _COMP]
        lmin = int(np.minimum.reduce(left))
        if lmin <= 0:
            done = left <= 0
            rows, frows = I[done], self.F[done]
            # Per-request results are written to the request table once, at the end (flush).
            self.finished.append((rows, frows, self.env.now))
            self.kv_dec -= int(rows[:, _COMP].sum())
            keep = ~done
            self.I, self.F = I[keep], self.F[keep]
            if self.K:
                self.X = self.X[:, keep]
            left = left[keep]
            for rid in rows[:, _ID].tolist():
                self.on_finish(rid)
            lmin = int(np.minimum.reduce(left)) if len(left) else 0
        self.left_lb = lmin

    def flush(self):
        """Write the finished requests' results into the shared request table; add every
        request's speculative counters (finished and still running) to the per-class totals."""
        R = self.R
        st = self.stats
        if self.K:
            parts = [rows for rows, _, _ in self.finished] + [self.I]
            if R.spec_counts:                 # preempted and not resumed
                parts.append(np.array([(0, 0, 0, R.cls_l[r], 0) + v for r, v in R.spec_counts.items()],
                                      dtype=np.int64).reshape(-1, _NCOL))
                R.spec_counts.clear()
            allr = np.concatenate(parts)
            nc = len(st.cls_rounds)
            cls = allr[:, _CLS]
            rounds = allr[:, _ROUNDS].astype(np.float64)
            st.cls_rounds += np.bincount(cls, weights=rounds, minlength=nc)
            st.cls_emitted += np.bincount(cls, weights=rounds + allr[:, _ASUM], minlength=nc)
            st.cls_verify += np.bincount(cls, weights=rounds + allr[:, _VSUM], minlength=nc)
            self.I[:, _ROUNDS:_VSUM + 1] = 0  # counted now
        for rows, frows, t in self.finished:
            ids = rows[:, _ID]
            R.finish[ids] = t
            R.emits[ids] = rows[:, _EMITS]
            R.itl_max[ids] = frows[:, _ITLMAX]
        self.finished = []

    # ---- decode windows ---------------------------------------------------------------------
    def _window_ok(self) -> bool:
        n = len(self.I)
        if n == 0 or self.pre:
            return False
        if self.waiting and n < self.cfg.max_num_seqs:
            return False
        if not self._last_is_prev_end and self.F[:, _LAST].min() < self.prev_end:
            return False                                 # someone was skipped last step
        # An adaptive window prices every step's budget at once (a fixed point over k steps):
        # worth it only when no request can finish for a few steps (at most 1 + K tokens a step);
        # under load, where one finishes nearly every step, single steps are cheaper.
        if self._adaptive and self.left_lb < 4 * (1 + self.K):
            return False
        return n * (1 + self.K) <= self.cfg.max_num_batched_tokens

    def _decode_window(self):
        env, K, cfg = self.env, self.K, self.cfg
        I, F = self.I, self.F
        n = len(I)
        comp0 = I[:, _COMP]
        left = I[:, _END] - comp0
        # Steps until the first possible completion bound the window (no draws wasted on them).
        k = int(min(cfg.max_window, max(1, left.min())))
        # Open loop: no draws past the next known arrival (each step takes at least the forward
        # of n tokens), since an arrival ends the window anyway.
        t_next = self.next_arrival()
        if t_next is not None:
            floor_ms = self._fwd_list[min(n, self.cost.limit)] + self._draft_ms(n) + self.cpu_ms
            k = int(min(k, max(1, (t_next - env.now) * 1000.0 // max(floor_ms, 1e-6) + 1)))
        if K > 0:
            windows, draws = self._windows(I, k)
            verified, commit = verify_tokens_and_commit(self.verify_mode, windows, K)
            lead = draws.full_block_accepted()                               # [k, n]
            acc = np.minimum(lead, commit)
            n_tok = n + verified.sum(axis=1)
            emit = acc + 1
            cum = np.cumsum(emit, axis=0)                                      # [k, n]
            done_step = np.flatnonzero((cum >= left[None, :]).any(axis=1))
            per_step = emit.sum(axis=1)
        else:
            windows = draws = acc = None
            n_tok = np.full(k, n)
            done_step = [k - 1] if k >= left.min() else []
            per_step = np.full(k, n)
        last = int(done_step[0]) if len(done_step) else k - 1
        # KV tokens at the start of each step; blocks held then (see _dec_blocks): an upper bound
        # first, the exact count only when the bound says the cache may run out.
        kv_start = self.kv_dec + np.concatenate([[0], np.cumsum(per_step)[:-1]])
        avail = self.total_blocks - self.pre_blocks
        if (kv_start[last] + n * (self.lookahead + KV_BLOCK_TOKENS - 1)) // KV_BLOCK_TOKENS > avail:
            before = (np.vstack([np.zeros((1, n), np.int64), cum[:-1]]) if K > 0
                      else np.arange(k)[:, None])
            used = ((comp0[None, :] + before + (self.lookahead + KV_BLOCK_TOKENS - 1))
                    // KV_BLOCK_TOKENS).sum(axis=1)
            bad = np.flatnonzero(used > avail)
            if len(bad) and bad[0] <= last:
                if bad[0] == 0:      # even one step needs a preemption: take the general path
                    plan = self._plan_step(False)
                    yield env.timeout(plan[-1] / 1000.0)
                    self._commit_step(plan)
                    return
                last = int(bad[0]) - 1
        kv = kv_start + n_tok
        fwd = self.cost.step_ms(n_tok, kv)
        dur = fwd + self._draft_ms(n) + self.cpu_ms                                # [k]
        t_end = env.now + np.cumsum(dur) / 1000.0
        # Run until the last step ends or an arrival wakes us; then commit the steps that ended
        # before the wake-up plus the one in flight.
        self.wake = env.event()
        yield env.any_of([env.timeout(t_end[last] - env.now), self.wake])
        if env.now < t_end[last] - 1e-12:
            last = min(int(np.searchsorted(t_end, env.now - 1e-12, side="left")), k - 1)
            if t_end[last] > env.now:
                yield env.timeout(t_end[last] - env.now)
        m = last + 1
        if self.shapes is not None:
            for t in range(m):
                qv = (1 + verified[t]) if K > 0 else np.ones(n, np.int64)
                ctx = comp0 + ((cum[t - 1] if t else 0) if K > 0 else t)
                self.shapes.append((self.idx, float(t_end[t]), qv.tolist(), ctx.tolist(), float(fwd[t])))
        if K > 0:
            self._spec_account(I, draws, acc[:m], verified[:m], lead[:m])
            ver_steps = verified[:m].sum(axis=1)
            acc_steps = acc[:m].sum(axis=1)
            em_total = np.minimum(cum[m - 1], left)
        else:
            em_total = np.full(n, m)
        I[:, _COMP] += em_total
        I[:, _EMITS] += m
        self.left_lb -= m * (1 + K)
        em_sum = int(em_total.sum())
        self.kv_dec += em_sum
        durs = dur[:m].tolist()
        self.itl_vals.extend((d, n) for d in durs)
        np.maximum(F[:, _ITLMAX], max(durs), out=F[:, _ITLMAX])
        self._last_is_prev_end = True                    # (prev_end = t_end[last] below)
        ends = t_end[:m].tolist()
        ntok = n_tok[:m].tolist()
        kvl = kv[:m].tolist()
        ps = per_step[:m].tolist()
        if K > 0:
            ps[-1] = em_sum - sum(ps[:-1])            # the final step may be cut by output lengths
            vs, as_ = ver_steps.tolist(), acc_steps.tolist()
        else:
            vs = as_ = [0] * m
        idx, nw = self.idx, len(self.waiting)
        self.steps.extend((idx, ends[t], durs[t], n, n, int(ntok[t]), 0, int(vs[t]), int(as_[t]),
                           int(ps[t]), int(kvl[t]), nw) for t in range(m))
        self.prev_end = float(t_end[last])
        self._finish_done()
