"""The server's configuration, carried from the server into a measurement and from there into
`check` (validator.serverconf): what is queried, what is told, what check assumes and refuses."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from cli_contract import run_cli
from dsim.errors import InputError
from validator import compare, measure, serverconf, stepfit


def _profile(tmp_path):
    from dsim.cost import save_profile
    from validator.fitted_profile import linear_profile

    fit = {"cpu_overhead_ms": 1.0, "ms_per_token": 0.2, "ms_per_request": 0.0, "kv_ms_per_ktok": 0.0}
    p = tmp_path / "p.yaml"
    save_profile(linear_profile("t", "measured", fit, {}), p)
    return p


def _run(url, out, *extra, n="8", inp="40", outp="24"):
    rc, _, err = run_cli("validate", "run", "--server", url, "-c", "2", "-n", n, "--input-len", inp,
                         "--output-len", outp, "--repeat", "1", "--no-progress", "--out", out, *extra)  # fmt: skip
    assert rc == 0, err
    return measure.read(str(out / "measurements.jsonl"))


def test_flags_state_the_settings_in_vllms_names():
    f = serverconf.from_flags(
        "/venv/bin/python validator/vllm_entry.py serve m --max-num-seqs 8 --max-num-batched-tokens=512 "
        "--no-enable-prefix-caching --block-size 32 "
        """--speculative-config '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'"""
    )
    assert f == {
        "kind": "vllm-cpu",
        "max_num_seqs": 8,
        "max_num_batched_tokens": 512,
        "block_size": 32,
        "prefix_caching": False,
        "spec_method": "ngram",
        "spec_k": 4,
    }
    # vLLM's dotted form of a JSON argument; the last of two contrary flags wins, as in argparse
    f = serverconf.from_flags(
        "--speculative-config.method eagle3 --speculative-config.num_speculative_tokens=3 "
        "--no-enable-prefix-caching --enable-prefix-caching"
    )
    assert f == {"spec_method": "eagle3", "spec_k": 3, "prefix_caching": True}
    assert serverconf.from_flags(None) == {} and serverconf.from_flags("--port 8000") == {}
    with pytest.raises(InputError, match="--max-num-seqs"):
        serverconf.from_flags("--max-num-seqs eight")
    with pytest.raises(InputError, match="not JSON"):
        serverconf.from_flags("--speculative-config {method:ngram}")


def test_run_records_what_the_server_says_and_what_it_was_told(fake, tmp_path):
    url = fake(spec_k=4, spec_accept=(0.8, 0.6), prefix_caching=True, block_size=16)
    m = _run(url, tmp_path / "a", "--server-flags",
             "--max-num-seqs 8 --no-enable-prefix-caching --speculative-config.method ngram")  # fmt: skip
    eng = m.header["engine"]
    # queried: vLLM by /v1/models, the cache from vllm:cache_config_info, K from the counters
    assert (eng["kind"], eng["prefix_caching"], eng["block_size"], eng["spec_k"]) == ("vllm", True, 16, 4)
    assert eng["version"] == "fake-0"
    # told: what vLLM does not publish
    assert (eng["max_num_seqs"], eng["spec_method"]) == (8, "ngram")
    assert eng["source"] == {
        "kind": "server",
        "prefix_caching": "server",
        "block_size": "server",
        "spec_k": "server",
        "max_num_seqs": "flags",
        "spec_method": "flags",
    }
    # a stale flag the server contradicts is kept, and the server's answer taken
    assert eng["conflicts"] == {"prefix_caching": {"flags": False, "server": True}}
    assert m.header["spec"] == {"k": 4, "method": "ngram"}

    # a server that says nothing of itself: the flags are all there is
    url = fake()
    m = _run(url, tmp_path / "b", "--server-flags", "--max-num-seqs 4 --no-enable-prefix-caching")
    eng = m.header["engine"]
    assert (eng["max_num_seqs"], eng["prefix_caching"]) == (4, False) and "kind" not in eng
    assert eng["source"] == {"max_num_seqs": "flags", "prefix_caching": "flags"}
    # ... and nothing at all without them
    m = _run(url, tmp_path / "c")
    assert m.header["engine"] == {"source": {}, "version": "fake-0"}


def test_check_simulates_the_recorded_configuration_and_prints_it(fake, tmp_path):
    prof = _profile(tmp_path)
    on = _run(fake(prefix_caching=True, block_size=16), tmp_path / "on", "--server-flags", "--max-num-seqs 3")
    rep = compare.check([on.path], str(prof), None, gates={}, sensitivity=False)
    assumed = "\n".join(rep["assumed"])
    assert "16-token blocks (header" in assumed  # the server's cache, simulated
    assert "max_num_seqs: 3 (from the server flags)" in assumed
    assert "max_num_batched_tokens: 2048 (vLLM's CPU default: assumed" in assumed
    assert "speculation: none (no spec-decode counters" in assumed
    rows = {r["metric"]: r for r in rep["rows"]}
    # 40-token prompts on 16-token blocks: two blocks cached once the cache holds the sequence
    assert rows["prefix_cache_hit_rate"]["predicted"] > 0.5
    assert all(f"- assumed: {a}" in compare.to_markdown(rep) for a in rep["assumed"])

    off = _run(fake(prefix_caching=False, block_size=16), tmp_path / "off")
    rep = compare.check([off.path], str(prof), None, gates={}, sensitivity=False)
    assert any(a.startswith("prefix cache: off (header") for a in rep["assumed"])
    assert "prefix_cache_hit_rate" not in {r["metric"] for r in rep["rows"]}


def test_acceptance_for_a_run_without_speculation_is_refused(fake, tmp_path):
    prof = _profile(tmp_path)
    plain = _run(fake(), tmp_path / "plain")
    rc, out, err = run_cli("validate", "check", plain.path, "--profile", prof, "--acceptance", "const:0.7")
    assert rc == 2 and not out
    assert err.strip().count("\n") == 0 and "ran without speculative decoding" in err and "Traceback" not in err

    # a calibration at another K, or of another method, is refused too
    spec = _run(fake(spec_k=4, spec_accept=(0.8, 0.6)), tmp_path / "spec", "--server-flags",
                "--speculative-config.method ngram", outp="40")  # fmt: skip
    rc, _, err = run_cli("validate", "calibrate", spec.path, "--out", tmp_path / "cal")
    assert rc == 0, err
    acc = tmp_path / "cal" / "calibrated-acceptance.yaml"
    import yaml

    doc = yaml.safe_load(acc.read_text())
    assert (doc["k"], doc["method"]) == (4, "ngram")
    for change, msg in ((dict(k=3), "calibrated at K = 3"), (dict(method="eagle3"), "calibrated on method eagle3")):
        bad = tmp_path / f"bad-{msg[-1]}.yaml"
        bad.write_text(yaml.safe_dump(dict(doc, **change)))
        rc, _, err = run_cli("validate", "check", spec.path, "--profile", prof, "--acceptance", bad)
        assert rc == 2 and msg in err and err.strip().count("\n") == 0
    rep = compare.check([spec.path], str(prof), str(acc), gates={}, sensitivity=False)
    assert any(a.startswith("speculation: ngram, K = 4 (vLLM's spec-decode counters") for a in rep["assumed"])


def test_vllm_acceptance_length_is_bounded_by_k_plus_1():
    """The drafted fraction a calibration measured holds for its own output lengths only: at a
    longer output more of a request's steps draft, and converting the simulated tokens per step
    through the calibration's fraction gave an acceptance length above K + 1."""
    K = 4
    pred = {"_spec_k": K, "acceptance_length": 4.0, "_drafted_fraction": 0.64}
    rows = {r["metric"]: r for r in compare.compare({"spec": {"acceptance_length": 4.6}}, pred, {}, {})}
    assert 1 + 3.0 / 0.64 > K + 1  # the old conversion: 5.69
    assert rows["acceptance_length"]["predicted"] == pytest.approx(K + 1)
    # inside the bound the calibrated fraction is used as it is
    pred = {"_spec_k": K, "acceptance_length": 2.5, "_drafted_fraction": 0.5}
    rows = {r["metric"]: r for r in compare.compare({}, pred, {}, {})}
    assert rows["acceptance_length"]["predicted"] == pytest.approx(4.0)


