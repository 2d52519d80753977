"""The server's prefix cache: which prompt tokens a step computed and which it read from cache.

vLLM V1 caches full KV blocks of prompts by content and serves a new prompt's leading full blocks
from that cache; a prompt served whole still recomputes its last token, so a prompt of p tokens
hits at most ``block x floor((p - 1) / block)`` tokens (vLLM's ``KVCacheManager``). Prefix caching
is on by default; the block is vLLM's ``--block-size``: 128 tokens on the CPU platform
(``vllm/platforms/cpu.py``), 16 on GPUs.

The validator's prompts (``driver.make_prompt``) are all prefixes of one token sequence, so once a
server has served a prompt of some length every later prompt up to that length hits all its full
blocks. On the CPU test server every 256-token prompt computed 128 tokens and read 128 from cache
(``vllm:prefix_cache_hits_total`` = half the queries in every run after the server's first), while
a 64-token prompt (no full block) computed all 64. Counting a 256-token prompt's tokens as
computed made a prompt look like a large per-prompt cost plus a cheap per-token one (16-18 ms a
prompt, 0.19 ms a token) and priced a step with three such prompts 20-25% over what it took.

What this module gives: the cache's settings from a measurement's header
(:func:`config`), the measured counters (:func:`counters`), the tokens each request read from
cache (:func:`cached_tokens`: the rule above, scaled to the measured hits), and what dsim needs to
simulate the same cache (:func:`simulation`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from validator import promtext

if TYPE_CHECKING:
    from validator.measure import Measurement

CPU_BLOCK_TOKENS = 128  # vLLM's CPU platform default block size (vllm/platforms/cpu.py)
GPU_BLOCK_TOKENS = 16  # vLLM's default block size elsewhere
HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
SALT = 7_919  # block hashes of the validator's one prompt sequence: SALT + block index


@dataclass(frozen=True)
class PrefixConfig:
    """The server's prefix cache: on or off, its block in tokens, and where each came from."""

    enabled: bool
    block_tokens: int | None
    source: str


def _flag(flags: str, name: str) -> str | None:
    m = re.search(rf"{re.escape(name)}(?:=|\s+)(\S+)", flags)
    return m.group(1).strip("'\"") if m else None


def config(header: dict) -> PrefixConfig:
    """The prefix cache of the server a measurement ran against: the header's ``engine`` block
    (``prefix_caching``, ``block_size``) when it says, else the server's flags
    (``--[no-]enable-prefix-caching``, ``--block-size``) over vLLM's defaults (on; 128 tokens on the
    CPU platform, 16 elsewhere). A server the header does not name as vLLM: unknown (off)."""
    eng = header.get("engine") or {}
    flags = str(header.get("server_flags") or "")
    cpu = eng.get("kind") == "vllm-cpu" or "vllm_entry.py" in flags or "vllm-venv" in flags
    vllm = cpu or eng.get("kind") == "vllm" or "vllm" in flags
    if eng.get("prefix_caching") is not None:
        enabled, src = bool(eng["prefix_caching"]), "header"
    elif "--no-enable-prefix-caching" in flags:
        enabled, src = False, "--no-enable-prefix-caching"
    elif vllm or "--enable-prefix-caching" in flags:
        enabled, src = True, "vLLM's default (prefix caching on)"
    else:
        return PrefixConfig(False, None, "server not known to be vLLM")
    block, bsrc = eng.get("block_size"), "header"
    if block is None:
        block, bsrc = _flag(flags, "--block-size"), "--block-size"
    if block is not None:
        try:
            return PrefixConfig(enabled, int(block), f"{src}; block {int(block)} tokens ({bsrc})")
        except ValueError:
            pass
    default = CPU_BLOCK_TOKENS if cpu else GPU_BLOCK_TOKENS
    where = "the CPU platform's" if cpu else "vLLM's"
    return PrefixConfig(enabled, default, f"{src}; block {default} tokens ({where} default)")


