"""What a simulation's replicas share: the request table (Requests: the per-request state arrays
the compiled kernels read and write), the speculative decoding counters (SpecStats) and the
drafter's cost by decode batch size (DraftCost)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dsim.engine import compiled_sched


class Requests:
    """Global per-request state arrays shared by all replicas of one simulation."""

    def __init__(self, workload):
        n = len(workload.prompt_tokens)
        self.n = n
        # The per-request state the compiled kernels read and write, as rows of two blocks (one
        # argument each: a compiled call pays for every array argument; rows in dsim.engine.compiled_sched):
        # int64 prompt, output, class, emissions (the commit kernel's), then the scheduler's
        # computed and generated tokens, KV blocks held while prefilling, admission number on its
        # replica (preemption victims), prefix-cache hit tokens, preemptions and a preempted
        # request's held speculative counters (rounds, accepted, verified); float64 largest ITL,
        # first token, last emission, admission time (NaN before the first).
        self.req_i = np.zeros((compiled_sched.REQ_I_ROWS, n), dtype=np.int64)
        self.req_f = np.zeros((compiled_sched.REQ_F_ROWS, n))
        (
            self.prompt,
            self.output,
            self.cls,
            self.emits,
            self.computed,
            self.generated,
            self.blocks,
            self.seq,
            self.cached_tokens,
            self.preemptions,
        ) = self.req_i[: compiled_sched.HELD_ROUNDS]
        self.held_spec = self.req_i[compiled_sched.HELD_ROUNDS :]  # [3, n]: zero unless preempted with counters
        self.itl_max, self.first_token, self.last_emit, self.admit = self.req_f
        self.prompt[:] = workload.prompt_tokens
        self.output[:] = workload.output_tokens
        self.cls[:] = workload.cls
        self.first_token[:] = np.nan
        self.admit[:] = np.nan
        self.arrival = np.full(n, np.nan)
        self.finish = np.full(n, np.nan)
        # (Python lists of the fixed lengths: submit's checks read one request at a time, and
        # indexing a list is several times cheaper than a numpy scalar.)
        self.prompt_l = self.prompt.tolist()
        self.output_l = self.output.tolist()
        self.cls_l = self.cls.tolist()
        self.longest_life = int((self.prompt + self.output).max()) if n else 0  # prompt + output tokens
        self.replica = np.full(n, -1, dtype=np.int64)
        self.latent = np.zeros(n)
        # Per request, the float32 rows its decode slot carries (a column of Replica._slot_rows; built by the
        # first replica; [requests, rows]): acceptance-model slot offsets, then the confidences of
        # its previous draft rounds (ones before its first; written back here when it is preempted).
        self.slot_rows: np.ndarray | None = None


class SpecStats:
    """Accumulators for speculative decoding outputs (vLLM counter form and per class)."""

    def __init__(self, k: int, n_classes: int, head_sample_cap: int = 60_000):
        self.k = k
        self.num_drafts = 0
        self.num_draft_tokens = 0  # vLLM counter: full K per draft round
        self.verified_draft_tokens = 0  # drafts actually verified (the window)
        # Histogram of accepted drafts per round (0..K), counted by the commit kernel;
        # accepted_per_pos derives from it.
        self.accepted_hist = np.zeros(max(k, 1) + 1, dtype=np.int64)
        # Verify utilization (SGLang/DSpark): drafts accepted within the chosen windows over drafts
        # the full block would have had accepted, from the same draws.
        self.accepted_in_window = 0
        self.accepted_full_block = 0
        self.cls_rounds = np.zeros(n_classes)
        self.cls_emitted = np.zeros(n_classes)
        self.cls_verify = np.zeros(n_classes)
        self.cap = head_sample_cap
        # The head's sample: each replica's first draft rounds in its own step order, up to an
        # equal share of the cap (set by the simulation: cap / replicas), so the sample does not
        # depend on how the replicas' steps interleave (window lengths); gathered replica by
        # replica at the end (head_conf, head_acc).
        self.replica_cap = head_sample_cap
        self.head_conf: list = []
        self.head_acc: list = []

    @property
    def accepted_per_pos(self) -> np.ndarray:
        """vLLM's counter form: rounds that accepted draft position j (1..K) = rounds with more
        than j - 1 accepted."""
        return self.accepted_hist[::-1].cumsum()[::-1][1:]


class DraftCost:
    """The drafter's cost (ms) of one step by decode batch size, for one method on one cost model
    (a simulation's replicas share one): sizes 0..n_max in one vectorized pass
    (SpecMethod.draft_ms_upto), the table the compiled steps read; any other size computed once
    when first asked. ms(n) == float(method.draft_ms(cost, n))."""

    def __init__(self, method: Any, cost: Any):
        self.method, self.cost = method, cost
        self.table = np.zeros(0)
        self._values: list[float] = []
        self._memo: dict[int, float] = {}

    def upto(self, n_max: int) -> np.ndarray:
        """The costs at sizes 0..n_max (at least; a float64 array)."""
        if len(self.table) <= n_max:
            self.table = np.asarray(self.method.draft_ms_upto(self.cost, n_max), dtype=np.float64)
            self._values = self.table.tolist()
        return self.table

    def ms(self, n: int) -> float:
        if n < len(self._values):
            return self._values[n]
        v = self._memo.get(n)
        if v is None:
            v = self._memo[n] = float(self.method.draft_ms(self.cost, n))
        return v