def test_a_draft_scripts_drafted_fraction_follows_the_output_length():
    # 7 undrafted decode steps, then all 4 drafts accepted: a request of n output tokens has
    # 7 + ceil((n - 8) / 5) decode steps, of which all but 7 drafted
    script = ((0, 0),) * 7 + ((4, 4),)
    assert compare.script_drafted_fraction(script, [64]) == pytest.approx(12 / 19)
    assert compare.script_drafted_fraction(script, [128]) == pytest.approx(24 / 31)
    assert compare.script_drafted_fraction(script, [64, 128]) == pytest.approx(36 / 50)
    assert compare.script_drafted_fraction(script, [1]) is None  # no decode step


def test_the_header_block_keeps_unknowns_out():
    eng = serverconf.resolve({"max_num_seqs": None, "kind": "command"}, None, {"kind": "vllm", "spec_k": 0})
    assert eng == {
        "kind": "vllm",
        "spec_k": 0,
        "source": {"kind": "server", "spec_k": "server"},
        "conflicts": {"kind": {"flags": "command", "server": "vllm"}},
    }
    assert serverconf.spec_k({"engine": eng}) == 0 and serverconf.spec_k({}) is None
    assert json.dumps(eng)  # (a header is JSON)


# ---- the speculative machinery's per-step cost, apart from the engine's -----------------------


def _decode_pt(n, b, ms, spec):
    return {"kind": "decode", "n": float(n), "b": float(b), "batch": float(b), "kv": 0.0, "step_ms": ms,
            "spec": float(spec)}  # fmt: skip


def test_fit_separates_the_speculative_machinery_when_runs_without_it_are_fitted_too():
    from validator import stepfit

    c, t, d, spec = 2.8, 0.05, 0.2, 0.8  # ms, ms/token, ms/request, ms per speculative step
    true = lambda n, b, s: c + t * n + d * b + spec * s  # noqa: E731
    with_spec = [_decode_pt(b * (1 + a), b, true(b * (1 + a), b, 1), 1) for b in (1, 2, 4, 8) for a in (0, 3)]
    without = [_decode_pt(b, b, true(b, b, 0), 0) for b in (1, 2, 4, 8)]
    f = stepfit.fit_cost(with_spec + without)
    # (decode points only: the prompt and context terms are left out, warned)
    assert stepfit.SPEC_TERM in f["identified"] and not any(stepfit.SPEC_TERM in w for w in f["warnings"])
    assert (f["cpu_overhead_ms"], f[stepfit.SPEC_TERM]) == pytest.approx((c, spec), rel=1e-6)
    # a speculative server alone: the two are one column; not asked, the overhead holds both
    f = stepfit.fit_cost(with_spec)
    assert stepfit.SPEC_TERM not in f["identified"] and not any(stepfit.SPEC_TERM in w for w in f["warnings"])
    assert f["cpu_overhead_ms"] == pytest.approx(c + spec, rel=1e-6)


def test_the_speculative_step_cost_is_paid_only_with_speculation():
    from dsim.cost import CostModel
    from dsim.spec.methods import make_method
    from validator import stepfit
    from validator.fitted_profile import linear_profile

    fit = {"cpu_overhead_ms": 2.8, "ms_per_token": 0.05, "ms_per_request": 0.2, stepfit.SPEC_TERM: 0.8}
    cm = CostModel(linear_profile("t", "calibrated", fit, {}))
    assert make_method("block", 4).draft_ms(cm, 3) == pytest.approx(0.8 + 0.2 * 3)
    assert make_method("none", 0).draft_ms(cm, 3) == 0.0
    assert cm.profile.cpu_overhead_ms == pytest.approx(2.8)


@pytest.mark.slow
def test_a_calibration_with_and_without_speculation_predicts_both(fake, tmp_path):
    """A fake speculative server whose steps take 6 ms and the same without speculation at 3 ms:
    calibrated on the speculative runs alone, the no-speculation prediction pays the machinery
    (TPOT about twice the measured); calibrated on both, it does not."""
    spec_url = fake(spec_k=4, spec_accept=(0.7, 0.5), step_ms=6.0)
    plain_url = fake(step_ms=3.0)
    runs = []
    for url, tag in ((spec_url, "s"), (plain_url, "p")):
        for c in ("1", "2"):
            rc, _, err = run_cli("validate", "run", "--server", url, "-c", c, "-n", "6", "--input-len", "16",
                                 "--output-len", "40", "--repeat", "1", "--no-progress", "--out",
                                 tmp_path / f"{tag}{c}")  # fmt: skip
            assert rc == 0, err
            runs.append(tmp_path / f"{tag}{c}" / "measurements.jsonl")
    rc, _, err = run_cli("validate", "calibrate", runs[0], runs[1], "--out", tmp_path / "only-spec")
    assert rc == 0, err
    rc, _, err = run_cli("validate", "calibrate", *runs, "--out", tmp_path / "both")
    assert rc == 0, err
    rep = json.loads((tmp_path / "both" / "calibrated-report.json").read_text())
    both = yaml_load(tmp_path / "both" / "calibrated-profile.yaml")
    mach = both["validator"]["spec_machinery"]
    assert mach["separated"] is True and 1.5 < mach["spec_step_ms"] < 4.5, rep
    only = yaml_load(tmp_path / "only-spec" / "calibrated-profile.yaml")
    assert only["validator"]["spec_machinery"] == {"separated": False}
    # the acceptance is the speculative runs' alone (the others' one token a chunk is no drafter's)
    acc_both, acc_only = (yaml_load(tmp_path / d / "calibrated-acceptance.yaml") for d in ("both", "only-spec"))
    for key in ("classes", "by_output_position", "calibrated_output_tokens", "deterministic", "counters"):
        assert acc_both[key] == acc_only[key], key

    def tpot_error(cal, run=3):
        acc = str(tmp_path / cal / "calibrated-acceptance.yaml") if run < 2 else None
        r = compare.check([str(runs[run])], str(tmp_path / cal / "calibrated-profile.yaml"), acc, gates={},
                          sensitivity=False)  # fmt: skip
        return {x["metric"]: x for x in r["rows"]}["tpot_ms.p50"]["error"], r["assumed"]

    err_only, assumed = tpot_error("only-spec")
    assert err_only > 0.5 and any("holds its machinery" in a for a in assumed)
    err_both, assumed = tpot_error("both")
    assert abs(err_both) < 0.25 and any("not paid" in a for a in assumed)
    # ... and the speculative server's still is
    assert abs(tpot_error("both", run=1)[0]) < 0.25

    # the same from a base profile (as profile-server gives one): overhead, scale and the
    # machinery's cost fitted together on the runs
    rc, _, err = run_cli("validate", "calibrate", *runs, "--profile", _profile(tmp_path), "--out", tmp_path / "based")
    assert rc == 0, err
    mach = yaml_load(tmp_path / "based" / "calibrated-profile.yaml")["validator"]["spec_machinery"]
    assert mach["separated"] is True and 1.5 < mach["spec_step_ms"] < 4.5, mach
    err_based, _ = tpot_error("based")
    assert abs(err_based) < 0.25
    # runs of one load of each server (the usual calibration), on a base measured on the
    # speculative server (its overhead holds the machinery): one scale for the whole step and the
    # machinery's cost, not an overhead apart from the scale, which one load does not tell
    rc, _, err = run_cli("validate", "calibrate", runs[0], runs[1], "--out", tmp_path / "spec-base")
    assert rc == 0, err
    rc, _, err = run_cli("validate", "calibrate", runs[1], runs[3], "--profile",
                         tmp_path / "spec-base" / "calibrated-profile.yaml", "--out", tmp_path / "one-load")  # fmt: skip
    assert rc == 0, err
    fit = json.loads((tmp_path / "one-load" / "calibrated-report.json").read_text())["fit"]
    assert fit["how"].startswith("one scale for the whole step and the speculative machinery"), fit
    mach = yaml_load(tmp_path / "one-load" / "calibrated-profile.yaml")["validator"]["spec_machinery"]
    assert mach["separated"] is True and 1.5 < mach["spec_step_ms"] < 4.5, mach
    assert abs(tpot_error("one-load")[0]) < 0.25 and abs(tpot_error("one-load", run=1)[0]) < 0.25


