"""Warnings on results a user should not trust: closed-form cases that trigger and that do not
trigger each warning, then real simulations (an overloaded fleet, one replica holding every
request) against a fleet that serves its load."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from builders import STEP_MS, const_workload, flat_profile, plan_small
from dsim.engine import diagnostics as D
from dsim.engine.config import EngineConfig
from dsim.sim import SimConfig, SpecConfig, simulate
from dsim.study.capacity import format_plan
from dsim.study.sla import parse_sla

# ---- replica imbalance ----------------------------------------------------------------------


def test_imbalance_closed_form():
    work = np.full(100, 10.0)  # equal requests: a random split has no noise
    w = D.replica_imbalance(np.r_[np.zeros(75), np.ones(25)], work, 2)
    assert w is not None and w["kind"] == "replica_imbalance"
    assert w["value"] == pytest.approx(1.5)  # 75% of the work, 1.5x the mean replica's
    assert "75%" in w["message"]
    assert D.replica_imbalance(np.r_[np.zeros(74), np.ones(26)], work, 2) is None  # 1.48x
    assert D.replica_imbalance(np.zeros(100), work, 4)["value"] == pytest.approx(4.0)  # one of four holds all
    assert D.replica_imbalance(np.zeros(100), work, 1) is None  # one replica: nothing to balance


def test_imbalance_counts_only_replicas_the_load_can_keep_busy():
    # ten requests of 1 s each, one after another: one request in the system on average (Little)
    a = np.arange(10.0)
    assert D.mean_in_system(a, np.full(10, 1000.0)) == pytest.approx(1.0)
    assert D.mean_in_system(a, np.full(10, 2000.0)) == pytest.approx(20 / 11)  # last finish at 11 s
    work = np.full(100, 10.0)
    on_one = np.zeros(100)
    assert D.replica_imbalance(on_one, work, 8, in_system=1.0) is None  # one user: one replica busy
    w = D.replica_imbalance(on_one, work, 8, in_system=1.5)  # two could be busy: 2x the fair share
    assert w["value"] == pytest.approx(2.0) and "the 2 replicas the load could keep busy" in w["message"]
    assert D.replica_imbalance(on_one, work, 8, in_system=50.0)["value"] == pytest.approx(8.0)


def test_imbalance_within_random_split_noise_is_not_flagged():
    # one long request on replica 0, three short on 1: 1.99x the mean, but a random split of four
    # requests this unequal does as much (sd sqrt(4 / 2) x std(work) = 612 > the excess 498 / 4)
    assert D.replica_imbalance(np.array([0, 1, 1, 1]), np.array([1000.0, 1, 1, 1]), 2) is None
    # the same unevenness over 400 requests is no chance split
    rep = np.tile([0, 1, 1, 1], 100)
    assert D.replica_imbalance(rep, np.tile([1000.0, 1, 1, 1], 100), 2) is not None


# ---- queue growth ---------------------------------------------------------------------------


def test_queue_growth_closed_form():
    a = np.linspace(0.0, 100.0, 201)
    w = D.queue_growth(a, 200.0 * a)  # 0.2 s of delay per s of trace: 20% overload
    assert w is not None and w["kind"] == "queue_growth" and w["value"] == pytest.approx(0.2, rel=1e-6)
    assert D.queue_growth(a, np.full_like(a, 5000.0)) is None  # long but steady queue: a steady state
    assert D.queue_growth(a, 2.0 * a) is None  # slope 0.002: under 0.05
    short = np.linspace(0.0, 5.0, 101)
    assert D.queue_growth(short, 100.0 * short) is None  # slope 0.1, but the last quarter waits < 1 s
    assert D.queue_growth(a[:10], 200.0 * a[:10]) is None  # too few requests to fit a slope
    q = 200.0 * a
    q[-20:] = np.nan  # never admitted: queued until the run's end, still growing
    assert D.queue_growth(a, q) is not None


# ---- preemption / KV thrash -----------------------------------------------------------------


def test_preemption_closed_form():
    p = np.zeros(100, np.int64)
    assert D.preemption(p) is None
    p[:4] = 1
    assert D.preemption(p) is None  # 4%: under 5%
    p[:5] = 1
    w = D.preemption(p)
    assert w["kind"] == "preemption" and w["value"] == pytest.approx(0.05)
    p = np.zeros(100, np.int64)
    p[0] = 2
    assert D.preemption(p) is None
    p[0] = 3
    assert D.preemption(p)["kind"] == "kv_thrash"


# ---- few requests finished ------------------------------------------------------------------


def test_few_finished_closed_form():
    assert D.incomplete(10, 10) is None
    assert D.incomplete(9, 10)["value"] == pytest.approx(0.9)
    slos = parse_sla("ttft_p99=2s,p50=20ms,min_user_tok_s=10")
    ws = D.sla_warnings(slos, 500)  # P99 over 500: 5 requests beyond it
    assert [w["value"] for w in ws] == [pytest.approx(5.0)] and "P99 TTFT" in ws[0]["message"]
    assert D.sla_warnings(slos, 1000) == []  # 10 beyond: enough
    assert [round(w["value"], 3) for w in D.sla_warnings(slos, 19)] == [0.19, 9.5]  # both percentile terms


# ---- real simulations -----------------------------------------------------------------------


def _run(w, nodes, router="least_outstanding", seqs=4):
    return simulate(
        SimConfig(
            workload=w,
            profile=flat_profile(),
            nodes=nodes,
            gpus_per_node=8,
            router=router,
            engine=EngineConfig(max_num_seqs=seqs),
            spec=SpecConfig("none"),
            seed=0,
        )
    )


def test_overloaded_fleet_warns_and_served_fleet_does_not():
    # one request holds one of 4 slots for 100 steps of 10 ms: a replica serves 4 req/s
    w = const_workload(13.0, 13 * 20)
    over = _run(w, 1)  # 13 req/s on one replica: the queue grows at 13 / 4 - 1 s per s
    kinds = {x["kind"] for x in over.summary["warnings"]}
    assert kinds == {"queue_growth"}
    g = next(x for x in over.summary["warnings"] if x["kind"] == "queue_growth")
    assert g["value"] == pytest.approx(13 / 4 - 1, rel=0.1)
    assert STEP_MS == 10.0
    assert _run(w, 4).summary["warnings"] == []  # 4 replicas, 3.25 req/s each: no warning


def test_affinity_onto_one_replica_warns():
    w = const_workload(2.0, 200)
    w = dataclasses.replace(w, session_id=np.full(len(w), 7, np.int64))  # one session: affinity keeps one home
    res = _run(w, 2, router="affinity")
    assert (res.requests["replica"] == 0).all()
    kinds = [x["kind"] for x in res.summary["warnings"]]
    assert "replica_imbalance" in kinds
    assert next(x for x in res.summary["warnings"] if x["kind"] == "replica_imbalance")["value"] == pytest.approx(2.0)
    assert not any(x["kind"] == "replica_imbalance" for x in _run(w, 2).summary["warnings"])


def test_closed_loop_with_fewer_users_than_replicas_is_not_imbalance():
    # one user on a 4-replica fleet: every request goes to the first free replica (replica 0);
    # that is the load, not the router
    w = dataclasses.replace(const_workload(1.0, 40), closed_loop_concurrency=1)
    res = _run(w, 4)
    assert (res.requests["replica"] == 0).all()
    assert res.summary["warnings"] == []


def test_result_warnings_reads_request_table():
    req = pd.DataFrame(
        {
            "replica": [0, 0],
            "prompt_tokens": [1, 1],
            "output_tokens": [1, 1],
            "arrival_s": [0.0, 1.0],
            "queue_ms": [0.0, 0.0],
            "e2e_ms": [500.0, np.nan],
            "preemptions": [0, 0],
            "completed": [True, False],
        }
    )
    assert [w["kind"] for w in D.result_warnings(req, 1)] == ["few_finished"]


def test_plan_reports_method_warnings():
    w = const_workload(13.0, 13 * 4)  # 52 requests: P99 rests on 0.5 of them
    slos = parse_sla("ttft_p99=500ms,p50=11ms")
    res = plan_small(w, flat_profile(), slos)
    ws = res["none"]["warnings"]
    assert any(x["kind"] == "few_finished" and x["seeds"] == [0] for x in ws)
    text = format_plan(res, slos, ["none"])
    assert "warnings (results a reader should not trust" in text and "P99 TTFT" in text


@pytest.mark.slow
@pytest.mark.needs_traces("mooncake-conversation")
def test_readme_affinity_example_is_flagged():
    """The README's prefix-caching example with the affinity router: Mooncake's conversations share
    their first prefix block, so every request goes to one replica (mean TTFT about 4,400 s). The
    result carries the warning in --json and in the printed summary."""
    import json

    from typer.testing import CliRunner

    from dsim.cli.entry import app

    args = ["simulate", "--trace", "mooncake-conversation", "--prefix-caching", "--router", "affinity", "--nodes", "2"]
    r = CliRunner().invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    kinds = {w["kind"]: w for w in json.loads(r.output)["warnings"]}
    assert kinds["replica_imbalance"]["value"] == pytest.approx(16.0)  # 16 replicas, one holds all
    assert "queue_growth" in kinds
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0 and "warning  : replica 0 of 16 holds 100%" in r.output


def test_sweep_points_carry_preemption_warning():
    """A closed-loop sweep on a KV cache of 1024 tokens: one user (200 tokens) never preempts;
    16 users (3,200 tokens wanted) do, and the point says so in sweep.csv's column and the table."""
    from dsim.study import sweep as S

    prof = flat_profile()
    prof = dataclasses.replace(prof, kv_cache_gib=1024 * 1024 / 2**30)  # 1024 tokens of 1 KiB
    df = S.sweep(
        const_workload(1.0, 64),
        prof,
        {"none": SpecConfig("none")},
        (1, 16),
        requests_per_user=4,
        min_requests=32,
        jobs=1,
        engine=EngineConfig(max_num_seqs=16),
    )
    by_c = dict(zip(df["concurrency"], df["warnings"]))
    assert by_c[1] == ""
    assert "preempted" in by_c[16]
    text = S.format_sweep(df)
    assert "warnings (points a reader should not trust" in text and "no speculation at C=16:" in text
    assert "C=1:" not in text


def test_method_warnings_keep_the_worst_seed():
    from dsim.study.capacity import method_warnings

    def imbalance(share):
        return {
            "kind": "replica_imbalance",
            "message": f"replica 0 of 8 holds {share:.0%}",
            "value": share * 8,
            "threshold": 1.5,
        }

    results = [
        {"seed": s, "summary": {"requests_completed": 10_000, "warnings": [imbalance(x)]}}
        for s, x in ((0, 0.25), (1, 0.6), (2, 0.3))
    ]
    (w,) = method_warnings(results, parse_sla("p50=20ms"))
    assert w["value"] == pytest.approx(4.8) and w["message"] == "replica 0 of 8 holds 60%"
    assert w["seeds"] == [0, 1, 2]
