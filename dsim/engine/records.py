"""The engine's named records: one step's row of the step table (StepRecord; its fields in the
compiled kernels' column order, STEP_FIELDS), a planned step (StepPlan) and what a commit of one
or more steps produced (DecodeOutcome)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from dsim.engine import compiled_bundles


@dataclass(frozen=True)
class StepRecord:
    """What one engine step produced (the per-step table has one row of these per step)."""

    replica: int
    t_end_s: float
    duration_ms: float
    n_requests: int  # scheduled requests
    n_decode: int  # requests verifying/decoding
    n_tokens: int  # tokens in the target forward
    prefill_tokens: int
    verify_draft_tokens: int  # draft tokens verified
    accepted_tokens: int
    emitted_tokens: int
    kv_tokens: int
    n_waiting: int


STEP_FIELDS = tuple(StepRecord.__dataclass_fields__)
if STEP_FIELDS != compiled_bundles.STEP_COLUMNS:  # (the compiled steps write the rows by these positions)
    raise ImportError(
        f"StepRecord's fields {STEP_FIELDS} are not the kernels' step columns {compiled_bundles.STEP_COLUMNS}"
    )
STEP_FLOAT_FIELDS = tuple(f for f, t in StepRecord.__annotations__.items() if t == "float")  # others: int


class StepPlan(NamedTuple):
    """What the scheduler planned for one step (a named record; a NamedTuple because one is made
    every step and a tuple is the cheapest record to build).

    The first ``n_decode`` decode slots decode (each 1 + its verified drafts, or ``decode_given``
    tokens where the token budget cut the queue); with drafts, their draws and verify windows
    are ``conf`` [1, K, n] (confidences), ``lead`` [1, n] (leading accepted drafts of the full
    block), ``verified`` and ``commit_cap`` [1, n] (the verify mode's drafts verified and commit
    cap). The running prefills ``prefill_ids`` compute ``prefill_chunks`` tokens (``n_prefill``
    of them at least one; the arrays are views of the replica's buffers, valid until its
    commit). ``kv_tokens``: KV entries the forward reads; ``forward_ms``: the target forward; ``duration_ms``: the
    step's wall time (forward + drafter + CPU overhead)."""

    n_decode: int
    decode_given: np.ndarray | None
    conf: np.ndarray | None
    lead: np.ndarray | None
    verified: np.ndarray | None
    commit_cap: np.ndarray | None
    prefill_ids: np.ndarray
    prefill_chunks: np.ndarray
    n_prefill: int
    n_tokens: int
    prefill_tokens: int
    kv_tokens: int
    forward_ms: float
    duration_ms: float


class DecodeOutcome(NamedTuple):
    """What ``steps`` steps produced for the ``n`` decode slots (in slot order): per request the
    drafts drafted (``drafted`` each step), verified, accepted (inside the commit cap) and
    committed tokens (accepted + 1 a step, capped by the request's remaining output; 0 for a
    decode the budget gave no token), and per step the totals (``step_emitted``: committed
    tokens). The arrays are views of the replica's commit buffers (``slot_out`` [3, >= n]:
    committed, verified, accepted; ``step_out`` [3, >= steps]: verified, accepted, emitted),
    valid until its next commit."""

    steps: int
    n: int
    drafted: int
    slot_out: np.ndarray
    step_out: np.ndarray
    total_verified: int
    total_accepted: int
    total_committed: int
    full_block_accepted: int

    @property
    def committed(self) -> np.ndarray:
        return self.slot_out[0, : self.n]

    @property
    def verified(self) -> np.ndarray:
        return self.slot_out[1, : self.n]

    @property
    def accepted(self) -> np.ndarray:
        return self.slot_out[2, : self.n]

    @property
    def step_verified(self) -> np.ndarray:
        return self.step_out[0, : self.steps]

    @property
    def step_accepted(self) -> np.ndarray:
        return self.step_out[1, : self.steps]

    @property
    def step_emitted(self) -> np.ndarray:
        return self.step_out[2, : self.steps]