def test_one_scale_and_the_machinery_cost_in_closed_form():
    """measured = s (base step with its overhead) - m for a server without speculation: points of
    both servers at one load give s and m back."""
    from validator.calibrate import _fit_one_scale_with_spec

    x = np.array([4.0, 4.5, 6.0, 4.0, 4.4, 6.1])  # the base profile's steps, overhead included
    spec = np.array([1, 1, 1, 0, 0, 0], float)
    y = 1.1 * x - 0.7 * (1 - spec)
    assert _fit_one_scale_with_spec(x, y, spec) == pytest.approx((1.1, 0.7), rel=1e-9)
    # a speculative server alone: no machinery told apart, one scale
    assert _fit_one_scale_with_spec(x[:3], y[:3], spec[:3]) == pytest.approx((1.1, 0.0), abs=1e-9)


def yaml_load(path):
    import yaml

    return yaml.safe_load(open(path))


# ---- profile-server in rounds -------------------------------------------------------------------


@pytest.mark.slow
def test_profile_server_measures_interleaved_rounds_after_a_discarded_warmup(fake, tmp_path):
    url = fake(step_ms=2.0)
    rc, out, err = run_cli("validate", "profile-server", "--server", url, "-c", "1", "-c", "2", "--shape", "32:8",
                           "--input-len", "16", "--output-len", "16", "--rounds", "3", "--warmup-rounds", "1",
                           "--keep", tmp_path / "keep", "--out", tmp_path / "p.yaml")  # fmt: skip
    assert rc == 0, err
    heads = [measure.read(str(f)).header for f in sorted((tmp_path / "keep").glob("*.jsonl"))]
    assert len(heads) == 4 * 3  # three points, one warm-up round and three measured
    order = sorted(heads, key=lambda h: h["profile_sequence"])
    # round by round (the warm-up first), every point once a round, the order rotated
    assert [h["profile_round"] for h in order] == [None] * 3 + [1] * 3 + [2] * 3 + [3] * 3
    firsts = [order[i]["profile_level"] for i in (3, 6, 9)]
    assert len(set(firsts)) == 3
    prof = yaml_load(tmp_path / "p.yaml")
    v = prof["validator"]
    # the profile is made of the measured rounds only
    assert all("warmup" not in f for f in v["levels"]) and len(v["levels"]) == 9
    fit = v["fit"]
    assert fit["intervals"] and set(fit["intervals"]) == set(fit["identified"])
    for term, iv in fit["intervals"].items():
        assert iv["low"] <= fit[term] <= iv["high"] and len(iv["rounds"]) == 3
        assert f"  {term} " in out and "95% interval" in out
    assert "(intervals: the noise within this call's rounds;" in out
    rc, _, err = run_cli("validate", "profile-server", "--server", url, "--rounds", "0", "--out", tmp_path / "q.yaml")
    assert rc == 2 and "--rounds" in err and not (tmp_path / "q.yaml").exists()


def test_term_intervals_come_from_the_rounds_fitted_apart():
    from validator import stepfit

    rng = np.random.default_rng(3)
    # overhead 3 ms and 0.05 ms a token, each round's machine speed off by a few percent
    rounds = []
    for _ in range(5):
        s = 1 + 0.05 * rng.standard_normal()
        rounds.append([_decode_pt(n, 1, s * (3.0 + 0.05 * n), 0) for n in (1, 16, 64, 256)])
    f = stepfit.fit_cost([p for r in rounds for p in r], ("cpu_overhead_ms", "ms_per_token"), rounds=rounds)
    iv = f["intervals"]
    assert set(iv) == {"cpu_overhead_ms", "ms_per_token"}
    per = np.array(iv["ms_per_token"]["rounds"])
    half = stepfit.noise_t(5) * per.std(ddof=1) / np.sqrt(5)
    assert (iv["ms_per_token"]["low"], iv["ms_per_token"]["high"]) == pytest.approx(
        (f["ms_per_token"] - half, f["ms_per_token"] + half), abs=1e-5
    )
    assert iv["ms_per_token"]["low"] < 0.05 < iv["ms_per_token"]["high"]
    # one round: no interval is claimed
    assert stepfit.fit_cost(rounds[0], ("cpu_overhead_ms", "ms_per_token"))["intervals"] == {}


def test_bad_server_flags_are_refused_before_anything_runs(tmp_path):
    rc, out, err = run_cli("validate", "run", "--server", "http://127.0.0.1:9", "-c", "1", "-n", "2", "--input-len",
                           "8", "--output-len", "8", "--server-flags", "--max-num-seqs eight", "--out",
                           tmp_path / "r")  # fmt: skip
    assert rc == 2 and "--max-num-seqs must be an integer" in err and err.strip().count("\n") == 0
    assert not (tmp_path / "r").exists()


def test_a_pinned_term_is_held_and_the_others_fitted_around_it():
    from validator import stepfit

    # a concurrency sweep at one shape: tokens, requests and context move together, so the fit
    # cannot tell the request term from the token term; pinned at its known value, it need not
    c, t, d = 3.0, 0.05, 0.4
    pts = [_decode_pt(5 * b, b, c + t * 5 * b + d * b, 1) for b in (1, 2, 4, 8)]
    free = stepfit.fit_cost(pts, ("cpu_overhead_ms", "ms_per_token", "ms_per_request"))
    assert "ms_per_request" in free["not_identified"]
    f = stepfit.fit_cost(pts, ("cpu_overhead_ms", "ms_per_token", "ms_per_request"), pinned={"ms_per_request": d})
    assert f["pinned"] == {"ms_per_request": d} and f["ms_per_request"] == d
    assert "ms_per_request" not in f["identified"] + f["not_identified"]
    assert (f["cpu_overhead_ms"], f["ms_per_token"]) == pytest.approx((c, t), rel=1e-6)
    assert f["determined"] and max(abs(r) for r in f["residuals"]) < 1e-9
    assert stepfit.parse_pins(["kv_ms_per_ktok=0", "ms_per_request=0.4"]) == {
        "kv_ms_per_ktok": 0.0,
        "ms_per_request": 0.4,
    }
    for bad, msg in (("nope=1", "unknown term"), ("kv_ms_per_ktok=x", "a number"), ("kv_ms_per_ktok=-1", ">= 0")):
        with pytest.raises(InputError, match=msg):
            stepfit.parse_pins([bad])


def test_profile_server_pins_a_term(fake, tmp_path):
    url = fake(step_ms=2.0)
    rc, out, err = run_cli("validate", "profile-server", "--server", url, "-c", "1", "-c", "2", "--input-len", "16",
                           "--output-len", "16", "--rounds", "3", "--warmup-rounds", "0", "--pin", "ms_per_request=0.25",
                           "--out", tmp_path / "p.yaml")  # fmt: skip
    assert rc == 0, err
    fit = yaml_load(tmp_path / "p.yaml")["validator"]["fit"]
    assert fit["pinned"] == {"ms_per_request": 0.25} and fit["ms_per_request"] == 0.25
    assert "  ms_per_request 0.25 (pinned)" in out
    rc, _, err = run_cli(
        "validate", "profile-server", "--server", url, "--pin", "ms_per_x=1", "--out", tmp_path / "q.yaml"
    )
    assert rc == 2 and "unknown term" in err and not (tmp_path / "q.yaml").exists()


