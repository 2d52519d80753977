"""A replica's engine configuration, in vLLM's names (EngineConfig), and its deterministic draft
script: checked against the method (draft_script_table) and applied to a plan's verify windows
(apply_draft_script)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dsim.errors import InputError


@dataclass(frozen=True)
class EngineConfig:
    max_num_seqs: int = 1024  # vLLM default on H100/H200-class GPUs
    max_num_batched_tokens: int = 8192  # vLLM default on H100/H200-class GPUs
    long_prefill_token_threshold: int = 0  # 0: off
    enable_prefix_caching: bool = False
    # block hashes already in the prefix cache when the run starts (a server that served these
    # prompts before: the validator's replays of a measured run)
    prefix_cache_warm: tuple = ()
    async_scheduling: bool = False  # overlap CPU scheduling with the GPU step
    max_window: int = 256  # decode steps simulated at once, at most (see decode_window.WINDOW_SLOTS)
    record_shapes: bool = False  # keep each step's (query tokens, context) per request
    # Prefill/decode disaggregation, in vLLM's words (kv_transfer_config.kv_role; DeepSeek-V3
    # report Sec. 3.4). None: prefill runs on these GPUs. "kv_consumer": a decode instance; a
    # request arrives with its prompt's KV computed elsewhere and transferred, so its first step
    # computes only the last prompt token (as vLLM's scheduler does on a full external KV hit, to
    # sample the first output token) while attention reads, and KV blocks hold, the whole prompt.
    # Before it reaches the decode instance a request spends remote_prefill_ms + its prompt's
    # thousands of tokens x remote_prefill_ms_per_ktok on the prefill instance and the transfer
    # (an assumption, 0 by default; no queueing there: the prefill fleet is taken as sized for the
    # load). TTFT stays first token - arrival at the service, so it includes that delay.
    kv_role: str | None = None
    remote_prefill_ms: float = 0.0
    remote_prefill_ms_per_ktok: float = 0.0
    # Deterministic drafting (apply_draft_script): decode step j of every request verifies
    # draft_script[j][0] drafts and accepts draft_script[j][1] of them, the last entry repeating,
    # in place of the acceptance draws. What an n-gram proposer does on identical greedy requests
    # (vLLM drafts only where the n-gram matches: steps without a match verify nothing); the
    # validator measures the script from a real server's chunk streams. None: drawn acceptance.
    draft_script: tuple | None = None

    @property
    def disaggregated(self) -> bool:
        return self.kv_role == "kv_consumer"


def draft_script_table(script: tuple, k: int, adaptive: bool) -> np.ndarray:
    """EngineConfig.draft_script as an int64 [J, 2] array (drafts verified, drafts accepted, per
    decode step of a request), checked for a method drafting k tokens a step."""
    sc = np.asarray(script, dtype=np.int64).reshape(-1, 2)
    if adaptive or not len(sc) or (sc < 0).any() or (sc[:, 1] > sc[:, 0]).any() or (sc[:, 0] > k).any():
        raise InputError(f"draft_script: needs a non-adaptive method and entries 0 <= accepted <= verified <= K = {k}")
    return sc


def apply_draft_script(script: np.ndarray, rounds: np.ndarray, lead, verified, cap) -> None:
    """Overwrite a plan's verify windows with a draft script (EngineConfig.draft_script as an
    int64 [J, 2] array: drafts verified, drafts accepted, per decode step of a request): slot r
    at step t of the plan is at its decode step rounds[r] + t (the last entry repeats beyond J).
    lead, verified, cap: [steps, n] (dsim.engine.compiled_decode.plan_decodes' outputs), so the commit
    accepts min(lead, cap) = the script's accepted drafts and prices the verified ones."""
    steps = lead.shape[0]
    j = np.minimum(rounds[None, :] + np.arange(steps)[:, None], len(script) - 1)
    verified[:] = script[j, 0]
    cap[:] = script[j, 0]
    lead[:] = script[j, 1]
