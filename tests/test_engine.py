"""Engine and cost model: closed-form cases, staircase semantics, preemption, determinism."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from builders import ATTENTION_TERMS, linear_profile, make_profile, run, wl
from dsim.cost import CostModel, load_profile, profile_from_dict, vllm_capture_sizes
from dsim.engine.config import EngineConfig
from dsim.errors import InputError
from dsim.sim import SimConfig, SpecConfig, simulate

# ---- cost model: vLLM staircase semantics -----------------------------------------------------


def test_staircase_below_limit_uses_next_capture_size():
    caps = [1, 2, 4, 8, 16, 24, 32]
    prof = make_profile(caps=caps, forward={"tokens": caps + [48, 64], "ms": [1, 2, 3, 4, 5, 6, 7, 9, 11]})
    c = CostModel(prof)
    assert c.forward_ms(9) == 5.0  # a step of 9 tokens runs the 16-token graph
    assert c.forward_ms(16) == 5.0
    assert c.forward_ms(17) == 6.0
    assert c.forward_ms(3) == 3.0
    assert c.forward_ms(40) == pytest.approx(8.0)  # linear interpolation above the limit (32..48)
    assert c.forward_ms(80) == pytest.approx(13.0)  # last-slope extrapolation (slope 2/16)


def test_running_maximum_makes_cost_non_decreasing():
    caps = [1, 2, 4, 8]
    prof = make_profile(caps=caps, forward={"tokens": caps + [16], "ms": [3, 2, 5, 4, 6]})  # jagged
    c = CostModel(prof)
    vals = c.forward_ms(np.arange(1, 30))
    assert np.all(np.diff(vals) >= 0)
    assert c.forward_ms(2) == 3.0 and c.forward_ms(8) == 5.0


def test_step_cost_row_equals_step_ms_on_arange():
    """The policy's cost row: a slice of the dense table, bit-equal to step_ms on the same tokens,
    also across the capture limit and past the dense table (where it falls back)."""
    from dsim.cost import DENSE_TOKENS

    caps = [1, 2, 4, 8, 16, 24, 32]
    c = CostModel(
        make_profile(
            caps=caps, forward={"tokens": caps + [48, 64], "ms": [1, 2, 3, 4, 5, 6, 7, 9, 11]}, kv_ms_per_ktok=0.37
        )
    )
    for n0, n1 in ((1, 30), (20, 200), (DENSE_TOKENS - 5, DENSE_TOKENS + 1), (DENSE_TOKENS - 5, DENSE_TOKENS + 40)):
        assert c.step_cost_row(n0, n1, 12345).tolist() == c.step_ms(np.arange(n0, n1), 12345).tolist()
        # the engine folds its per-step constants (CPU overhead, draft) into the same row
        np.testing.assert_allclose(
            c.step_cost_row(n0, n1, 12345, 2.5), c.step_ms(np.arange(n0, n1), 12345) + 2.5, rtol=1e-12
        )


def test_prefill_terms_price_each_chunk_and_are_checked_on_load():
    """A step's cost is the decode-priced table + KV term + for each prefill chunk of q tokens over c
    cached ones: -discount q + attention q (c + q / 2) (closed form through the engine: one request,
    a 1500-token prompt in 512-token chunks, then decodes); a profile whose discount the table
    cannot pay for, or a negative term, is refused with the file and field named."""
    terms = {"discount_ms_per_ktok": 4.0, "attention_ms_per_mpair": 2.0}
    prof = linear_profile(kv_ms_per_ktok=0.5, prefill_terms=terms)
    c = CostModel(prof)
    assert c.prefill_ms([(512, 0), (476, 1024)]) == pytest.approx(
        512 * (2e-6 * 256 - 4e-3) + 476 * (2e-6 * (1024 + 238) - 4e-3)
    )
    assert CostModel(linear_profile()).prefill_ms([(512, 0)]) == 0.0
    r = run(wl([1500], [3]), prof, engine=EngineConfig(long_prefill_token_threshold=512))
    st = r.steps
    pre = st[st.prefill_tokens > 0]
    assert pre.prefill_tokens.tolist() == [512, 512, 476]
    for (_, row), ctx in zip(pre.iterrows(), (0, 512, 1024)):
        q = row.prefill_tokens
        want = float(c.step_ms(q, ctx + q)) + c.prefill_ms([(q, ctx)])
        assert row.duration_ms == pytest.approx(want, rel=1e-9)
    dec = st[st.prefill_tokens == 0]
    assert len(dec) and (dec.duration_ms == [float(c.step_ms(1, k)) for k in dec.kv_tokens]).all()
    with pytest.raises(InputError, match="prefill_terms.discount_ms_per_ktok 20: exceeds forward.ms"):
        linear_profile(prefill_terms={"discount_ms_per_ktok": 20.0})
    with pytest.raises(InputError, match="prefill_terms.attention_ms_per_mpair: must be >= 0, got -1"):
        linear_profile(prefill_terms={"attention_ms_per_mpair": -1})
    with pytest.raises(InputError, match="prefill_terms: a mapping"):
        linear_profile(prefill_terms={"discount": 1})
    # past the table the last slope (here 0.01 ms a token) must pay for the discount too
    caps = vllm_capture_sizes(512)
    flat = make_profile(
        forward={"tokens": caps + [1024, 2048], "ms": [30.0] * len(caps) + [30.5, 31.0]},
        prefill_terms={"discount_ms_per_ktok": 5.0},
    )
    with pytest.raises(InputError, match="exceeds the forward table's last slope"):
        CostModel(flat)


def test_profile_by_model_name_prefers_the_measured_one():
    """A model name resolves to its measured H200 profile; the analytical one is the fallback."""
    from dsim.cost import resolve_profile_path

    assert resolve_profile_path("qwen3-8b").name == "h200-qwen3-8b.yaml"
    assert load_profile("llama-3.1-8b").provenance["kind"] == "measured"
    assert resolve_profile_path("analytical-qwen3-8b-h200x1").parent.name == "analytical"
    with pytest.raises(InputError, match="no-such-model: profile not found"):
        resolve_profile_path("no-such-model")


def test_prefill_terms_reach_every_budget_policy(monkeypatch):
    """The verify budget is priced with the step's prefill correction whatever the policy: the
    compiled step (dsim.engine.compiled_decode.plan_decodes) gets it as the extra cost of every budget."""
    from dsim.engine import compiled_bundles, compiled_decode

    seen, priced = [], []
    orig, orig_pre = compiled_decode.plan_decodes, CostModel.prefill_ms

    def spy(slots, n, K, steps, draws, policy, budget, plan):
        if compiled_bundles.PolicyParams(*policy).adaptive:
            seen.append(float(compiled_bundles.BudgetRow(*budget).extra_ms))
        return orig(slots, n, K, steps, draws, policy, budget, plan)

    def spy_pre(self, chunks):
        v = orig_pre(self, chunks)
        priced.append(v)
        return v

    monkeypatch.setattr(compiled_decode, "plan_decodes", spy)
    monkeypatch.setattr(CostModel, "prefill_ms", spy_pre)
    # every step through the general path, where plan_decodes is called from Python (a decode
    # window carries no prefill chunk, and its compiled plan_window calls the compiled
    # plan_decodes, which a Python spy cannot replace)
    from dsim.engine.replica import Replica

    monkeypatch.setattr(Replica, "_window_ok", lambda self: False)
    prof = linear_profile(
        kv_ms_per_ktok=0.5, prefill_terms={"discount_ms_per_ktok": 4.0, "attention_ms_per_mpair": 2.0}
    )
    w = wl([200, 3000, 3000], [400, 50, 50], arrival=[0.0, 0.5, 1.0])
    for pol in ("vllm", "paper", "paper-production", "sglang", "threshold", "fixed"):
        seen.clear()
        # 512-token chunks: the long prompts are still prefilling while the first request decodes
        run(
            w,
            prof,
            spec=SpecConfig("dspark", adaptive=True, policy=pol),
            engine=EngineConfig(long_prefill_token_threshold=512),
        )
        # the budget's extra cost is 0 or a prefill correction the cost model computed that step
        assert any(x != 0.0 for x in seen) and all(x == 0.0 or x in priced for x in seen), pol


def test_context_term_adds_per_kv_token():
    c = CostModel(make_profile(kv_ms_per_ktok=0.5))
    assert c.step_ms(8, 4000) == pytest.approx(10.0 + 2.0)


def test_profile_validation_errors():
    base = make_profile()
    with pytest.raises(InputError, match="capture_sizes\\[2\\]"):
        make_profile(caps=[1, 4, 2])
    with pytest.raises(InputError, match="provenance: missing field 'date'"):
        from dsim.cost import profile_to_dict

        d = profile_to_dict(base)
        del d["provenance"]["date"]
        profile_from_dict(d, "p.yaml")
    with pytest.raises(InputError, match="missing field 'forward'"):
        from dsim.cost import profile_to_dict

        d = profile_to_dict(base)
        del d["forward"]
        profile_from_dict(d, "p.yaml")


@pytest.mark.slow
def test_shipped_profiles_load_with_provenance():
    from dsim.cost import PROFILE_DIR

    paths = [p for p in PROFILE_DIR.rglob("*.yaml")]
    assert paths
    for p in paths:
        prof = load_profile(str(p))
        assert prof.provenance["kind"] in ("measured", "silicon-table", "analytical", "calibrated", "derived")
        assert prof.kv_capacity_blocks > 0


# ---- closed-form engine cases -----------------------------------------------------------------


def test_single_request_ttft_is_prefill_step_and_itl_is_decode_step():
    prof = linear_profile(cpu=1.5)
    c = CostModel(prof)
    res = run(wl([300], [50]), prof)
    r = res.requests.iloc[0]
    assert r.ttft_ms == pytest.approx(c.forward_ms(300) + 1.5)
    assert r.tpot_ms == pytest.approx(c.forward_ms(1) + 1.5)
    assert res.summary["itl_ms"]["p50"] == pytest.approx(c.forward_ms(1) + 1.5)
    assert res.summary["itl_ms"]["p99"] == pytest.approx(c.forward_ms(1) + 1.5)


def test_async_scheduling_hides_cpu_overhead():
    prof = linear_profile(cpu=3.0)
    a = run(wl([300], [20]), prof, engine=EngineConfig(async_scheduling=True))
    s = run(wl([300], [20]), prof)
    assert s.requests.tpot_ms[0] - a.requests.tpot_ms[0] == pytest.approx(3.0)


def test_prefill_is_chunked_by_token_budget():
    prof = linear_profile()
    c = CostModel(prof)
    res = run(wl([2500], [2]), prof, engine=EngineConfig(max_num_batched_tokens=1000))
    expect = c.forward_ms(1000) * 2 + c.forward_ms(500)
    assert res.requests.ttft_ms[0] == pytest.approx(expect)


def test_staircase_in_engine_prompt_of_9_costs_16_graph():
    caps = vllm_capture_sizes(512)
    toks = caps + [1024]
    prof = make_profile(forward={"tokens": toks, "ms": [float(t) for t in toks]})
    res = run(wl([9], [2]), prof)
    assert res.requests.ttft_ms[0] == pytest.approx(16.0)


def test_closed_loop_littles_law():
    prof = linear_profile(cpu=0.5)
    rng = np.random.default_rng(1)
    n = 3000
    w = wl(rng.integers(50, 400, n), rng.integers(5, 60, n), closed=24)
    s = run(w, prof).summary
    x = s["request_throughput"]
    assert x * s["e2e_ms"]["mean"] / 1000 == pytest.approx(24, rel=0.02)


def test_flat_cost_no_wait_when_concurrency_within_max_num_seqs():
    prof = make_profile()
    rng = np.random.default_rng(2)
    w = wl(rng.integers(20, 200, 400), rng.integers(2, 50, 400), closed=16)
    res = run(w, prof, engine=EngineConfig(max_num_seqs=16))
    assert res.requests.queue_ms.max() == 0.0
    assert res.summary["requests_completed"] == 400


def test_decode_windows_are_exact():
    """Simulating decode stretches as windows gives the same result as stepping one by one."""
    prof = linear_profile(cpu=0.7, kv_ms_per_ktok=0.3)
    rng = np.random.default_rng(3)
    n = 300
    arr = np.cumsum(rng.exponential(0.05, n))
    w = wl(rng.integers(50, 900, n), rng.integers(1, 120, n), arrival=arr - arr[0])
    a = run(w, prof, engine=EngineConfig(max_window=1)).requests
    b = run(w, prof, engine=EngineConfig(max_window=64)).requests
    for col in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_max_ms"):
        np.testing.assert_allclose(a[col].to_numpy(), b[col].to_numpy(), rtol=1e-9, atol=1e-6)


def test_preemption_under_tiny_kv_cache_loses_no_request():
    # 1024 B per token, 0.002 GiB -> 131 blocks of 16 tokens = 2096 tokens for 30 long requests.
    prof = linear_profile(kv_gib=0.002)
    rng = np.random.default_rng(4)
    w = wl(rng.integers(100, 300, 30), rng.integers(100, 400, 30))
    res = run(w, prof)
    s = res.summary
    assert s["requests_completed"] == 30
    assert s["preemptions"] > 0
    assert (res.requests.output_tokens > 0).all()


def test_prefix_caching_reduces_prefill():
    prof = linear_profile()
    n = 20
    hashes = [np.array([1, 2, 3, 4], dtype=np.int64) for _ in range(n)]
    w = wl([2048] * n, [4] * n, arrival=np.arange(n) * 1.0)
    w = dataclasses.replace(w, prefix_hashes=hashes, prefix_block_tokens=512)
    on = run(w, prof, engine=EngineConfig(enable_prefix_caching=True)).requests
    off = run(w, prof).requests
    assert on.cached_tokens.iloc[1:].min() == 2047 and off.cached_tokens.max() == 0
    assert on.ttft_ms.iloc[1:].mean() < off.ttft_ms.iloc[1:].mean()


def test_multi_node_routers_complete_everything():
    prof = linear_profile()
    rng = np.random.default_rng(5)
    n = 400
    arr = np.sort(rng.uniform(0, 20, n))
    w = wl(rng.integers(50, 500, n), rng.integers(1, 80, n), arrival=arr - arr[0])
    for router in ("round_robin", "least_outstanding", "affinity"):
        res = simulate(SimConfig(workload=w, profile=prof, nodes=2, gpus_per_node=2, router=router))
        assert res.summary["requests_completed"] == n
        assert res.requests.replica.nunique() == 4


def test_determinism_byte_identical_summary():
    prof = load_profile()
    from dsim.workload import load_workload

    w = load_workload("default", n=150)
    outs = []
    for _ in range(2):
        s = simulate(SimConfig(workload=w, profile=prof, spec=SpecConfig("dspark", adaptive=True), seed=7)).summary
        s.pop("wall_time_s")
        outs.append(json.dumps(s, sort_keys=True))
    assert outs[0] == outs[1]


@pytest.mark.needs_traces("azure-conv")
@pytest.mark.parametrize("method", ["none", "mtp", "dspark"])
def test_step_table_not_kept_changes_no_result(method):
    """keep_steps=False (the plan's simulations) writes no step rows, and changes nothing else:
    the same summary (step count and mean batch included), request table and ITL samples, on a
    real trace with decode windows, arrivals cutting them and several replicas."""
    from dsim.workload import load_workload

    w = load_workload("azure-conv", n=400, mix="chat=0.6,code=0.2,math=0.2", seed=1)
    spec = SpecConfig(method, adaptive=method == "dspark")
    runs = [
        simulate(SimConfig(workload=w, profile=load_profile(), spec=spec, seed=3, keep_steps=keep))
        for keep in (True, False)
    ]
    kept, dropped = runs
    for r in runs:
        r.summary.pop("wall_time_s")
    assert json.dumps(kept.summary, sort_keys=True) == json.dumps(dropped.summary, sort_keys=True)
    assert kept.summary["steps"] == len(kept.steps) > 1000
    assert kept.summary["mean_batch_requests"] == round(float(kept.steps["n_requests"].mean()), 3)
    assert kept.requests.equals(dropped.requests)
    for a, b in zip(kept.itl, dropped.itl):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="step table was not kept"):
        _ = dropped.steps


# ---- speculative decoding through the engine -----------------------------------------------------


def spec_run(acceptance, method="eagle3", k=7, n=60, out=400, **kw):
    prof = linear_profile()
    w = wl([100] * n, [out] * n, closed=8)
    sc = SpecConfig(method, k=k, acceptance=acceptance, sigma_request=0.0, sigma_step=0.0, **kw)
    return run(w, prof, spec=sc).summary


@pytest.mark.parametrize("p,k", [(0.8, 7), (0.6, 4), (0.9, 1)])
def test_closed_form_tau_constant_acceptance(p, k):
    # 600 x 400 tokens: the mean's standard error is about 0.25 % at p = 0.8, K = 7 (60 requests
    # gave 0.8 %, too close to the 1 % tolerance)
    s = spec_run(f"const:{p}", k=k, n=600)
    tau = (1 - p ** (k + 1)) / (1 - p)
    assert s["acceptance_length"] == pytest.approx(tau, rel=0.01)


def test_mtp1_at_p09_gives_1_9():
    s = spec_run("const:0.9", method="mtp", k=1)
    assert s["acceptance_length"] == pytest.approx(1.9, rel=0.01)
    c = s["spec_decode_counters"]
    assert c["num_draft_tokens"] == c["num_drafts"]
    assert s["per_position_acceptance"][0] == pytest.approx(0.9, abs=0.01)


def staircase_profile():
    caps = vllm_capture_sizes(512)
    toks = caps + [768, 1024, 2048, 4096, 8192]
    # A compute-bound staircase: cost grows with tokens, so verifying everything is not free.
    return make_profile(forward={"tokens": toks, "ms": [8.0 + 0.06 * t for t in toks]}, kv_ms_per_ktok=0.01, cpu=1.0)


def mixed(n, closed, seed=0):
    rng = np.random.default_rng(seed)
    return wl(rng.integers(100, 600, n), rng.integers(50, 200, n), cls=rng.integers(0, 3, n), closed=closed)


def test_dspark_adaptive_behaviour_on_staircase():
    prof = staircase_profile()
    sc = SpecConfig("dspark", adaptive=True, policy="vllm", acceptance="qwen3-4b-fig2")
    low = simulate(SimConfig(workload=mixed(12, 1), profile=prof, gpus_per_node=1, spec=sc)).summary
    high = simulate(SimConfig(workload=mixed(1024, 256), profile=prof, gpus_per_node=1, spec=sc)).summary
    assert low["mean_verify_tokens_per_request"] >= 7.0  # (nearly) the whole block of 8
    assert high["mean_verify_tokens_per_request"] < low["mean_verify_tokens_per_request"] - 0.5
    pc = high["per_class"]
    assert pc["math"]["mean_verify_tokens_per_request"] > pc["chat"]["mean_verify_tokens_per_request"]
    assert 0.75 < high["head"]["auc"] < 0.95
    # at concurrency 1 the whole block is verified: nothing acceptable is trimmed; at 256 the
    # trimmed windows give up some accepted drafts (this staircase makes tokens expensive)
    assert 0.98 < low["verify_utilization"] <= 1.0
    assert 0.5 < high["verify_utilization"] < low["verify_utilization"]


def test_compact_at_least_static_throughput_at_high_load():
    prof = staircase_profile()
    base = dict(method="dspark", adaptive=True, policy="vllm", acceptance="qwen3-4b-fig2")
    outs = {}
    for mode in ("compact", "static"):
        res = simulate(
            SimConfig(
                workload=mixed(1024, 256), profile=prof, gpus_per_node=1, spec=SpecConfig(verify_mode=mode, **base)
            )
        )
        outs[mode] = res.summary["output_tok_s"]
    assert outs["compact"] >= outs["static"]


# ---- regressions found in review -------------------------------------------------------------


def test_request_larger_than_kv_cache_is_an_input_error():
    prof = linear_profile(kv_gib=1024 * 16 * 10 / 2**30)  # 10 blocks of 16 tokens
    with pytest.raises(InputError, match="request 1: .*KV blocks"):
        run(wl([400], [4]), prof)


def test_prefix_cache_hits_only_blocks_already_computed():
    prof = linear_profile()
    hashes = [np.arange(8, dtype=np.int64) for _ in range(3)]
    # Request 1 is admitted while request 0 has computed one 512-token chunk of its prompt (both
    # prefill side by side in chunks of 512): it hits that one block only. Request 2 arrives after
    # request 0 computed its prompt: it hits every full block but the last token.
    w = wl([4096] * 3, [2] * 3, arrival=[0.0, 0.001, 5.0])
    w = dataclasses.replace(w, prefix_hashes=hashes, prefix_block_tokens=512)
    eng = EngineConfig(enable_prefix_caching=True, long_prefill_token_threshold=512)
    r = run(w, prof, engine=eng).requests
    assert r.cached_tokens[0] == 0
    assert r.cached_tokens[1] == 512
    assert r.cached_tokens[2] == 4095


def test_preemption_evicts_the_most_recently_admitted():
    prof = linear_profile(kv_gib=1024 * 16 * 200 / 2**30)  # 200 blocks = 3200 tokens
    # r0: older long prompt still prefilling in 64-token chunks; r1: newer short prompt decoding.
    w = wl([3150, 16], [5, 2000])
    r = run(w, prof, engine=EngineConfig(long_prefill_token_threshold=64, max_num_batched_tokens=256)).requests
    assert r.preemptions[0] == 0 and r.preemptions[1] >= 1
    assert r.completed.all()


@pytest.mark.parametrize("pol", ["vllm", "paper", "paper-production", "sglang", "threshold", "fixed"])
def test_adaptive_policy_windows_are_exact(pol):
    """A request's draws are its own (per request and draft round), so an adaptive run gives
    the same result with windows of 1 and 64 steps: each step's budget in a window is priced at
    its own KV context (solved step by step), whatever the policy."""
    rng = np.random.default_rng(3)
    n = 48
    w = wl(rng.integers(500, 3000, n), rng.integers(100, 300, n), closed=n, cls=rng.integers(0, 3, n))
    caps = vllm_capture_sizes(512)
    toks = caps + [768, 1024, 2048, 4096, 8192]
    prof = make_profile(
        forward={"tokens": toks, "ms": [5.0 + 0.05 * t for t in toks]}, kv_ms_per_ktok=0.5, cpu=0.3, kv_gib=50
    )
    acc = "math=0.95,0.9,0.85,0.8,0.7,0.6,0.5;code=0.9,0.8,0.7,0.6,0.5,0.4,0.3;chat=0.8,0.6,0.5,0.4,0.3,0.2,0.1"
    sc = SpecConfig("dspark", adaptive=True, policy=pol, acceptance=acc)
    a = run(w, prof, engine=EngineConfig(max_window=1), spec=sc)
    b = run(w, prof, engine=EngineConfig(max_window=64), spec=sc)
    np.testing.assert_allclose(a.requests.e2e_ms, b.requests.e2e_ms, rtol=1e-9)
    assert a.summary["steps"] == b.summary["steps"]
    for key in ("acceptance_length", "mean_verify_tokens_per_request", "verify_utilization", "head"):
        assert a.summary[key] == b.summary[key]


def test_speculative_decode_windows_are_exact():
    """The same for fixed blocks (MTP, EAGLE-3, DSpark without adaptation) on an open-loop trace."""
    prof = linear_profile(cpu=0.7, kv_ms_per_ktok=0.3)
    rng = np.random.default_rng(8)
    n = 200
    arr = np.cumsum(rng.exponential(0.05, n))
    w = wl(rng.integers(50, 900, n), rng.integers(1, 120, n), arrival=arr - arr[0], cls=rng.integers(0, 3, n))
    for sc in (SpecConfig("mtp"), SpecConfig("eagle3"), SpecConfig("dspark")):
        a = run(w, prof, engine=EngineConfig(max_window=1), spec=sc)
        b = run(w, prof, engine=EngineConfig(max_window=64), spec=sc)
        np.testing.assert_allclose(a.requests.e2e_ms, b.requests.e2e_ms, rtol=1e-9)
        assert a.summary["acceptance_length"] == b.summary["acceptance_length"]


def test_format_2_decode_windows_are_exact():
    """A format-2 profile's per-request attention terms (CostModel.context_ms) are priced at
    each step of a decode window with its own windows and contexts, as stepping one by one does:
    windows of 1 and 256 steps give the same run, on several replicas of an open-loop trace."""
    terms = ATTENTION_TERMS
    prof = dataclasses.replace(linear_profile(cpu=0.7, kv_ms_per_ktok=0.3), format_version=2, attention=terms)
    assert CostModel(prof).has_context_terms
    rng = np.random.default_rng(11)
    n = 240
    arr = np.cumsum(rng.exponential(0.02, n))
    w = wl(rng.integers(50, 3000, n), rng.integers(1, 300, n), arrival=arr - arr[0], cls=rng.integers(0, 3, n))
    for sc in (SpecConfig(), SpecConfig("dspark", adaptive=True)):
        a, b = (
            simulate(SimConfig(workload=w, profile=prof, gpus_per_node=4, spec=sc, engine=EngineConfig(max_window=mw)))
            for mw in (1, 256)
        )
        np.testing.assert_allclose(a.requests.e2e_ms, b.requests.e2e_ms, rtol=1e-9)
        np.testing.assert_allclose(a.steps.duration_ms, b.steps.duration_ms, rtol=1e-9)
        assert a.summary["steps"] == b.summary["steps"] > n


def test_head_sample_does_not_depend_on_window_lengths():
    """The head's quality is measured on each replica's first draft rounds (an equal share of the
    sample cap, in its own step order), so it is the same whether steps run one by one or as
    windows, however the replicas' steps interleave."""
    prof = linear_profile(cpu=0.7, kv_ms_per_ktok=0.3)
    rng = np.random.default_rng(12)
    n = 300
    arr = np.cumsum(rng.exponential(0.01, n))
    w = wl(rng.integers(50, 900, n), rng.integers(20, 300, n), arrival=arr - arr[0], cls=rng.integers(0, 3, n))
    sc = SpecConfig("dspark", adaptive=True)
    a, b = (
        simulate(
            SimConfig(workload=w, profile=prof, gpus_per_node=4, spec=sc, engine=EngineConfig(max_window=mw))
        ).summary
        for mw in (1, 256)
    )
    assert a["setup"]["replicas"] == 4
    assert a["head"] == b["head"] and a["acceptance_length"] == b["acceptance_length"]


def test_budget_cut_counts_only_drafts_given():
    prof = linear_profile()
    sc = SpecConfig("eagle3", k=7, acceptance="const:0.5", sigma_request=0.0, sigma_step=0.0, verify_mode="static")
    res = run(wl([10] * 5, [40] * 5), prof, spec=sc, engine=EngineConfig(max_num_batched_tokens=36))
    st = res.steps[res.steps.prefill_tokens == 0]
    assert (st.n_tokens == st.n_decode + st.verify_draft_tokens).all()


# ---- engine buffers and kernel arguments ------------------------------------------------------


@pytest.mark.parametrize("name", [None, "h200-qwen3-8b", "deepseek-v4-class-h200x8"])
def test_packed_context_args_price_as_the_tuple(name):
    """The decode window's packed context arguments give context_ms_compiled the same values
    and types as CostModel.context_args' tuple: the same cost on random steps."""
    from dsim.cost import context_ms_compiled
    from dsim.engine import compiled_window

    cost = CostModel(load_profile(name))
    ctx = cost.context_args()
    packed = compiled_window.pack_context_args(ctx)
    rng = np.random.default_rng(7)
    for _ in range(20):
        n = int(rng.integers(1, 300))
        q = rng.integers(1, 8, n).astype(np.int64)
        c = rng.integers(1, 60_000, n).astype(np.int64)
        assert compiled_window._context_ms_packed(q, c, packed) == context_ms_compiled(q, c, *ctx[1:])


def test_slots_context_ms_prices_as_the_cost_model():
    """A general step's compiled per-request attention terms of the decode slots (query 1 +
    verified drafts, or 1 without drafts, over each slot's cached tokens) equal
    CostModel.context_ms on the same step, exactly."""
    from dsim.engine import compiled_window
    from dsim.engine.compiled_bundles import COMP, NCOL

    cost = CostModel(load_profile(None))  # the default profile: a format-3 request table
    assert cost.request_attention is not None  # (the engine takes this path only then)
    packed = compiled_window.pack_context_args(cost.context_args())
    rng = np.random.default_rng(11)
    for _ in range(30):
        n = int(rng.integers(1, 300))
        cap = n + int(rng.integers(0, 5))  # (the slot buffers are longer than the live slots)
        I = np.zeros((cap, NCOL), dtype=np.int64)
        I[:, COMP] = rng.integers(1, 60_000, cap)
        K = int(rng.integers(0, 8))
        verified = rng.integers(0, K + 1, (1, cap)).astype(np.int64)
        q = 1 + verified[0, :n] if K else np.ones(n, np.int64)
        want = cost.context_ms(q, I[:n, COMP])
        assert compiled_window.slots_context_ms(I, n, K, verified, packed) == want


def test_pack_context_args_rejects_a_field_of_another_kind():
    from dsim.engine import compiled_window

    ctx = CostModel(load_profile("h200-qwen3-8b")).context_args()
    on, split, coefs, table = ctx
    with pytest.raises(TypeError, match=r"context_args field 5 "):
        compiled_window.pack_context_args((on, split[:4] + (1,) + split[5:], coefs, table))  # balance as an int
    with pytest.raises(TypeError, match="fields expected"):
        compiled_window.pack_context_args(ctx[:-1])
    with pytest.raises(TypeError, match="fields expected"):
        compiled_window.pack_context_args((on, split, coefs, table[:-1]))


def test_columns_keep_row_order_across_appends_reserves_and_blocks():
    """Rows appended one at a time and ranges reserved and written in place come back in order,
    across block boundaries (a new block never moves the rows already written)."""
    from dsim.engine.buffers import Columns

    rng = np.random.default_rng(3)
    col = Columns(3, cap=4)
    want = []
    for _ in range(400):
        if rng.random() < 0.6:
            row = tuple(float(x) for x in rng.integers(0, 1000, 3))
            col.append(row)
            want.append(row)
        else:
            m = int(rng.integers(1, 40))
            i = col.reserve(m)
            vals = rng.integers(0, 1000, (3, m)).astype(np.float64)
            col.a[:, i : i + m] = vals
            want.extend(tuple(v) for v in vals.T)
    got = np.concatenate([b.T for b in col.blocks()])
    assert got.shape == (len(want), 3)
    assert (got == np.array(want)).all()
    assert len(col.blocks()) > 1


def test_prefix_hits_looked_up_in_batches_change_nothing(monkeypatch):
    # A burst of 60 prompts from 6 shared prefixes into a prefix cache that holds a few of them:
    # admission looks the hits up ahead, a batch at a time, and applies the LRU's order after.
    # Whatever the batch, every request's cached tokens and times are the one-at-a-time ones.
    import dsim.engine.general_step as engine

    prof = linear_profile(kv_gib=1024 * 16 * 1200 / 2**30)  # 1,200 blocks: 37 prefix blocks of 512
    rng = np.random.default_rng(11)
    group = rng.integers(0, 6, 60)
    hashes = [np.arange(8, dtype=np.int64) + 100 * g for g in group]
    w = wl(rng.integers(1500, 4096, 60), rng.integers(2, 30, 60), arrival=np.zeros(60))
    w = dataclasses.replace(w, prefix_hashes=hashes, prefix_block_tokens=512)
    eng = EngineConfig(enable_prefix_caching=True, max_num_seqs=32)
    tables = []
    for batch in (1, 3, 1000):
        monkeypatch.setattr(engine, "_HIT_BATCH", batch)
        tables.append(run(w, prof, engine=eng).requests)
    assert tables[0].cached_tokens.sum() > 0
    for t in tables[1:]:
        assert t[["cached_tokens", "ttft_ms", "e2e_ms"]].equals(tables[0][["cached_tokens", "ttft_ms", "e2e_ms"]])


@pytest.mark.parametrize("pol", ["vllm", "paper-production", "sglang", "fixed", None])
def test_one_call_plan_is_the_two_call_plan(monkeypatch, pol):
    """A speculative general step's schedule, cost row and draws in one compiled call
    (plan_general) give what schedule_step, CostModel.step_cost_row and plan_decodes give called
    apart, including a token budget past the dense cost table, where the one call hands the
    pricing back (and, with prefix caching, admission past its first batch of looked-up hits
    goes on)."""
    from dsim.engine.replica import Replica

    rng = np.random.default_rng(9)
    n = 150
    # short outputs: a completion and an admission almost every step; a sixth of the prompts long
    # enough that a running prefill's chunk takes the step past the dense table (16,384 tokens)
    prompt = np.where(rng.random(n) < 1 / 6, rng.integers(30000, 60000, n), rng.integers(200, 3000, n))
    w = wl(prompt, rng.integers(5, 40, n), closed=24, cls=rng.integers(0, 3, n))
    caps = vllm_capture_sizes(512)
    toks = caps + [768, 1024, 2048, 4096, 8192]
    prof = make_profile(
        forward={"tokens": toks, "ms": [5.0 + 0.05 * t for t in toks]}, kv_ms_per_ktok=0.5, cpu=0.3, kv_gib=50
    )
    acc = "math=0.9,0.8,0.7,0.6;code=0.8,0.7,0.5,0.4;chat=0.7,0.5,0.3,0.2"
    sc = SpecConfig("dspark", adaptive=True, policy=pol, acceptance=acc) if pol else SpecConfig("mtp")
    for budget in (8192, 40000):
        eng = EngineConfig(max_num_batched_tokens=budget)
        out = []
        for fused in (True, False):
            monkeypatch.setattr(Replica, "fuse_plan", fused)
            res = run(w, prof, engine=eng, spec=sc)
            out.append((res.summary["steps"], res.requests[["ttft_ms", "e2e_ms"]], res.steps))
        assert out[0][0] == out[1][0]
        assert out[0][1].equals(out[1][1]) and out[0][2].equals(out[1][2])
    # a 60,000-token prompt prefilling in chunks while 30 short ones arrive, prefix caching on
    m = 32
    w = wl([100, 60000] + [200] * 30, [200, 5] + [5] * 30, arrival=[0.0, 0.0] + [0.001] * 30)
    w = dataclasses.replace(
        w, prefix_hashes=[np.array([1000 * i], np.int64) for i in range(m)], prefix_block_tokens=512
    )
    eng = EngineConfig(max_num_batched_tokens=40000, enable_prefix_caching=True)
    out = []
    for fused in (True, False):
        monkeypatch.setattr(Replica, "fuse_plan", fused)
        res = run(w, prof, engine=eng, spec=sc)
        out.append((res.requests[["ttft_ms", "e2e_ms"]], res.steps))
    assert out[0][0].equals(out[1][0]) and out[0][1].equals(out[1][1])


@pytest.mark.parametrize(
    "case",
    [
        "closed-dspark",
        "closed-none-cut",
        "closed-mtp-preempt",
        "open-dspark-2nodes",
        "closed-consumer",
        "closed-mtp-gaps",
        "closed-composed-dspark",
        "closed-composed-gaps",
    ],
)
def test_compiled_steps_are_the_python_steps(monkeypatch, case):
    """Consecutive general steps run as one compiled call (run_general_steps) give what the
    same steps planned and committed one by one from Python give: every request's times, the
    step table, the ITL samples and the speculative counters. Closed loops (the replica submits
    its users' successors itself; with the front end's gaps the simulation does), an open loop
    on two nodes, a token budget that cuts the decode queue, a KV cache small enough to
    preempt, a decode instance."""
    from dsim.engine.replica import Replica

    rng = np.random.default_rng(12)
    # (with DSpark, enough drafts that the head's 60,000-draft sample completes inside the run)
    n = 1500 if "dspark" in case else 160
    prompt, output = rng.integers(100, 3000, n), rng.integers(5, 120, n)
    acc = "math=0.9,0.8,0.7,0.6;code=0.8,0.7,0.5,0.4;chat=0.7,0.5,0.3,0.2"
    dspark = SpecConfig("dspark", adaptive=True, acceptance=acc)
    kw: dict = {}
    prof = linear_profile(cpu=0.4, kv_ms_per_ktok=0.2)
    if case == "closed-dspark":
        w, spec = wl(prompt, output, closed=96, cls=rng.integers(0, 3, n)), dspark
    elif case == "closed-none-cut":
        w, spec = wl(prompt, output, closed=64), SpecConfig()
        kw["engine"] = EngineConfig(max_num_batched_tokens=48)
    elif case == "closed-mtp-preempt":
        w, spec = wl(prompt, output, closed=32), SpecConfig("mtp")
        prof = linear_profile(cpu=0.4, kv_ms_per_ktok=0.2, kv_gib=1024 * 16 * 900 / 2**30)
    elif case == "open-dspark-2nodes":
        arr = np.cumsum(rng.exponential(0.004, n))
        w, spec = wl(prompt, output, arrival=arr - arr[0], cls=rng.integers(0, 3, n)), dspark
        kw["nodes"] = 2
    elif case == "closed-consumer":
        w, spec = wl(prompt, output, closed=40), SpecConfig("mtp")
        kw["engine"] = EngineConfig(kv_role="kv_consumer")
    elif case == "closed-composed-dspark":  # (prefill terms and per-request attention priced in the kernel)
        w, spec = wl(prompt, output, closed=64, cls=rng.integers(0, 3, n)), dspark
        prof = load_profile("deepseek-v4-flash-h200-tp8-ep8")
    elif case == "closed-composed-gaps":  # (the front end's gaps interrupt runs: a planned step committed
        # by the next run)
        w, spec = wl(prompt, output, closed=8), SpecConfig("mtp")
        prof = load_profile("deepseek-v4-flash-h200-tp8-ep8")
        kw["closed_loop_gap_ms"] = 1.0
    else:
        w, spec = wl(prompt, output, closed=40), SpecConfig("mtp")
        kw["closed_loop_gap_ms"] = 3.0
    calls = {"runs": 0, "resumed": 0}
    run_steps = Replica._run_steps_compiled

    def counted(self):
        calls["runs"] += 1
        calls["resumed"] += self._run_pending is not None
        return run_steps(self)

    monkeypatch.setattr(Replica, "_run_steps_compiled", counted)
    out = []
    for compiled in (True, False):
        monkeypatch.setattr(Replica, "run_compiled", compiled)
        res = run(w, prof, spec=spec, **kw)
        out.append(res)
    assert calls["runs"] > 0  # (the compiled runs did take part)
    if case == "closed-composed-gaps":
        assert calls["resumed"] > 0
    a, b = out
    assert a.requests.equals(b.requests) and a.steps.equals(b.steps)
    assert all(np.array_equal(x, y) for x, y in zip(a.itl, b.itl))
    sa, sb = (dict(r.summary, wall_time_s=0) for r in out)
    assert sa == sb
    if case == "closed-mtp-preempt":
        assert a.summary["preemptions"] > 0


@pytest.mark.parametrize("compiled", [True, False])
def test_step_table_columns_mean_what_their_names_say(monkeypatch, compiled):
    """Every writer of the step table (Python's single steps, the compiled runs of steps, the
    decode windows) puts each quantity in its named column: per step the forward's tokens are
    the decodes', their verified drafts and the prefill tokens; accepted drafts never exceed the
    verified ones; the decoding requests are among the scheduled ones; each replica's steps end
    in order, each step's end its predecessor's plus its duration; and the emitted tokens add up
    to every request's output (each request completes)."""
    from dsim.engine.records import STEP_FIELDS
    from dsim.engine.replica import Replica

    monkeypatch.setattr(Replica, "run_compiled", compiled)
    rng = np.random.default_rng(5)
    n = 400
    prompt, output = rng.integers(100, 3000, n), rng.integers(5, 120, n)
    acc = "math=0.9,0.8,0.7,0.6;code=0.8,0.7,0.5,0.4;chat=0.7,0.5,0.3,0.2"
    res = run(wl(prompt, output, closed=48, cls=rng.integers(0, 3, n)), linear_profile(cpu=0.4, kv_ms_per_ktok=0.2),
              spec=SpecConfig("dspark", adaptive=True, acceptance=acc), nodes=2)  # fmt: skip
    st = res.steps
    assert list(st.columns) == list(STEP_FIELDS)
    assert (st.n_tokens == st.n_decode + st.verify_draft_tokens + st.prefill_tokens).all()
    assert (st.accepted_tokens <= st.verify_draft_tokens).all() and (st.n_decode <= st.n_requests).all()
    assert (st.duration_ms > 0).all() and (st.kv_tokens >= st.n_tokens).all() and (st.n_waiting >= 0).all()
    assert set(st.replica) == {0, 1}
    for _, g in st.groupby("replica"):
        t = g.t_end_s.to_numpy()
        # (a step starts at its predecessor's end, or later after an idle gap)
        assert (np.diff(t) >= g.duration_ms.to_numpy()[1:] / 1000.0 - 1e-9).all()
    assert int(st.emitted_tokens.sum()) == int(res.requests.output_tokens.sum())
    assert res.summary["requests_completed"] == n
    assert (st.verify_draft_tokens > 0).any() and (st.prefill_tokens > 0).any()


def test_decode_outcomes_name_each_requests_tokens(monkeypatch):
    """What a single step or a decode window produced (DecodeOutcome) is per request in slot
    order: its committed, verified and accepted tokens add up to the outcome's totals and, over
    the run, to the step table's verified and accepted columns; a request accepts at most what it
    verifies and commits at most its accepted drafts plus one token a step; inside the commit
    cap at most the full block's leading accepted drafts."""
    from dsim.engine.replica import Replica

    monkeypatch.setattr(Replica, "run_compiled", False)  # (every step through _commit_step)
    seen: list = []

    def keep(o):
        seen.append((o.steps, o.n, o.drafted, o.committed.copy(), o.verified.copy(), o.accepted.copy(),
                     o.step_verified.copy(), o.step_accepted.copy(), o.step_emitted.copy(), o.total_verified,
                     o.total_accepted, o.total_committed, o.full_block_accepted))  # fmt: skip
        return o

    commit, window = Replica._commit_step, Replica._decode_window

    def commit_kept(self, plan):
        return keep(commit(self, plan))

    def window_kept(self):
        return keep((yield from window(self)))

    monkeypatch.setattr(Replica, "_commit_step", commit_kept)
    monkeypatch.setattr(Replica, "_decode_window", window_kept)
    rng = np.random.default_rng(9)
    n = 300
    prompt, output = rng.integers(100, 2000, n), rng.integers(5, 150, n)
    res = run(wl(prompt, output, closed=32), linear_profile(cpu=0.4, kv_ms_per_ktok=0.2),
              spec=SpecConfig("dspark", adaptive=True))  # fmt: skip
    assert any(s[0] > 1 for s in seen) and any(s[0] == 1 for s in seen)  # windows and single steps
    for steps, m, K, com, ver, acc, sv, sa, se, tv, ta, tc, fb in seen:
        assert K == 7 and len(com) == m and len(sv) == steps
        assert com.sum() == tc == se.sum() and ver.sum() == tv == sv.sum() and acc.sum() == ta == sa.sum()
        assert (acc <= ver).all() and (com <= acc + steps).all() and (ver <= K * steps).all()
        assert ta <= fb
    st = res.steps
    assert sum(s[9] for s in seen) == int(st.verify_draft_tokens.sum())
    assert sum(s[10] for s in seen) == int(st.accepted_tokens.sum())


@pytest.mark.parametrize(
    "profile", ["deepseek-v4-flash-h200-dp8-ep8", "deepseek-v3-h200-tp8-ep8", "deepseek-v4-class-h200x8"]
)
def test_compiled_prefill_terms_are_prefill_ms(profile):
    """The kernels' prefill_ms (CostModel.prefill_args, prefill_ms_compiled) is CostModel.prefill_ms
    bit for bit on random steps' chunks (zero-token chunks skipped, none at all), and a profile
    whose terms it cannot price says so (None)."""
    from dsim.cost import prefill_ms_compiled

    cost = CostModel(load_profile(profile))
    args = cost.prefill_args()
    assert args is not None
    mode, coef = args
    rng = np.random.default_rng(3)
    for _ in range(200):
        k = int(rng.integers(0, 9))
        chunks = rng.integers(0, 4096, k) * (rng.random(k) < 0.8)
        computed = rng.integers(0, 100_000, k)
        pre = rng.permutation(k)
        want = cost.prefill_ms((int(q), int(computed[pre[i]])) for i, q in enumerate(chunks) if q)
        assert prefill_ms_compiled(mode, coef, chunks, computed, pre, k) == want
    assert CostModel(load_profile("analytical-qwen3-8b-h200x1")).prefill_args() is None  # (wave-counted pairs)