def test_identical_calls_give_one_term_set_when_a_term_is_zero_within_the_noise():
    """A concurrency sweep whose request column stands 0.05-0.07 apart from the others (its
    separation moves with the noisy step times' weights) and a true request cost of 0, measured by
    identical calls of 3 rounds each on a machine whose speed moves +-15% between rounds. Before,
    the calls disagreed: the request term identified with an interval from 0, or 0 within the
    noise, or the per-token term dropped in its place. Now a term whose interval reaches 0 is 0
    within the noise in every call, reported with its upper bound, and the identified terms'
    intervals of any two calls overlap."""
    from validator import stepfit

    terms = ("cpu_overhead_ms", "ms_per_token", "ms_per_request")
    drafted = [(b * (1 + a), b) for b, a in ((1, 3.6), (2, 3.5), (4, 3.2), (8, 3.0))]
    for offset in (1.5, 2.0):
        shapes = drafted + [(n + offset, b) for n, b in drafted]
        fits = []
        for seed in range(20):
            rng = np.random.default_rng(seed)
            rounds = []
            for _ in range(3):
                s = 1 + rng.uniform(-0.15, 0.15)
                rounds.append(
                    [_decode_pt(n, b, (3.0 + 0.08 * n) * s * (1 + rng.uniform(-0.05, 0.05)), 0) for n, b in shapes]
                )
            fits.append(stepfit.fit_cost([p for r in rounds for p in r], terms, rounds=rounds))
        for f in fits:
            assert f["identified"] == ["cpu_overhead_ms", "ms_per_token"] and not f["not_identified"], f["warnings"]
            zero = f["zero_within_noise"]["ms_per_request"]
            assert f["ms_per_request"] == 0.0 and zero["upper"] >= zero["pooled"] >= 0 and f["determined"]
            assert any("at most" in w for w in f["warnings"])
        for a in fits[:5]:
            for b in fits[:5]:
                for t in a["intervals"]:
                    ia, ib = a["intervals"][t], b["intervals"][t]
                    assert ia["low"] <= ib["high"] and ib["low"] <= ia["high"], (offset, t, ia, ib)


def test_a_term_at_the_bound_in_every_round_states_the_rounds_unbounded_noise():
    """A request term whose unbounded estimate is below 0 in each of three noiseless rounds
    (-0.01, -0.03, -0.02 ms): every round's NNLS puts it at 0, so the NNLS rounds agree exactly, but
    the rounds do move; its stated upper bound is that movement's, t(2) standard errors of the
    unbounded estimates (4.303 x 0.01 / sqrt 3 = 0.0248 ms), not 0. (An identical call that found
    the term at 0.003-0.14 ms disagreed with an interval 0-0 before.) Which terms are 0 within the
    noise is decided as before."""
    c, t = 3.0, 0.05
    shapes = [(n, b) for b in (1, 2, 4, 8) for n in (b, 4 * b)]
    d_rounds = (-0.01, -0.03, -0.02)
    rounds = [[_decode_pt(n, b, c + t * n + d * b, 0) for n, b in shapes] for d in d_rounds]
    terms = ("cpu_overhead_ms", "ms_per_token", "ms_per_request")
    f = stepfit.fit_cost([p for r in rounds for p in r], terms, rounds=rounds)
    zero = f["zero_within_noise"]["ms_per_request"]
    assert zero["rounds"] == [0.0, 0.0, 0.0] and zero["standard_error"] == 0.0
    half = stepfit.noise_t(3) * np.std(d_rounds, ddof=1) / np.sqrt(3)
    assert zero["upper"] == pytest.approx(half, abs=1e-5) and 0.024 < half < 0.025
    assert f"at most {half:.3g} within the noise" in " ".join(f["warnings"])
    # the kept terms' rounds move with the request term's (the overhead and the per-token price
    # take its work) and none sits at the bound: their intervals are their rounds' as before
    assert f["identified"] == ["cpu_overhead_ms", "ms_per_token"]
    for term, iv in f["intervals"].items():
        per = np.array(iv["rounds"])
        assert per.min() > 0 and per.std() > 0
        half_kept = stepfit.noise_t(3) * per.std(ddof=1) / np.sqrt(3)
        assert (iv["low"], iv["high"]) == pytest.approx((f[term] - half_kept, f[term] + half_kept), abs=1e-5)
    # the agreement with a call that told the term from 0, 0.003-0.14 ms: the intervals overlap
    from validator import agreement

    told = {"intervals": {"ms_per_request": {"low": 0.003, "high": 0.14}}, "zero_within_noise": {}}
    assert agreement.interval(f, "ms_per_request") == (0.0, zero["upper"])
    assert agreement.agreement([f, told])["terms"]["ms_per_request"]["overlapping"] == 1


# ---- a front end whose time grows with the load --------------------------------------------------


@pytest.fixture
def _fake_process():
    """A fake server as its own process (its threads do not share the test client's interpreter:
    in one process the client's and the server's Python work queue behind each other, a front
    end of their own that grows with the streams): _fake_process(tmp_path, *options) -> URL."""
    import subprocess
    import sys

    from tests.conftest import free_port
    from validator import server as srv

    procs = []

    def start(tmp_path, *options):
        port = free_port()
        argv = [sys.executable, "-m", "validator.fake_server", "--port", str(port), *options]
        proc = subprocess.Popen(argv, cwd=Path(__file__).resolve().parents[1], start_new_session=True)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        srv.wait_health(url, 20, proc)
        return url

    yield start
    for p in procs:
        srv.stop(p)


@pytest.mark.slow
def test_a_front_end_that_grows_with_the_load_is_fitted_and_predicted_at_c1_and_c8(_fake_process, tmp_path):
    """A fake API server that spends 10 ms + 8 ms per other stream in flight on each request
    before its engine part (10 ms steps, one request each, outside the latency histograms it
    publishes): the client's first token comes about 10 + 8 (C - 1) ms after the server's clock
    says (plus the client's and the HTTP stack's own time). Calibrated on C=2 and C=4, the front
    end is a line of about 8 ms per request, and `check` at C=1 and C=8 (held out) predicts mean
    TTFT within 15% (-2..+7% and -2..-4% measured), where the one-request overhead of before, a
    constant, missed C=8's by more than 30% (-50% measured)."""
    from validator import calibrate

    url = _fake_process(tmp_path, "--step-ms", "10", "--front-end-ms", "10", "--front-end-ms-per-stream", "8")
    runs = {}
    for c in (1, 2, 4, 8):
        rc, _, err = run_cli("validate", "run", "--server", url, "-c", str(c), "-n", str(max(3 * c, 6)),
                             "--input-len", "16", "--output-len", "8", "--repeat", "1", "--no-progress",
                             "--out", tmp_path / f"c{c}")  # fmt: skip
        assert rc == 0, err
        runs[c] = str(tmp_path / f"c{c}" / "measurements.jsonl")
    pts = calibrate.front_end_points([measure.read(runs[c]) for c in (1, 2, 4, 8)])
    for p, c in zip(pts, (1, 2, 4, 8)):  # at least what the fake spends, as the client sees it
        assert p["ttft_ms"] > 0.8 * (10.0 + 8.0 * (p["streams"] - 1)), (c, p)
    rc, _, err = run_cli("validate", "calibrate", runs[2], runs[4], "--out", tmp_path / "cal")
    assert rc == 0, err
    prof = tmp_path / "cal" / "calibrated-profile.yaml"
    fe = yaml_load(prof)["validator"]["front_end"]
    # (5.8-6.1 measured: a request finds fewer streams at the fake on arrival than the client's
    # mean in flight, the line's abscissa, counts)
    assert 4.0 < fe["ttft_ms_per_request"] < 12.0 and 4.0 < fe["e2e_ms_per_request"] < 12.0, fe
    assert "2.0-4.0 requests in flight" in fe["per_request_from"]
    # without the line (the profile's front end taken out: the one-request overhead, a constant)
    doc = yaml_load(prof)
    del doc["validator"]["front_end"]
    (tmp_path / "constant.yaml").write_text(__import__("yaml").safe_dump(doc))
    for c in (1, 8):
        rep = compare.check([runs[c]], str(prof), None, gates={}, sensitivity=False)
        err = {r["metric"]: r for r in rep["rows"]}["ttft_ms.mean"]["error"]
        assert any(a.startswith("front end: ") for a in rep["assumed"])
        before = compare.check([runs[c]], str(tmp_path / "constant.yaml"), None, gates={}, sensitivity=False)
        err_before = {r["metric"]: r for r in before["rows"]}["ttft_ms.mean"]["error"]
        assert abs(err) < 0.15, (c, err, fe, rep["assumed"])
        if c == 8:
            assert err_before < -0.3 and abs(err) < abs(err_before), (err, err_before)


