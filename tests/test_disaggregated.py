"""Prefill/decode disaggregation (EngineConfig.kv_role = "kv_consumer"): a decode instance receives
each request with its prompt's KV computed elsewhere. Closed-form cases and the engine's
invariants (completion, KV accounting, exact decode windows, determinism, bad input)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from builders import linear_profile, make_profile, run, wl
from dsim.cost import KV_BLOCK_TOKENS, CostModel
from dsim.engine.config import EngineConfig
from dsim.errors import InputError
from dsim.sim import SpecConfig

DEC = EngineConfig(kv_role="kv_consumer")


def test_one_request_has_no_prefill_step_and_reads_its_prompt():
    prof = linear_profile(cpu=1.5, kv_ms_per_ktok=0.4)
    c = CostModel(prof)
    P, O = 1000, 50
    res = run(wl([P], [O]), prof, engine=DEC)
    st, r = res.steps, res.requests.iloc[0]
    # one token computed in the first step (the last prompt token, to sample the first output
    # token), then one decode step per further output token
    assert len(st) == O
    assert st.prefill_tokens.tolist() == [1] + [0] * (O - 1)
    assert st.n_tokens.max() == 1
    # attention reads the whole prompt: the first step's KV read is the prompt, then it grows by one
    assert st.kv_tokens.tolist() == [P + i for i in range(O)]
    assert r.ttft_ms == pytest.approx(c.step_ms_one(1, P) + 1.5)
    assert r.e2e_ms == pytest.approx(sum(c.step_ms_one(1, P + i) + 1.5 for i in range(O)))
    assert r.output_tokens == O
    # colocated, the same request prefills its prompt first
    col = run(wl([P], [O]), prof)
    assert col.steps.prefill_tokens.iloc[0] == P
    assert col.requests.ttft_ms.iloc[0] > r.ttft_ms


def test_remote_prefill_delay_is_added_to_ttft_and_nothing_else():
    prof = linear_profile(cpu=1.0)
    c = CostModel(prof)
    P, O = 2000, 20
    eng = dataclasses.replace(DEC, remote_prefill_ms=30.0, remote_prefill_ms_per_ktok=12.0)
    a = run(wl([P], [O]), prof, engine=eng).requests.iloc[0]
    b = run(wl([P], [O]), prof, engine=DEC).requests.iloc[0]
    delay = 30.0 + 12.0 * P / 1000
    assert a.ttft_ms == pytest.approx(delay + c.step_ms_one(1, P) + 1.0)
    assert a.ttft_ms - b.ttft_ms == pytest.approx(delay)
    assert a.tpot_ms == pytest.approx(b.tpot_ms)


def test_steps_are_output_over_accepted_plus_one():
    # every draft accepted: MTP-1 emits 2 tokens a step after the first token
    prof = linear_profile()
    P, O = 400, 41
    sc = SpecConfig("mtp", k=1, acceptance="const:1.0", sigma_request=0.0, sigma_step=0.0)
    res = run(wl([P], [O]), prof, engine=DEC, spec=sc)
    assert len(res.steps) == 1 + math.ceil((O - 1) / 2)
    assert res.steps.prefill_tokens.sum() == 1
    assert res.summary["requests_completed"] == 1


def test_prompt_kv_occupies_blocks_at_admission():
    # 25 blocks of 16 tokens; each 160-token prompt holds 10 blocks as soon as it is admitted, so
    # the third request waits although its first step computes a single token
    P = 160
    blocks = 25
    prof = make_profile(kv_gib=blocks * KV_BLOCK_TOKENS * 1024 / 2**30)
    assert prof.kv_capacity_blocks == blocks
    res = run(wl([P] * 3, [2] * 3), prof, engine=DEC)
    first = res.steps.iloc[0]
    assert first.n_requests == 2 and first.kv_tokens == 2 * P and first.prefill_tokens == 2
    req = res.requests
    assert req.queue_ms.iloc[:2].max() == 0.0 and req.queue_ms.iloc[2] > 0
    assert res.summary["requests_completed"] == 3


def mixed(n, seed):
    rng = np.random.default_rng(seed)
    return rng.integers(50, 1500, n), rng.integers(1, 200, n)


@pytest.mark.parametrize("closed", [None, 16])
def test_invariants_completion_prefill_tokens_and_exact_windows(closed):
    prof = linear_profile(cpu=0.6, kv_ms_per_ktok=0.3)
    n = 300
    p, o = mixed(n, 7)
    arr = None
    if closed is None:
        arr = np.cumsum(np.random.default_rng(8).exponential(0.03, n))
        arr -= arr[0]
    w = wl(p, o, arrival=arr, closed=closed)
    eng = dataclasses.replace(DEC, remote_prefill_ms=5.0, remote_prefill_ms_per_ktok=2.0)
    a = run(w, prof, engine=dataclasses.replace(eng, max_window=1))
    b = run(w, prof, engine=eng)
    for res in (a, b):
        s = res.summary
        assert s["requests_completed"] == n and s["preemptions"] == 0
        assert (res.requests.output_tokens == o).all()
        # each request computes exactly one token on the decode instance outside its decodes
        assert res.steps.prefill_tokens.sum() == n
    for col in ("ttft_ms", "tpot_ms", "e2e_ms", "itl_max_ms"):
        np.testing.assert_allclose(a.requests[col].to_numpy(), b.requests[col].to_numpy(), rtol=1e-9, atol=1e-6)
    # the delay is part of every TTFT
    assert b.requests.ttft_ms.min() >= 5.0 + 2.0 * p.min() / 1000


def test_preempted_requests_recompute_locally_and_all_complete():
    prof = linear_profile(kv_gib=0.002)  # 131 blocks
    p, o = mixed(40, 9)
    p = np.minimum(p, 600)
    res = run(wl(p, o), prof, engine=DEC)
    s = res.summary
    assert s["requests_completed"] == 40 and s["preemptions"] > 0
    # a preempted request (after its first token) recomputes its prompt and output here
    assert res.steps.prefill_tokens.sum() > 40


def test_disaggregated_is_deterministic_and_faster_than_colocated():
    prof = linear_profile(cpu=0.5)
    p, o = mixed(200, 10)
    w = wl(p, o, closed=32)
    sc = SpecConfig("dspark", k=5, adaptive=True, acceptance="deepseek-v4")
    a = run(w, prof, engine=DEC, spec=sc).summary
    b = run(w, prof, engine=DEC, spec=sc).summary
    for d in (a, b):
        d.pop("wall_time_s")
    assert a == b
    col = run(w, prof, spec=sc).summary
    assert a["output_tok_s_per_user"] > col["output_tok_s_per_user"]
    assert a["ttft_ms"]["p50"] < col["ttft_ms"]["p50"]


@pytest.mark.parametrize(
    "eng,msg",
    [
        (EngineConfig(kv_role="kv_producer"), "kv_role"),
        (EngineConfig(kv_role="kv_consumer", remote_prefill_ms=-1.0), "--remote-prefill-ms"),
        (EngineConfig(kv_role="kv_consumer", remote_prefill_ms_per_ktok=float("nan")), "--remote-prefill-ms-per-ktok"),
        (EngineConfig(remote_prefill_ms=5.0), "--disaggregated"),
    ],
)
def test_bad_settings_are_input_errors(eng, msg):
    with pytest.raises(InputError, match=msg):
        run(wl([10], [2]), linear_profile(), engine=eng)


# ---- command line: simulate, sweep, plan and ab take --disaggregated ---------------------------


@pytest.mark.slow
def test_cli_simulate_and_sweep_run_disaggregated(tmp_path):
    import json

    import pandas as pd
    from typer.testing import CliRunner

    from dsim.cli.entry import app

    r = CliRunner()
    res = r.invoke(
        app,
        [
            "simulate",
            "--requests",
            "40",
            "--concurrency",
            "8",
            "--method",
            "mtp",
            "--disaggregated",
            "--remote-prefill-ms",
            "20",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    s = json.loads(res.output)
    assert s["setup"]["engine"]["kv_role"] == "kv_consumer" and s["setup"]["engine"]["remote_prefill_ms"] == 20.0
    assert s["ttft_ms"]["p50"] >= 20.0
    ttft = {}
    for flag in ([], ["--disaggregated"]):
        out = tmp_path / f"sw{len(flag)}"
        res = r.invoke(
            app,
            [
                "sweep",
                "--concurrency",
                "4",
                "--methods",
                "mtp",
                "--min-requests",
                "16",
                "--requests-per-user",
                "2",
                "--jobs",
                "1",
                "--out",
                str(out),
                *flag,
            ],
        )
        assert res.exit_code == 0, res.output
        ttft[len(flag)] = float(pd.read_csv(out / "sweep.csv")["ttft_p50_ms"].iloc[0])
    assert ttft[1] < ttft[0]  # no prompt prefilled on the decode GPUs
    res = r.invoke(
        app,
        [
            "plan",
            "--sla",
            "p50=40ms",
            "--requests",
            "40",
            "--seeds",
            "0",
            "--max-nodes",
            "2",
            "--jobs",
            "1",
            "--disaggregated",
            "--json",
        ],
    )
    assert res.exit_code in (0, 1), res.output
    assert any("kv_consumer" in n for n in json.loads(res.output)["assumptions"]["notes"])


@pytest.mark.parametrize(
    "cmd",
    [
        ["simulate"],
        ["sweep", "--out", "OUT"],
        ["plan", "--sla", "p50=20ms"],
        ["ab", "--out", "OUT"],
    ],
)
def test_cli_delay_without_disaggregated_is_exit_2(cmd, tmp_path):
    from typer.testing import CliRunner

    from dsim.cli.entry import app

    out = tmp_path / "out"
    args = [str(out) if a == "OUT" else a for a in cmd]
    res = CliRunner().invoke(app, [*args, "--remote-prefill-ms", "5"])
    assert res.exit_code == 2 and "--disaggregated" in res.output, res.output
    assert not out.exists()  # nothing half-written