def counters(m: Measurement) -> tuple[float, float] | None:
    """(queries, hits) in prompt tokens over the run, from /metrics; None without them."""
    d = promtext.from_jsonable((m.stats().get("metrics_delta")) or {})
    q, h = promtext.value(d, QUERIES), promtext.value(d, HITS)
    if q is None or h is None:
        return None
    return float(q), float(h)


def warm_hits(prompt_tokens: int, block_tokens: int) -> int:
    """Tokens of a prompt served from a cache that holds all its blocks (the last token recomputed)."""
    p = int(prompt_tokens)
    return block_tokens * ((p - 1) // block_tokens) if p > 1 and block_tokens > 0 else 0


def cached_tokens(m: Measurement, requests: list | None = None) -> dict:
    """{request i: prompt tokens it read from the prefix cache} for the measurement's completed
    requests: the warm-cache rule (:func:`warm_hits`) scaled to the run's measured hits (the same
    share off every request: a server's first prompt of a length finds nothing), or, where the
    rule expects none but the counters show hits, the measured hit share of every prompt. Without
    counters: the rule when the header says the cache is on, else nothing cached."""
    reqs = m.ok_requests if requests is None else requests
    if not reqs:
        return {}
    cfg = config(m.header)
    prompts = {r["i"]: int(r.get("prompt_tokens") or 0) for r in reqs}
    warm = {i: warm_hits(p, cfg.block_tokens or 0) for i, p in prompts.items()} if cfg.enabled else {}
    c = counters(m)
    if c is None:
        return {i: float(warm.get(i, 0)) for i in prompts}
    q, h = c
    if h <= 0:
        return {i: 0.0 for i in prompts}
    tw = float(sum(warm.values()))
    if tw > 0:
        s = min(h / tw, 1.0)
        return {i: warm.get(i, 0) * s for i in prompts}
    share = min(h / q, 1.0) if q > 0 else 0.0
    return {i: p * share for i, p in prompts.items()}


def hit_rate(m: Measurement) -> float | None:
    """The run's measured prefix-cache hit rate (hits / queries, prompt tokens)."""
    c = counters(m)
    return c[1] / c[0] if c and c[0] > 0 else None


@dataclass(frozen=True)
class SimPrefix:
    """What dsim needs to simulate the server's prefix cache for a measured run."""

    hashes: list  # per request (the workload's order): int64 block hashes of its full blocks
    block_tokens: int
    warm: tuple  # block hashes cached when the run starts
    note: str


def simulation(m: Measurement, prompt_tokens: np.ndarray) -> SimPrefix | None:
    """The prefix cache for dsim's simulation of a run, or None (off, unknown, or prompts whose
    content the validator did not choose). The validator's prompts are prefixes of one sequence
    (``driver.make_prompt``), so block j of every prompt has one hash. The cache starts warm (all
    the run's blocks) when the measured hits are at least the warm rule's less one request's
    worth: the server had served these prompts before the run (the held-out rounds, a warm-up of
    that length); else it starts empty and fills as dsim computes the prompts."""
    cfg = config(m.header)
    if not cfg.enabled or not cfg.block_tokens or m.header.get("source", "run") != "run":
        return None
    b = int(cfg.block_tokens)
    # only the blocks vLLM can serve from cache (its last token is recomputed, so a prompt's last
    # full block is computed when nothing follows it); dsim's own rule caps the hit at the prompt
    # less one token, which is this rule for blocks of one token
    hashes = [SALT + np.arange(warm_hits(int(p), b) // b, dtype=np.int64) for p in prompt_tokens]
    warm_each = [warm_hits(int(p), b) for p in prompt_tokens]
    c = counters(m)
    warm = False
    if c is not None and sum(warm_each) > 0:
        warm = c[1] >= sum(warm_each) - max(warm_each)
    blocks = max((len(h) for h in hashes), default=0)
    how = "warm (the server had these prompts)" if warm else "empty at the start"
    return SimPrefix(
        hashes,
        b,
        tuple(int(SALT + j) for j in range(blocks)) if warm else (),
        f"prefix cache: {b}-token blocks ({cfg.source}), {how}",
    )