def test_the_front_end_fit_and_the_simulated_front_end_in_closed_form():
    """front_end_fit on points of a line gives the line (pre-engine time added to both
    intercepts; one load: slope 0, said); dsim's FrontEnd adds a + b (n - 1) to each request's
    TTFT and E2E at the requests in flight (a closed loop: its concurrency) and puts the E2E part
    into the closed loop's way back, so the cycle and throughput follow."""
    from dsim.sim import FrontEnd, SimConfig, in_flight_at_arrival, simulate
    from validator import calibrate, stepfit, traces
    from validator.fitted_profile import linear_profile

    pts = [{"streams": s, "ttft_ms": 5.0 + 2.0 * (s - 1), "e2e_ms": 6.0 + 2.5 * (s - 1),
            "pre_engine_ms": 1.0 if s == 1 else 3.0} for s in (1, 2, 4, 8)]  # fmt: skip
    f = calibrate.front_end_fit(pts)
    assert (f["ttft_ms"], f["ttft_ms_per_request"], f["e2e_ms"], f["e2e_ms_per_request"]) == pytest.approx(
        (6.0, 2.0, 7.0, 2.5), abs=1e-6
    )
    assert f["pre_engine_ms"] == 1.0
    one = calibrate.front_end_fit(pts[1:2])
    assert one["ttft_ms_per_request"] == 0.0 and one["ttft_ms"] == pytest.approx(7.0 + 3.0) and "one load" in one[
        "per_request_from"]  # fmt: skip
    assert calibrate.front_end_fit([]) is None

    # (in flight at arrival, itself included; a request that never finished stays in)
    a, fin = np.array([0.0, 0.0, 1.0, 2.0, 2.5]), np.array([1.5, 3.0, 2.0, np.nan, 2.6])
    assert list(in_flight_at_arrival(a, fin)) == [2, 2, 3, 2, 3]  # (one finishing at an arrival is out)

    # a flat 10 ms step, one request at a time (C=1) and four (C=4), 5 output tokens each
    fit = dict.fromkeys(stepfit.ALL_TERMS, 0.0) | {"cpu_overhead_ms": 10.0}
    prof = linear_profile("flat", "measured", fit, {})
    fe = FrontEnd(ttft_ms=4.0, ttft_ms_per_request=3.0, e2e_ms=6.0, e2e_ms_per_request=2.0)
    for c in (1, 4):
        w = traces.to_workload(traces.fixed(4 * c, 8, 5), c)
        bare = simulate(SimConfig(workload=w, profile=prof, gpus_per_node=1))
        res = simulate(SimConfig(workload=w, profile=prof, gpus_per_node=1, front_end=fe))
        rq = res.requests
        assert (rq["client_ttft_ms"] - rq["ttft_ms"]).to_numpy() == pytest.approx(4.0 + 3.0 * (c - 1))
        assert (rq["client_e2e_ms"] - rq["e2e_ms"]).to_numpy() == pytest.approx(6.0 + 2.0 * (c - 1))
        assert res.summary["client_ttft_ms"]["mean"] == pytest.approx(rq["client_ttft_ms"].mean(), abs=1e-3)
        # the loop's cycle holds the way back: each user's requests 5 steps + the E2E part apart
        assert res.summary["sim_time_s"] == pytest.approx(
            bare.summary["sim_time_s"] + 3 * (6.0 + 2.0 * (c - 1)) / 1e3, rel=1e-6
        )
    with pytest.raises(InputError, match="front_end.ttft_ms"):
        simulate(SimConfig(workload=w, profile=prof, gpus_per_node=1, front_end=FrontEnd(ttft_ms=float("nan"))))


def test_a_waves_successors_reach_the_engine_the_way_in_queue_apart():
    """A closed loop's wave (the successors the client sends back to back) reaches the engine one
    request after another, the API server's way-in queue per request ahead apart (closed form):
    the requests ahead in a wave counted from the client's sends (a wave's sends closer than half
    a step), the gap fitted through 0 on the runs whose waves are long enough, scaled per streamed
    event for the plain server as the slope is; with a front end dsim spaces a wave's successors
    that far apart around the front end's way back (the wave's mean way back is the front end's),
    and check uses the gap of the measured server. A run's first wave, sent back to back at its
    start, reaches the engine the same gap apart."""
    from dsim.sim import FrontEnd, SimConfig, simulate
    from validator import calibrate, stepfit, traces
    from validator.compare import arrival_gap_of
    from validator.fitted_profile import linear_profile

    def run(sends_ms, mode="concurrency"):
        reqs = [{"send_s": t / 1e3} for t in sends_ms]
        return measure.Measurement("mem", {"format": measure.FORMAT, "load": {"mode": mode}}, reqs)

    # waves of 3, 1 and 2 (sends 0.05 ms apart inside a wave, 4 ms apart between): 3 + 0 + 1 ahead
    sends = [0.0, 0.05, 0.1, 4.1, 8.0, 8.05]
    assert calibrate.wave_position(run(sends), 4.0) == pytest.approx(4 / 6)
    assert calibrate.wave_position(run(sends), 9.0) == pytest.approx((0 + 1 + 2 + 3 + 4 + 5) / 6)  # (one wave)
    assert calibrate.wave_position(run(sends, mode="rate"), 4.0) == 0.0  # (an open loop has no waves)

    # the way-in queue beyond the lowest load's and half a running step: 3 ms per request ahead
    def pt(s, pos, spec=True, step=4.0, g=3.0):
        busy = min(s - 1, 1)
        return {"streams": s, "ttft_ms": 5.0 + 2.0 * (s - 1), "e2e_ms": 6.0 + 2.5 * (s - 1), "speculative": spec,
                "pre_engine_ms": 1.0 + 0.5 * step * busy + g * pos, "step_ms": step, "wave_position": pos}  # fmt: skip

    pts = [pt(1, 0.0), pt(2, 0.2), pt(4, 0.9), pt(8, 2.1)]
    f = calibrate.front_end_fit(pts)
    assert f["arrival_gap_ms"] == pytest.approx(3.0, abs=1e-6)
    # (C=2's 0.2 requests ahead are under MIN_WAVE_POSITION: its queue, off the line here, is left out)
    assert calibrate.front_end_fit(pts[:1] + [pt(2, 0.2, g=30.0)] + pts[2:])["arrival_gap_ms"] == pytest.approx(3.0)
    assert "arrival_gap_ms" not in calibrate.front_end_fit(pts[:2])  # (no wave long enough)
    # a plain server whose steps are 2/3 of the speculative one's: 1.5 times the events, the gap
    pts2 = pts + [pt(2, 0.2, spec=False, step=8 / 3, g=4.5)] * 2
    pts2[1] = dict(pts2[1], step_ms=4.0)
    f2 = calibrate.front_end_fit(pts2)
    by = f2["by_speculation"]
    assert by["speculative"]["arrival_gap_ms"] == pytest.approx(3.0, abs=1e-6)
    assert by["none"]["arrival_gap_ms"] == pytest.approx(4.5, abs=1e-6)
    assert arrival_gap_of({"front_end": f2}, speculative=False) == pytest.approx(4.5)
    # a profile fitted before the gap: the client's send gap
    assert arrival_gap_of({"front_end": {}, "closed_loop_send_gap_ms": 0.04}, speculative=True) == 0.04

    # dsim: a 10 ms step, 3 output tokens. The first wave reaches the engine 0, 3, 6 and 9 ms
    # after the start: the first prefills alone (0-10 ms) and finishes at 30 ms, the other three
    # prefill together (10-20 ms) and finish at 40 ms. The lone one's successor comes back the
    # front end's E2E at four (20 ms) later; the wave of three 20 ms +- 3 ms later, in turn.
    fit = dict.fromkeys(stepfit.ALL_TERMS, 0.0) | {"cpu_overhead_ms": 10.0}
    prof = linear_profile("flat", "measured", fit, {})
    fe = FrontEnd(ttft_ms=5.0, e2e_ms=20.0)
    w = traces.to_workload(traces.fixed(8, 8, 3), 4)
    res = simulate(SimConfig(workload=w, profile=prof, gpus_per_node=1, front_end=fe, closed_loop_send_gap_ms=3.0))
    rq = res.requests.sort_values("arrival_s")
    assert rq.arrival_s.to_numpy()[:4] * 1e3 == pytest.approx([0.0, 3.0, 6.0, 9.0], abs=1e-6)
    assert rq.eval("arrival_s + e2e_ms / 1000").to_numpy()[:4] * 1e3 == pytest.approx([30, 40, 40, 40], abs=1e-6)
    assert rq.arrival_s.to_numpy()[4:] * 1e3 == pytest.approx([50.0, 57.0, 60.0, 63.0], abs=1e-6)
    # a gap larger than the way back allows: none earlier than the completion
    res = simulate(SimConfig(workload=w, profile=prof, gpus_per_node=1, front_end=fe, closed_loop_send_gap_ms=20.0))
    rq = res.requests.sort_values("request")
    # (the first wave at 0, 20, 40 and 60 ms; the first finishes alone at 30 ms, its successor 20 ms on)
    assert rq.arrival_s.to_numpy()[:5] * 1e3 == pytest.approx([0.0, 20.0, 40.0, 60.0, 50.0], abs=1e-6)
    fin = rq.eval("arrival_s + e2e_ms / 1000").to_numpy()
    assert np.all(rq.arrival_s.to_numpy()[4:] >= np.sort(fin[:4]) - 1e-12)


