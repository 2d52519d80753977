"""Hand-made simulation inputs shared by test modules: profiles with closed-form step costs,
small workloads, and one simulation run of them. Not a test module: tests import it by name
(pytest puts tests/ on sys.path)."""

from __future__ import annotations

import numpy as np

from dsim.cost import AttentionTerms, Profile, Table, profile_from_dict, vllm_capture_sizes
from dsim.sim import SimConfig, simulate
from dsim.workload import Workload

# ---- a profile whose forward table is given (default: every step 10 ms) -----------------------


def make_profile(
    forward=None, kv_ms_per_ktok=0.0, cpu=0.0, kv_gib=10.0, gpus=1, caps=None, draft=None, prefill_terms=None
):
    caps = caps or vllm_capture_sizes(512)
    if forward is None:
        forward = {"tokens": caps + [1024, 2048, 4096, 8192], "ms": [10.0] * (len(caps) + 4)}
    d = {
        "name": "test",
        "provenance": {
            "kind": "analytical",
            "hardware": "test",
            "gpus_per_replica": gpus,
            "model": "test",
            "engine": "test",
            "engine_version": "0",
            "date": "2026-11-29",
            "method": "hand-made for tests",
        },
        "memory": {"kv_cache_gib": kv_gib, "kv_bytes_per_token": 1024.0},
        "cpu_overhead_ms": cpu,
        "capture_sizes": caps,
        "forward": forward,
        "kv_ms_per_ktok": kv_ms_per_ktok,
    }
    if draft:
        d["draft"] = draft
    if prefill_terms is not None:
        d["prefill_terms"] = prefill_terms
    return profile_from_dict(d, "test.yaml")


def linear_profile(**kw):
    caps = vllm_capture_sizes(512)
    toks = caps + [768, 1024, 2048, 4096, 8192]
    return make_profile(forward={"tokens": toks, "ms": [5.0 + 0.01 * t for t in toks]}, **kw)


def wl(prompt, output, arrival=None, cls=None, closed=None):
    n = len(prompt)
    return Workload(
        arrival_s=np.zeros(n) if arrival is None else np.asarray(arrival, float),
        prompt_tokens=np.asarray(prompt),
        output_tokens=np.asarray(output),
        cls=np.zeros(n, np.int16) if cls is None else np.asarray(cls, np.int16),
        class_names=("math", "code", "chat") if cls is not None else ("chat",),
        session_id=np.full(n, -1),
        closed_loop_concurrency=closed,
        source="test",
    )


def run(w, prof, **kw):
    return simulate(SimConfig(workload=w, profile=prof, gpus_per_node=prof.gpus_per_replica, **kw))


# ---- a profile where every step costs STEP_MS, and a constant-rate workload ----------------------

STEP_MS = 10.0


def flat_profile() -> Profile:
    """Every step costs 10 ms whatever its size; no context term, no CPU overhead; 1 replica/node."""
    prov = dict(
        kind="analytical",
        hardware="8 x NVIDIA H200 SXM",
        gpus_per_replica=8,
        model="flat",
        engine="test",
        engine_version="0",
        date="2026-01-01",
        method="constructed in the test",
    )
    return Profile(
        name="flat",
        provenance=prov,
        kv_cache_gib=64.0,
        kv_bytes_per_token=1024.0,
        cpu_overhead_ms=0.0,
        capture_sizes=(1,),
        forward=Table(np.array([1.0, 65536.0]), np.array([STEP_MS, STEP_MS])),
        kv_ms_per_ktok=0.0,
    )


def const_workload(rate: float, n: int, out_tokens: int = 100) -> Workload:
    return Workload(
        arrival_s=np.arange(n, dtype=np.float64) / rate,
        prompt_tokens=np.full(n, 100, np.int64),
        output_tokens=np.full(n, out_tokens, np.int64),
        cls=np.zeros(n, np.int16),
        class_names=("chat",),
        session_id=np.full(n, -1, np.int64),
        source="constant test load",
        class_mix_assumed=True,
    )


# A small `dsim ab` run (two seeds, two loads, 60 requests): the report and executor tests share it.
AB_ARGS = [
    "ab",
    "--a",
    "mtp",
    "--b",
    "dspark",
    "--sla",
    "p50=20ms",
    "--requests",
    "60",
    "--seeds",
    "0,1",
    "--concurrency",
    "1,4",
    "--min-requests",
    "12",
    "--requests-per-user",
    "2",
    "--max-nodes",
    "4",
    "--jobs",
    "2",
]


# A small `dsim sweep` (two loads, two methods, 12 requests each): the figure and executor tests share it.
SWEEP_ARGS = [
    "sweep",
    "--concurrency",
    "1,4",
    "--methods",
    "mtp,dspark",
    "--min-requests",
    "12",
    "--requests-per-user",
    "2",
    "--jobs",
    "2",
]


# A format-2 profile's split-KV attention terms (an H100-like GPU, 32 query / 8 KV heads): the
# attention-cost and engine window tests share them.
ATTENTION_TERMS = AttentionTerms(
    query_heads=32,
    kv_heads=8,
    sms=132,
    fill=2.0,
    balance=2.0,
    min_chunk=64,
    block_rows=128,
    decode_ctas_per_sm=2,
    prefill_ctas_per_sm=2,
    wave_ms_per_ktok=0.01,
    chunk_ms_per_kcta=0.3,
    merge_ms_per_mcell=0.5,
    prefill_ms_per_mpair=1.4,
)


def plan_small(workloads, prof, slos, specs=None, *, margin=0.0, max_nodes=8, seeds=(0,), **kw):
    """dsim.study.capacity.plan in one process with small replicas (max_num_seqs 4), as the plan,
    price and diagnostics tests run it; ``workloads`` one Workload or {seed: Workload}; ``specs``
    default: no speculation."""
    from dsim.engine.config import EngineConfig
    from dsim.spec.runtime import SpecConfig
    from dsim.study.capacity import plan

    return plan(
        workloads if isinstance(workloads, dict) else {0: workloads},
        prof,
        specs if specs is not None else {"none": SpecConfig("none")},
        slos,
        margin=margin,
        max_nodes=max_nodes,
        seeds=list(seeds),
        jobs=1,
        engine=EngineConfig(max_num_seqs=4),
        **kw,
    )