def test_an_open_loop_gets_its_own_front_end_line():
    """Open-loop runs are points of their own line (closed form): through them and the same
    server's closed-loop runs at its lowest load (one request: no wave to queue behind), apart
    from the closed loop's line, whose waves queue on the way in; check takes it for an open
    loop of that server, the closed loop's line otherwise."""
    from validator import calibrate

    def pt(s, a, b, open_loop=False, spec=True):
        return {"streams": s, "ttft_ms": a + b * (s - 1), "e2e_ms": a + 1.0 + 1.25 * b * (s - 1),
                "pre_engine_ms": 1.0, "speculative": spec, "open_loop": open_loop}  # fmt: skip

    closed = [pt(s, 5.0, 2.0) for s in (1, 2, 4, 8)]
    opened = [pt(s, 5.0, 1.0, open_loop=True) for s in (3.0, 3.4)]
    f = calibrate.front_end_fit(closed + opened)
    assert (f["ttft_ms"], f["ttft_ms_per_request"]) == pytest.approx((6.0, 2.0), abs=1e-6)  # (unmoved)
    line = f["open_loop"]
    assert (line["ttft_ms"], line["ttft_ms_per_request"], line["e2e_ms"], line["e2e_ms_per_request"]) == pytest.approx(
        (6.0, 1.0, 7.0, 1.25), abs=1e-6
    )
    assert line["speculative"] is True and "2 open-loop runs at 3.0-3.4" in line["from"]
    assert sum(p.get("open_loop", False) for p in f["points"]) == 2  # (kept for calibrate's refit)
    assert calibrate.front_end_fit(f["points"])["open_loop"] == line
    v = {"front_end": f}
    assert compare.front_end_of(v, True, open_loop=True).ttft_ms_per_request == pytest.approx(1.0)
    assert compare.front_end_of(v, True).ttft_ms_per_request == pytest.approx(2.0)
    assert compare.front_end_of(v, False, open_loop=True).ttft_ms_per_request == pytest.approx(2.0)  # (another server)
    # open-loop runs at the lowest load only tell no line
    assert "open_loop" not in calibrate.front_end_fit(closed + [pt(1.2, 5.0, 1.0, open_loop=True)])
    assert calibrate.front_end_fit(opened) is None  # (no closed-loop line to stand beside)


def test_pooled_closed_loop_runs_each_start_with_their_whole_first_wave():
    """Runs of a closed loop pooled for one check (heldout's rounds) are simulated run by run:
    each began with its users' whole first wave, so a run's requests wait for the run before it
    to finish (closed form, a flat 10 ms step, at once: two users, outputs 2, 5, 2, 2 | 2, 2).
    The user with 5 tokens finishes at 50 ms with the run's last request sent: its successor is
    the next run's, which starts with both users when the run's last request ends at 60 ms; in
    one loop over all six it would have come at 50 ms."""
    from dsim.sim import SimConfig, simulate
    from validator import stepfit, traces
    from validator.compare import workload_from
    from validator.fitted_profile import linear_profile

    prof = linear_profile("flat", "measured", dict.fromkeys(stepfit.ALL_TERMS, 0.0) | {"cpu_overhead_ms": 10.0}, {})
    plan = traces.Plan(np.zeros(6), np.full(6, 8), np.array([2, 5, 2, 2, 2, 2]), "fixed")
    one = traces.to_workload(plan, 2)
    runs = dataclasses.replace(one, closed_loop_run_starts=(4,))

    def arrivals_ms(w):
        rq = simulate(SimConfig(workload=w, profile=prof, gpus_per_node=1)).requests.sort_values("request")
        return list(np.round(rq.arrival_s.to_numpy() * 1e3, 6))

    assert arrivals_ms(one) == [0.0, 0.0, 20.0, 40.0, 50.0, 60.0]
    assert arrivals_ms(runs) == [0.0, 0.0, 20.0, 40.0, 60.0, 60.0]
    with pytest.raises(ValueError, match="closed_loop_run_starts"):
        dataclasses.replace(one, closed_loop_run_starts=(6,))
    with pytest.raises(ValueError, match="closed_loop_run_starts"):
        dataclasses.replace(one, closed_loop_concurrency=None, closed_loop_run_starts=(2,))
    assert one.head(3).closed_loop_run_starts == () and runs.head(5).closed_loop_run_starts == (4,)

    # check's workload: pooled measured runs of a closed loop restart where each run began
    def run(n):
        reqs = [{"i": i, "send_s": 0.001 * i, "end_s": 0.01 + 0.001 * i, "prompt_tokens": 8, "output_tokens": 2,
                 "ok": True} for i in range(n)]  # fmt: skip
        return measure.Measurement(
            "mem", {"format": measure.FORMAT, "load": {"mode": "concurrency", "concurrency": 2}}, reqs
        )

    w, conc = workload_from(measure.pool([run(4), run(3), run(5)]))
    assert conc == 2 and w.closed_loop_run_starts == (4, 7) and len(w) == 12
    assert workload_from(run(4))[0].closed_loop_run_starts == ()


def test_the_front_end_slope_is_shared_per_streamed_event():
    """One SSE event per stream and engine step: a plain server whose steps are 2.6 ms against the
    speculative server's 3.3 ms (vllm-cpu at two requests) costs the other requests 3.3 / 2.6
    times as much per stream. Points on those lines (closed form) give back the plain server's
    slope from its runs at one load, and check predicts its eight-stream front end."""
    from validator import calibrate
    from validator.compare import front_end_of

    def pt(s, spec, a, slope, step):
        return {"streams": s, "ttft_ms": a + slope * (s - 1), "e2e_ms": a + 1.0 + 2 * slope * (s - 1),
                "pre_engine_ms": 2.0, "speculative": spec, "step_ms": step}  # fmt: skip

    ratio = 3.3 / 2.6
    pts = [pt(s, True, 3.0, 1.5, st) for s, st in ((1, 3.1), (2, 3.3), (4, 3.5), (8, 4.0))]
    pts += [pt(2, False, 3.5, 1.5 * ratio, 2.6)] * 2
    f = calibrate.front_end_fit(pts)
    none, spec = f["by_speculation"]["none"], f["by_speculation"]["speculative"]
    assert (spec["ttft_ms_per_request"], spec["e2e_ms_per_request"]) == pytest.approx((1.5, 3.0), abs=1e-6)
    assert (none["ttft_ms_per_request"], none["e2e_ms_per_request"]) == pytest.approx(
        (1.5 * ratio, 3 * ratio), abs=1e-4
    )
    assert (none["ttft_ms"], spec["ttft_ms"]) == pytest.approx((5.5, 5.0), abs=1e-6)  # (+ the 2 ms before the engine)
    plain = front_end_of({"front_end": f}, speculative=False)
    assert plain.ttft_at(8) == pytest.approx(5.5 + 7 * 1.5 * ratio, abs=1e-3)
    # without a load both servers were measured at, one slope per request as before
    g = calibrate.front_end_fit(pts[:4] + [dict(pts[4], streams=3.0)] * 2)
    assert (
        g["by_speculation"]["none"]["ttft_ms_per_request"] == g["by_speculation"]["speculative"]["ttft_ms_per_request"]
    )


def test_each_server_measured_at_two_loads_gets_its_own_front_end_slope():
    """Points of a speculative server and of a plain one, each at two loads or more, on lines of
    their own (closed form): each server's own intercept and slope come back, whatever the ratio
    of their steps (which would have scaled the plain slope by 2 here), and each server's own
    arrival gap where its waves tell one; the plain server at one load: the slope shared per
    streamed event as before."""
    from validator import calibrate
    from validator.compare import arrival_gap_of, front_end_of

    # (client minus server times that, with the way-in queue g x pos added, lie on the line)
    def pt(s, spec, a, slope, step, pos=0.0, g=0.0):
        return {"streams": s, "ttft_ms": a + slope * (s - 1) - g * pos, "e2e_ms": a + 1.0 + slope * (s - 1) - g * pos,
                "pre_engine_ms": 2.0 + 0.5 * step * min(s - 1, 1) + g * pos, "speculative": spec,
                "step_ms": step, "wave_position": pos}  # fmt: skip

    spec = [pt(s, True, 4.0, 3.0, 4.0, pos, 3.0) for s, pos in ((1, 0.0), (2, 0.2), (4, 0.9), (8, 2.0))]
    plain = [pt(s, False, 3.0, 2.0, 2.0, pos, 4.0) for s, pos in ((1, 0.0), (2, 0.2), (4, 0.8))]
    f = calibrate.front_end_fit(spec + plain)
    by = f["by_speculation"]
    assert (by["speculative"]["ttft_ms"], by["speculative"]["ttft_ms_per_request"]) == pytest.approx((6.0, 3.0))
    assert (by["none"]["ttft_ms"], by["none"]["ttft_ms_per_request"]) == pytest.approx((5.0, 2.0))
    assert by["none"]["e2e_ms_per_request"] == pytest.approx(2.0) and "own intercept and slope" in f["per_request_from"]
    assert arrival_gap_of({"front_end": f}, speculative=False) == pytest.approx(4.0)
    assert arrival_gap_of({"front_end": f}, speculative=True) == pytest.approx(3.0)
    assert front_end_of({"front_end": f}, speculative=False).ttft_at(8) == pytest.approx(5.0 + 7 * 2.0)
    # the plain server at one load: its slope is the speculative one's per streamed event
    one = calibrate.front_end_fit(spec + plain[1:2])
    sl = {k: v["ttft_ms_per_request"] for k, v in one["by_speculation"].items()}
    assert sl["none"] == pytest.approx(sl["speculative"] * 4.0 / 2.0, rel=1e-3)  # (steps 4 and 2 ms)
    assert "one slope per streamed event" in one["per_request_from"]


def test_a_speculative_and_a_plain_servers_front_end_share_the_slope_and_keep_their_intercepts():
    """Points of two server configurations on lines of one slope and two intercepts give those
    back (closed form); the plain server's runs at one load alone are placed by the shared slope;
    the check takes the intercepts of the measured server's configuration; one configuration
    fits as before (no ``by_speculation``)."""
    from validator import calibrate
    from validator.compare import front_end_of

    def pt(s, spec, a):
        return {"streams": s, "ttft_ms": a + 1.5 * (s - 1), "e2e_ms": a + 1.0 + 2.0 * (s - 1),
                "pre_engine_ms": 2.0, "speculative": spec}  # fmt: skip

    pts = [pt(s, True, 4.0) for s in (1, 2, 4, 8)] + [pt(2, False, 7.0), pt(2, False, 7.0)]
    f = calibrate.front_end_fit(pts)
    assert (f["ttft_ms"], f["ttft_ms_per_request"], f["e2e_ms"], f["e2e_ms_per_request"]) == pytest.approx(
        (6.0, 1.5, 7.0, 2.0), abs=1e-6
    )
    both = {"ttft_ms_per_request": 1.5, "e2e_ms_per_request": 2.0}  # (no steps measured: one slope)
    assert f["by_speculation"]["speculative"] == pytest.approx({"ttft_ms": 6.0, "e2e_ms": 7.0, **both}, abs=1e-6)
    assert f["by_speculation"]["none"] == pytest.approx({"ttft_ms": 9.0, "e2e_ms": 10.0, **both}, abs=1e-6)
    v = {"front_end": f}
    plain, spec = front_end_of(v, speculative=False), front_end_of(v, speculative=True)
    assert (plain.ttft_ms, plain.ttft_ms_per_request, plain.e2e_ms) == pytest.approx((9.0, 1.5, 10.0))
    assert (spec.ttft_ms, spec.e2e_ms, spec.e2e_ms_per_request) == pytest.approx((6.0, 7.0, 2.0))
    # a point without the flag is of the server the caller names
    g = calibrate.front_end_fit([dict(p, speculative=None) for p in pts[:4]] + pts[4:], speculative=True)
    assert g["by_speculation"] == f["by_speculation"]
    # one configuration: no per-configuration intercepts, the same fit as without flags
    one = calibrate.front_end_fit(pts[:4])
    assert "by_speculation" not in one
    bare = calibrate.front_end_fit([{k: v for k, v in p.items() if k != "speculative"} for p in pts[:4]])
    assert {k: v for k, v in one.items() if k != "points"} == {k: v for k, v in bare.items() if k != "points"}
    assert front_end_of({"front_end": one}, speculative=False).ttft_ms == one["ttft_ms"]


# ---- noise as a result: the host's load, a control point's drift, the held-out CLI ---------------


def test_a_run_is_flagged_when_the_hosts_load_changed():
    from validator import noise

    t0 = {"loadavg": [2.0, 2.0, 2.0], "cpus": 2, "cpu_s": 10.0, "wall_s": 100.0}
    quiet = noise.load_change(t0, dict(t0, loadavg=[2.8, 2.1, 2.0], cpu_s=12.0, wall_s=110.0))
    assert quiet == {"loadavg_1m": [2.0, 2.8], "change_per_cpu": 0.4, "client_cpu_share": 0.2, "changed": False}
    busy = noise.load_change(t0, dict(t0, loadavg=[4.2, 2.5, 2.1], wall_s=110.0))
    assert busy["changed"] and busy["change_per_cpu"] == pytest.approx(1.1)
    assert noise.load_change(t0, dict(t0, loadavg=[0.9, 2.0, 2.0]))["changed"]  # (a drop counts too)
    assert noise.load_change(None, t0) is None
    now = noise.host_load()
    assert now is None or (len(now["loadavg"]) == 3 and now["cpus"] >= 1)


def test_a_control_point_that_moved_more_than_its_spread_is_flagged_as_drift():
    from validator import noise

    def st(tpot, tok_s):
        return {"tpot_ms_p50": tpot, "output_tok_s": tok_s}

    repeats = [st(10.0, 100.0), st(10.5, 97.0), st(9.8, 102.0)]  # spreads 7% and 5%
    steady = noise.drift(st(10.0, 100.0), st(10.4, 98.0), repeats)
    assert not steady["drifted"] and steady["metrics"]["tpot_ms.p50"]["change"] == pytest.approx(0.04)
    moved = noise.drift(st(10.0, 100.0), st(11.5, 90.0), repeats)
    assert moved["drifted"] and moved["metrics"]["tpot_ms.p50"]["spread"] == pytest.approx(0.7 / 10.0, abs=1e-3)
    assert moved["metrics"]["output_tok_s"]["drifted"]
    # one repeat measures no spread: nothing is flagged
    assert not noise.drift(st(10.0, 100.0), st(20.0, 50.0), repeats[:1])["drifted"]


@pytest.mark.slow
def test_the_heldout_procedure_runs_from_the_plain_cli(fake, tmp_path):
    """`dsim validate heldout collect` on a fake server: every case in every round, the control
    point before and after, each run's host load recorded; `analyse` reports the control's drift
    and every case."""
    url = fake(step_ms=0.5)
    rc, out, err = run_cli("validate", "heldout", "collect", "--server", url, "--rounds", "2", "--out", tmp_path / "h")
    assert rc == 0, err
    d = tmp_path / "h"
    assert (d / "control-before.jsonl").exists() and (d / "control-after.jsonl").exists()
    m = measure.read(str(d / "control-after.jsonl"))
    assert m.header["host_load"]["cpus"] >= 1 and set(m.summary["host_load"]) >= {"loadavg_1m", "changed"}
    # a local server: other work on its CPUs over the run is recorded (validator.hostcpu)
    assert m.summary["interference"]["engine_cpus"] and 0.0 <= m.summary["interference"]["others_share"] <= 1.0
    rc, out, err = run_cli("validate", "heldout", "analyse", d, "--out", tmp_path / "rep.json")
    assert rc == 0, err
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert set(rep["drift"]["metrics"]) == {"tpot_ms.p50", "output_tok_s"}
    assert all(v["spread"] is not None for v in rep["drift"]["metrics"].values())
    assert "control (2 requests, 64/64) before -> after: tpot_ms.p50" in out
    assert {"c1", "c8", "c4-256x128", "rate-0.66xc8"} <= set(rep["cases"])
    # the open loop at 0.45 of C=8's rate: the front end's points only, flagged as an open loop
    assert "p-rate-0.45xc8" not in rep["cases"] and json.loads((d / "collect.json").read_text())["front_end_rate_req_s"]
    assert [measure.read(str(d / f"p-rate-0.45xc8-r{r}.jsonl")).header["load"]["mode"] for r in (0, 1)] == ["rate"] * 2
    rc, _, err = run_cli("validate", "heldout", "analyse", tmp_path / "none")
    assert rc == 2 and "not a collection directory" in err


@pytest.mark.slow
def test_the_heldout_procedure_takes_a_server_without_speculation_too(fake, tmp_path):
    """`heldout collect --plain-server`: after the speculative server's rounds, the plain server's
    calibration point and eight streams in rounds of their own; `analyse` calibrates on both
    servers' calibration runs (the machinery's cost from their difference) and checks the plain
    server's eight streams without speculation (no acceptance row: nothing drafted, nothing
    simulated as drafted). (The fakes' timing in a busy test process moves their step times by
    a third; the prediction's accuracy is the live procedure's, docs/results.)"""
    spec_url = fake(spec_k=4, spec_accept=(0.7, 0.5), step_ms=2.0)
    plain_url = fake(step_ms=1.0)
    d = tmp_path / "h"
    rc, out, err = run_cli("validate", "heldout", "collect", "--server", spec_url, "--plain-server", plain_url,
                           "--rounds", "2", "--out", d)  # fmt: skip
    assert rc == 0, err
    assert json.loads(out.strip().splitlines()[-1])["plain_rounds"] == 2
    assert sorted(p.name for p in d.glob("plain-*.jsonl")) == [
        "plain-c8-r0.jsonl", "plain-c8-r1.jsonl", "plain-cal-c2-r0.jsonl", "plain-cal-c2-r1.jsonl",
        "plain-p-c1-r0.jsonl", "plain-p-c1-r1.jsonl", "plain-p-c4-r0.jsonl", "plain-p-c4-r1.jsonl",
    ]  # fmt: skip
    assert measure.read(str(d / "plain-c8-r0.jsonl")).header["case"] == "plain-c8"
    rc, out, err = run_cli("validate", "heldout", "analyse", d, "--out", tmp_path / "rep.json")
    assert rc == 0, err
    rep = json.loads((tmp_path / "rep.json").read_text())
    assert not rep["cases"]["plain-cal-c2"]["held_out"] and rep["cases"]["plain-c8"]["held_out"]
    assert "machinery" in rep["calibration_fit"]["how"] and rep["calibration_fit"]["spec_step_ms"] > 0, rep
    plain_errors, spec_errors = rep["cases"]["plain-c8"]["errors"], rep["cases"]["c8"]["errors"]
    assert "tpot_ms.p50" in plain_errors and "acceptance_length" not in plain_errors
    assert "acceptance_length" in spec_errors
    assert len(rep["cases"]["plain-c8"]["round_errors"]["tpot_ms.p50"]) == 2 and "| plain-c8 |" in out
    rc, _, err = run_cli("validate", "heldout", "collect", "--server", spec_url, "--plain-server", plain_url,
                         "--plain-launch", "m -- --x", "--out", tmp_path / "x")  # fmt: skip
    assert rc == 2 and "--plain-server or --plain-launch" in err


def test_profile_calls_agree_by_their_intervals_and_the_overhead_by_its_share(tmp_path):
    """compare-profiles (closed form): every pair of calls whose intervals overlap agrees; the
    overhead, which carries the machine's level, is judged by its share of each call's mean step,
    so a host 25% slower in the second call moves the overhead out of its interval but not the
    share; a per-token term apart is a disagreement, exit 1. A term 0 within the noise counts as
    [0, its upper bound]; bad input is one line, exit 2."""
    from dsim.cost import save_profile
    from validator import agreement
    from validator.fitted_profile import linear_profile

    def fit(over, lo, hi, tok, tok_lo, tok_hi, step, zero_kv=None):
        f = dict.fromkeys(stepfit.ALL_TERMS, 0.0) | {"cpu_overhead_ms": over, "ms_per_token": tok}
        f["intervals"] = {"cpu_overhead_ms": {"low": lo, "high": hi}, "ms_per_token": {"low": tok_lo, "high": tok_hi}}
        f["zero_within_noise"] = {} if zero_kv is None else {"kv_ms_per_ktok": {"upper": zero_kv}}
        f["overhead_share"] = {"value": over / step, "low": lo / step, "high": hi / step, "mean_step_ms": step}
        return f

    a = fit(3.0, 2.8, 3.2, 0.040, 0.035, 0.045, 5.0, zero_kv=0.2)
    slow = fit(3.75, 3.5, 4.0, 0.050, 0.044, 0.056, 6.25)  # (the same split, the host 25% slower)
    r = agreement.agreement([a, slow])
    assert r["terms"]["cpu_overhead_ms"]["overlapping"] == 0 and r["overhead_share"]["overlapping"] == 1
    assert r["overhead_share"]["level_change"] == pytest.approx(0.25) and r["agree"]
    assert r["terms"]["kv_ms_per_ktok"]["intervals"] == [(0.0, 0.2), None]
    apart = fit(3.0, 2.8, 3.2, 0.063, 0.058, 0.068, 5.0)
    r3 = agreement.agreement([a, slow, apart])
    assert r3["terms"]["ms_per_token"]["overlapping"] == 1 and r3["terms"]["ms_per_token"]["pairs"] == 3
    assert not r3["agree"]
    # without shares (profiles made before them): the overhead itself is judged
    bare = [{k: v for k, v in f.items() if k != "overhead_share"} for f in (a, slow)]
    assert not agreement.agreement(bare)["agree"]

    paths = []
    for i, f in enumerate((a, slow, apart)):
        p = tmp_path / f"p{i}.yaml"
        save_profile(linear_profile(f"p{i}", "measured", f, {}, extra={"validator": {"fit": f}}), p)
        paths.append(str(p))
    rc, out, _ = run_cli("validate", "compare-profiles", *paths[:2])
    assert rc == 0 and "25% apart" in out and "overhead's share of the mean step: 1/1" in out, out
    rc, out, _ = run_cli("validate", "compare-profiles", *paths)
    assert rc == 1 and "ms_per_token: 1/3 pairs" in out and "DISAGREE" in out, out
    rc, _, err = run_cli("validate", "compare-profiles", paths[0], str(tmp_path / "none.yaml"))
    assert rc == 2 and "none.yaml: no such profile file" in err and len(err.strip().splitlines()) == 1
    rc, _, err = run_cli("validate", "compare-profiles", paths[0])
    assert rc == 2 and "needs two profiles or more" in err
