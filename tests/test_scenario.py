"""Scenario options: one definition for simulate, plan, sweep and ab; scenario files (template,
overrides, the file written with every result reproducing it); the validator's calibrated
acceptance in the planner; methods the model cannot run marked hypothetical."""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
import yaml

from cli_contract import assert_rejected, run_cli
from dsim.scenario import (
    Scenario,
    load_scenario_file,
    resolve_scenario_options,
    scenario_fields,
    scenario_yaml,
    template_yaml,
)

ROOT = Path(__file__).resolve().parents[1]
# a small plan: one measured 1-GPU profile, 120 requests, one seed (a few seconds)
SMALL_PLAN = ("--profile", "llama-3.1-8b", "--gpus-per-node", "1", "--requests", "120", "--seeds", "0",
              "--max-nodes", "4", "--jobs", "1")  # fmt: skip


def _options(command: str) -> dict:
    """option name -> click parameter of a dsim command."""
    import typer.main

    from dsim.cli.entry import app

    click_app = typer.main.get_command(app)
    return {p.name: p for p in click_app.commands[command].params}


# ---- one definition ---------------------------------------------------------------------------


def test_every_command_takes_the_scenario_options_it_names_with_one_help_text():
    shared = {
        "acceptance", "policy", "verify_mode", "head", "head_auc", "max_num_seqs", "max_num_batched_tokens",
        "prefix_caching", "async_scheduling", "disaggregated", "remote_prefill_ms", "remote_prefill_ms_per_ktok",
        "router", "profile", "gpus_per_node", "trace", "mix", "scenario",
    }  # fmt: skip
    helps: dict = {}
    for cmd in ("simulate", "plan", "sweep", "ab"):
        opts = _options(cmd)
        assert shared <= set(opts), (cmd, shared - set(opts))
        assert {f.name for f in scenario_fields(cmd)} <= set(opts)
        for name in shared:
            helps.setdefault(name, set()).add(opts[name].help)
    # defined once: the same help (and so the same definition) on every command
    assert all(len(h) == 1 for h in helps.values()), {k: v for k, v in helps.items() if len(v) > 1}
    # what only the node-count search takes stays off simulate and sweep
    assert "sla" in _options("plan") and "sla" not in _options("simulate") and "sla" not in _options("sweep")


@pytest.mark.slow
def test_new_options_reach_plan_and_ab_and_sweep_as_bad_values_show():
    for cmd in (("plan", "--sla", "p50=20ms"), ("ab", "--out", "x"), ("sweep", "--out", "x")):
        assert_rejected(*cmd, "--policy", "nope", needles=("--policy", "nope"))
        assert_rejected(*cmd, "--verify-mode", "wide", needles=("--verify-mode",))
        assert_rejected(*cmd, "--router", "random", needles=("--router", "random"))
        assert_rejected(*cmd, "--acceptance", "nosuchpreset", needles=("--acceptance", "nosuchpreset"))
        assert_rejected(*cmd, "--head-auc", "1.5", needles=("--head-auc",))


# ---- scenario files -----------------------------------------------------------------------------


def test_template_holds_every_option_and_reads_back_as_the_defaults(tmp_path):
    rc, out, err = run_cli("scenario", "init", tmp_path / "s.yaml")
    assert rc == 0, err
    text = (tmp_path / "s.yaml").read_text()
    assert text.startswith("# dsim scenario file")
    got = load_scenario_file(tmp_path / "s.yaml")
    assert set(got) == {f.name for f in scenario_fields()}
    assert Scenario(**{k: v for k, v in got.items()}) == dataclasses.replace(
        Scenario(), sla="p50=20ms", rate_scale=20.0
    )
    # every option is commented with its help
    for f in scenario_fields():
        assert f.metadata["help"][:40] in text
    # an existing file is not overwritten without --force; printed without a path
    assert_rejected("scenario", "init", tmp_path / "s.yaml", needles=("exists", "--force"))
    rc, out, _ = run_cli("scenario", "init")
    assert rc == 0 and out == template_yaml()


def test_command_line_overrides_the_file_and_the_file_overrides_defaults(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text(
        "model: {profile: llama-3.1-8b, gpus_per_node: 1}\n"
        "speculation: {acceptance: 'const:0.7', policy: paper}\n"
        "engine:\n  prefix_caching: true\n  max_num_seqs: 64\n"
        "sla: {sla: p50=30ms}\n"
        "router: round_robin\n"  # a key outside its section is taken too
    )
    s, src = resolve_scenario_options("plan", {"max_num_seqs": 128, "policy": None}, str(f))
    assert (s.profile, s.gpus_per_node, s.acceptance, s.policy) == ("llama-3.1-8b", 1, "const:0.7", "paper")
    assert s.prefix_caching and s.max_num_seqs == 128 and s.router == "round_robin" and s.sla == "p50=30ms"
    assert s.methods == "mtp,dspark" and s.head_auc == 0.85  # not in the file: the command's defaults
    assert src.name == "file" and src.path == str(f)
    s2, _ = resolve_scenario_options("sweep", {}, str(f))
    assert s2.methods == "none,mtp,block,dspark"  # per-command default
    # the compact form printed under a plan reads back to the same scenario
    g = tmp_path / "g.yaml"
    g.write_text(scenario_yaml(s, "plan", comments=False, header=["x"]))
    assert resolve_scenario_options("plan", {}, str(g))[0] == s


@pytest.mark.parametrize(
    "text, needles",
    [
        ("engine: {max_num_seq: 4}\n", ("s.yaml:1", "unknown option", "max_num_seq")),
        ("engine:\n  prefix_caching: 3\n", ("s.yaml:2", "prefix_caching", "true or false")),
        ("model: {gpus_per_node: eight}\n", ("s.yaml:1", "gpus_per_node", "an integer")),
        ("engine: [1, 2]\n", ("s.yaml:1", "section engine")),
        ("- a\n- b\n", ("s.yaml", "mapping of sections")),
        # a bad value the file gave is named by file, line and key
        ("engine: {router: nope}\n", ("s.yaml:1: engine.router: unknown router", "nope")),
        ("speculation:\n  policy: nope\n", ("s.yaml:2: speculation.policy: unknown policy", "nope")),
        ("workload:\n  requests: 5\n  window: '10'\n", ("s.yaml:3: workload.window: expected START:END",)),
        ("engine: {remote_prefill_ms: 5}\n", ("s.yaml:1: engine.remote_prefill_ms: applies only",)),
        # YAML 1.1 reads an unquoted 10:20 as the base-60 number 620: refused, not taken as '620'
        ("workload:\n  window: 10:20\n", ("s.yaml:2", "workload.window", "a string", "620", "quote")),
        ("speculation: {policy: 3}\n", ("s.yaml:1", "speculation.policy", "a string", "quote")),
    ],
)
def test_bad_scenario_file_is_one_line_exit_2(tmp_path, text, needles):
    (tmp_path / "s.yaml").write_text(text)
    assert_rejected("simulate", "--scenario", tmp_path / "s.yaml", "--requests", "5", needles=needles)


@pytest.mark.parametrize(
    "command, text, needles",
    [
        (("plan",), "sla:\n  sla: p50=\n", ("s.yaml:2: sla.sla:",)),
        (("plan", "--sla", "p50=20ms"), "sla: {seeds: '0,0'}\n", ("s.yaml:1: sla.seeds: repeated seed",)),
        (("simulate",), "model:\n  gpus_per_node: 0\n", ("s.yaml:2: model.gpus_per_node: must be in 1..",)),
        (("simulate",), "model: {max_model_len: 0}\n", ("s.yaml:1: model.max_model_len: must be >= 1",)),
    ],
)
def test_a_bad_value_of_the_file_found_by_the_command_names_file_and_line(tmp_path, command, text, needles):
    """Checked where the command reads it (the SLA, seeds, the node's GPUs), a value the file gave
    is still named by file, line and key."""
    (tmp_path / "s.yaml").write_text(text)
    assert_rejected(*command, "--scenario", tmp_path / "s.yaml", "--requests" if command[0] != "sweep" else "--jobs",
                    "5" if command[0] != "sweep" else "1", needles=needles)  # fmt: skip


def test_a_bad_value_given_on_the_command_line_over_a_file_is_named_by_its_flag(tmp_path):
    (tmp_path / "s.yaml").write_text("engine: {router: round_robin}\n")
    assert_rejected("simulate", "--scenario", tmp_path / "s.yaml", "--router", "nope",
                    needles=("dsim: error: --router: unknown router 'nope'",))  # fmt: skip


@pytest.mark.slow
def test_mix_is_checked_against_each_methods_curves_of_a_multi_method_preset(tmp_path):
    """deepseek-v4 holds curves for mtp and dspark: --mix is checked against the curves of each
    drafting method, as simulate checks it, not refused for naming no method."""
    for cmd in (("plan", "--sla", "p50=20ms"), ("sweep", "--out", tmp_path / "x")):
        assert_rejected(*cmd, "--mix", "physics=1", "--acceptance", "deepseek-v4",
                        needles=("--mix", "physics", "math"))  # fmt: skip
    rc, out, err = run_cli("plan", "--sla", "p50=30ms", *SMALL_PLAN, "--mix", "math=1", "--acceptance", "deepseek-v4",
                           "--methods", "none,mtp", "--json")  # fmt: skip
    assert rc in (0, 1), err
    assert json.loads(out)["mtp"]["acceptance_origin"].startswith("deepseek-v4 preset")
    rc, out, err = run_cli("sweep", "--profile", "llama-3.1-8b", "--gpus-per-node", "1", "--concurrency", "2",
                           "--min-requests", "10", "--jobs", "1", "--mix", "math=1", "--acceptance", "deepseek-v4",
                           "--methods", "mtp,dspark", "--out", tmp_path / "sw")  # fmt: skip
    assert rc == 0, err


def test_text_options_take_numbers_only_where_they_say_so(tmp_path):
    (tmp_path / "s.yaml").write_text("workload: {window: '10:20'}\nsla: {seeds: 0}\n")
    assert load_scenario_file(tmp_path / "s.yaml") == {"window": "10:20", "seeds": "0"}


def test_the_default_rate_multiplier_applies_to_the_default_preset_only(tmp_path):
    from dsim.scenario import resolve_presets

    def resolved(scenario):
        s, src = resolve_scenario_options("plan", {"sla": "p50=20ms"}, scenario)
        r, notes = resolve_presets(s, src, "plan")
        return r.rate_scale, [n for n in notes if n.startswith("default scenario")]

    assert resolved(None) == resolved("default") == (20.0, [resolved(None)[1][0]])
    (tmp_path / "s.yaml").write_text("sla: {margin: 0.1}\n")  # profile, trace and rate left unset
    assert resolved(str(tmp_path / "s.yaml")) == (None, [])
    (tmp_path / "t.yaml").write_text(template_yaml())  # the template states the multiplier
    assert resolved(str(tmp_path / "t.yaml")) == (20.0, [])


def test_missing_scenario_file_names_the_presets(tmp_path):
    assert_rejected("plan", "--sla", "p50=20ms", "--scenario", tmp_path / "no.yaml", needles=("not found", "measured"))


def _no_wall(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "wall_time_s"}


def test_simulate_out_writes_the_scenario_that_reproduces_it(tmp_path):
    args = ("--requests", "40", "--acceptance", "const:0.7", "--prefix-caching", "--max-num-seqs", "16")
    rc, _, err = run_cli("simulate", "--method", "mtp", *args, "--out", tmp_path / "a")
    assert rc == 0, err
    written = (tmp_path / "a" / "scenario.yaml").read_text()
    assert f"reproduce: dsim simulate --scenario {tmp_path / 'a' / 'scenario.yaml'} --method mtp --out" in written
    doc = yaml.safe_load(written)
    assert doc["engine"]["prefix_caching"] is True and doc["engine"]["max_num_seqs"] == 16
    assert doc["model"]["profile"] == "deepseek-v4-flash-h200-dp8-ep8"  # the default, made explicit
    rc, _, err = run_cli("simulate", "--scenario", tmp_path / "a" / "scenario.yaml", "--method", "mtp",
                         "--out", tmp_path / "b")  # fmt: skip
    assert rc == 0, err
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert _no_wall(a) == _no_wall(b)
    # and a flag still overrides the file: no prefix caching is another run
    rc, out, _ = run_cli("simulate", "--scenario", tmp_path / "a" / "scenario.yaml", "--method", "mtp",
                         "--no-prefix-caching", "--max-num-seqs", "2", "--json")  # fmt: skip
    assert rc == 0 and json.loads(out)["tpot_ms"] != a["tpot_ms"]


def test_a_scenario_file_reproduces_from_any_folder(tmp_path, monkeypatch):
    """The written file names itself as --out gave it, and its relative input files (here an
    acceptance file) are read whatever the folder the command runs in."""
    work, elsewhere = tmp_path / "work", tmp_path / "elsewhere"
    work.mkdir(), elsewhere.mkdir()
    (work / "acc.yaml").write_text("classes:\n  default: [0.55]\n")
    monkeypatch.chdir(work)
    rc, _, err = run_cli("simulate", "--method", "mtp", "--requests", "30", "--acceptance", "acc.yaml", "--out", "run")
    assert rc == 0, err
    written = (work / "run" / "scenario.yaml").read_text()
    assert "reproduce: dsim simulate --scenario run/scenario.yaml --method mtp --out run" in written
    assert yaml.safe_load(written)["speculation"]["acceptance"] == str(work / "acc.yaml")
    a = json.loads((work / "run" / "summary.json").read_text())
    monkeypatch.chdir(elsewhere)
    rc, out, err = run_cli("simulate", "--scenario", work / "run" / "scenario.yaml", "--method", "mtp", "--json")
    assert rc == 0, err
    b = json.loads(out)
    assert b["setup"].pop("acceptance_source").endswith(str(work / "acc.yaml") + ": ")  # named by its path as read
    assert a["setup"].pop("acceptance_source") == "acc.yaml: "
    assert (a["setup"]["spec"].pop("acceptance"), b["setup"]["spec"].pop("acceptance")) == (
        "acc.yaml",
        str(work / "acc.yaml"),
    )
    assert _no_wall(b) == _no_wall(a)
    # a file written by hand names its acceptance file relative to itself
    (work / "s.yaml").write_text("workload: {requests: 30}\nspeculation: {acceptance: acc.yaml}\n")
    rc, out, err = run_cli("simulate", "--scenario", "../work/s.yaml", "--method", "mtp", "--json")
    assert rc == 0, err
    got = json.loads(out)
    assert got["per_position_acceptance"] == a["per_position_acceptance"] and got["tpot_ms"] == a["tpot_ms"]


def test_plan_prints_the_scenario_that_reproduces_it(tmp_path):
    rc, text, err = run_cli("plan", "--sla", "p50=30ms", *SMALL_PLAN, "--acceptance", "const:0.6",
                            "--router", "round_robin", "--methods", "none,mtp")  # fmt: skip
    assert rc in (0, 1), err
    block = text[text.index("# scenario (save these lines") :]
    # (--jobs says only how the simulations run: the line that reproduces the result leaves it out)
    assert "reproduce: dsim plan --scenario FILE.yaml)" in block and "--jobs" not in block
    (tmp_path / "p.yaml").write_text(block)
    rc1, j1, _ = run_cli("plan", "--sla", "p50=30ms", *SMALL_PLAN, "--acceptance", "const:0.6",
                         "--router", "round_robin", "--methods", "none,mtp", "--json")  # fmt: skip
    rc2, j2, err = run_cli("plan", "--scenario", tmp_path / "p.yaml", "--jobs", "1", "--json")
    assert rc2 == rc1, err
    r1, r2 = json.loads(j1), json.loads(j2)
    for m in ("none", "mtp"):
        assert (r1[m]["nodes"], r1[m]["metrics"]) == (r2[m]["nodes"], r2[m]["metrics"])
    assert r2["assumptions"]["scenario"]["engine"]["router"] == "round_robin"
    assert r2["assumptions"]["load_model"].endswith("round_robin router")


def test_plan_acceptance_and_engine_options_change_the_answer():
    def run(*extra):
        rc, out, err = run_cli("plan", "--sla", "p50=30ms", *SMALL_PLAN, "--methods", "mtp3", "--json", *extra)
        assert rc in (0, 1), err
        return json.loads(out)["mtp3"]

    low, high = run("--acceptance", "const:0.3"), run("--acceptance", "const:0.95")
    # MTP-3 at a constant p: tau = 1 + p + p^2 + p^3 (the chain identity), within the noise
    for r, p in ((low, 0.3), (high, 0.95)):
        assert r["acceptance_length"] == pytest.approx(1 + p + p * p + p**3, rel=0.08)
        assert r["acceptance_origin"] == "given: const:" + str(p)
    assert high["metrics"]["tpot_p50"]["value"] < low["metrics"]["tpot_p50"]["value"]
    # one request at a time: every decode step a batch of one, shorter than a shared step (the wait
    # moves into TTFT); 3.3 ms against 4.3 ms, both on one node
    small, base = run("--max-num-seqs", "1"), run()
    assert small["metrics"]["tpot_p50"]["value"] < 0.9 * base["metrics"]["tpot_p50"]["value"]


def test_scenario_measured_preset_is_kept():
    rc, out, err = run_cli("plan", "--sla", "p50=30ms", "--scenario", "measured", "--gpus-per-node", "1",
                           "--requests", "60", "--seeds", "0", "--methods", "none", "--jobs", "1", "--json")  # fmt: skip
    assert rc in (0, 1), err
    a = json.loads(out)["assumptions"]
    from dsim.scenario import measured_profile_path

    assert a["profile_kind"] == "measured"
    assert a["scenario"]["model"]["profile"] == str(measured_profile_path())
    assert any("scenario 'measured'" in n for n in a["notes"])
    # simulate says which measured profile the preset picked, as plan does
    rc, out, err = run_cli("simulate", "--scenario", "measured", "--gpus-per-node", "1", "--requests", "20")
    assert rc == 0, err
    assert f"note     : scenario 'measured': profile {measured_profile_path()}" in out


# ---- methods that fit the model ------------------------------------------------------------------


def test_method_fit_is_read_from_the_model_not_its_name():
    from dsim.cost import load_profile
    from dsim.spec.capability import acceptance_origin, method_fit

    llama = load_profile("llama-3.1-8b")
    v4 = load_profile(None)
    v3 = load_profile(str(ROOT / "profiles" / "analytical" / "deepseek-v4-class-h200x8.yaml"))  # model deepseek-v3
    assert method_fit("mtp", llama).hypothetical and "num_nextn_predict_layers" in method_fit("mtp", llama).reason
    assert method_fit("dspark", llama).hypothetical
    assert method_fit("mtp", v4).runnable and method_fit("dspark", v4).runnable
    assert method_fit("mtp", v3).runnable and method_fit("dspark", v3).hypothetical  # V3: MTP, no DSpark drafter
    assert method_fit("eagle3", llama).runnable and method_fit("none", llama).runnable
    # a profile may state its model's heads; an unknown model is said to be unknown
    stated = dataclasses.replace(llama, provenance={**llama.provenance, "heads": ["mtp"]})
    assert method_fit("mtp", stated).runnable and method_fit("dspark", stated).hypothetical
    unknown = dataclasses.replace(llama, provenance={**llama.provenance, "model": "my-own-model"})
    assert method_fit("mtp", unknown).runnable is None and "unknown" in method_fit("mtp", unknown).reason
    # whose acceptance: the default preset is V4's, another model's on Llama
    o = acceptance_origin(None, "mtp", llama)
    assert o.label == "deepseek-v4 preset (not llama-3.1-8b's)" and o.other_model and not o.users
    assert acceptance_origin(None, "dspark", v4).label == "deepseek-v4 preset"
    assert acceptance_origin(None, "eagle3", v4).other_model  # the Qwen3-4B figure on V4
    assert acceptance_origin("const:0.8", "mtp", llama).users
    assert acceptance_origin(None, "none", llama) is None
    # a profile naming no model: not said to be another model's, and not known to be its own
    nameless = dataclasses.replace(llama, provenance={k: v for k, v in llama.provenance.items() if k != "model"})
    o = acceptance_origin(None, "mtp", nameless)
    assert o.label == "deepseek-v4 preset (profile names no model)" and o.other_model is None
    # a preset's models are model ids, compared exactly (not a substring of its free-text model line)
    for model, own in (("deepseek-v4-pro", True), ("deepseek-v4", False), ("v4", False), ("deepseek-v3", False)):
        p = dataclasses.replace(v4, provenance={**v4.provenance, "model": model})
        assert acceptance_origin(None, "mtp", p).other_model is (not own), model
    assert acceptance_origin("mtp1-deepseek-v3", "mtp", v3).label == "mtp1-deepseek-v3 preset"
    assert acceptance_origin("qwen3-4b-fig2", "eagle3", v4).label == "qwen3-4b-fig2 preset (not deepseek-v4-flash's)"


def test_model_heads_says_which_kind_of_source_it_read():
    from dsim.cost import load_profile
    from dsim.spec.capability import model_heads

    llama = load_profile("llama-3.1-8b")
    assert model_heads(llama) == (frozenset(), "profiles/models/llama-3.1-8b.json", "config")
    stated = dataclasses.replace(llama, provenance={**llama.provenance, "heads": ["mtp"]})
    assert model_heads(stated)[0::2] == (frozenset({"mtp"}), "profile")
    unknown = dataclasses.replace(llama, provenance={**llama.provenance, "model": "my-own-model"})
    assert model_heads(unknown)[0::2] == (None, None)


def test_every_preset_names_the_model_ids_it_is_for():
    from dsim.spec.acceptance import PRESET_DIR, preset_names

    for name in preset_names():
        models = yaml.safe_load((PRESET_DIR / f"{name}.yaml").read_text()).get("models")
        assert isinstance(models, list) and models and all(isinstance(m, str) and m for m in models), name


@pytest.mark.parametrize("models", ["deepseek-v4-flash", "[1, 2]", "['']"])
def test_acceptance_file_models_must_be_a_list_of_ids(tmp_path, models):
    (tmp_path / "a.yaml").write_text(f"models: {models}\nclasses:\n  default: [0.7]\n")
    assert_rejected("simulate", "--method", "mtp", "--requests", "5", "--acceptance", tmp_path / "a.yaml",
                    needles=("a.yaml:1: models", "list of model ids"))  # fmt: skip


def test_plan_table_marks_hypothetical_methods_and_names_their_acceptance():
    rc, out, err = run_cli("plan", "--sla", "p50=30ms", *SMALL_PLAN)
    assert rc in (0, 1), err
    table = out.split("(SLO cells")[0]
    rows = {line.split("  ")[0].strip(): line for line in table.splitlines()[2:] if line.strip()}
    assert set(rows) == {"MTP-1 (hypothetical)", "DSpark adaptive (hypothetical)"}
    assert all("deepseek-v4 preset (not llama-3.1-8b's)" in line for line in rows.values())
    assert "MTP-1 is hypothetical: llama-3.1-8b has no MTP head" in out
    # the model's own methods on the default profile are not marked
    from dsim.cost import load_profile
    from dsim.scenario import method_spec
    from dsim.study import capacity as P

    f = P.method_fit_fields(method_spec("dspark"), load_profile(None))
    assert not f["hypothetical"] and f["acceptance_origin"] == "deepseek-v4 preset"
    assert f["acceptance_other_model"] is False and f["acceptance_users"] is False
    f = P.method_fit_fields(method_spec("mtp"), load_profile("llama-3.1-8b"))
    assert f["acceptance_other_model"] is True


def test_simulate_and_sweep_say_what_plan_says_of_a_method_not_checked_or_hypothetical(tmp_path):
    prof = (ROOT / "profiles" / "h200" / "h200-llama-3.1-8b.yaml").read_text()
    assert "  model: llama-3.1-8b\n" in prof
    (tmp_path / "p.yaml").write_text(prof.replace("  model: llama-3.1-8b\n", "  model: my-own-model\n"))
    args = ("--gpus-per-node", "1", "--acceptance", "const:0.7")
    rc, out, err = run_cli("simulate", "--profile", tmp_path / "p.yaml", *args, "--method", "mtp", "--requests", "20")
    assert rc == 0, err
    unknown = "whether my-own-model has a MTP head is unknown (no config for model my-own-model under profiles/models)"
    assert f"method   : MTP-1: {unknown}; not checked" in out
    rc, out, err = run_cli("simulate", "--profile", "llama-3.1-8b", *args, "--method", "mtp", "--requests", "20")
    assert rc == 0, err
    assert "method   : MTP-1 is hypothetical: llama-3.1-8b has no MTP head" in out
    rc, out, err = run_cli("sweep", "--profile", tmp_path / "p.yaml", *args, "--methods", "mtp", "--concurrency", "2",
                           "--min-requests", "10", "--jobs", "1", "--out", tmp_path / "sw")  # fmt: skip
    assert rc == 0, err
    assert f"method  : mtp: acceptance given: const:0.7; {unknown}; not checked" in out


# ---- the validator's calibration in the planner ------------------------------------------------


@pytest.fixture
def speculative_fake():
    """A fake OpenAI server drafting K = 4 tokens a step with conditional acceptance ACCEPT."""
    from servers import free_port
    from validator import fake_server

    port = free_port()
    httpd = fake_server.serve(port, "ok", 1.0, spec_k=4, spec_accept=ACCEPT)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{port}"
    httpd.shutdown()
    httpd.server_close()


ACCEPT = (0.8, 0.6, 0.5, 0.4)


def test_calibrated_acceptance_of_a_speculative_server_sizes_the_plan(speculative_fake, tmp_path):
    """serve (a fake speculative server), run, calibrate, plan: the plan reads what calibrate
    wrote, from --acceptance and from a scenario file, and sizes on it."""
    from dsim.spec.acceptance import chain_tau, load_acceptance

    rc, _, err = run_cli("validate", "run", "--server", speculative_fake, "-c", "2", "-n", "24", "--input-len", "16",
                         "--output-len", "80", "--repeat", "1", "--no-progress", "--out", tmp_path / "runs")  # fmt: skip
    assert rc == 0, err
    rc, _, err = run_cli("validate", "calibrate", tmp_path / "runs" / "measurements.jsonl", "--out", tmp_path / "cal")
    assert rc == 0, err
    acc = tmp_path / "cal" / "calibrated-acceptance.yaml"
    curve = load_acceptance(str(acc), "block").curve("default", 4)
    # the measured conditional acceptance is the server's (about 460 drafted steps)
    assert curve == pytest.approx(ACCEPT, abs=0.08)
    plan_args = ("--sla", "p50=20ms", "--profile", tmp_path / "cal" / "calibrated-profile.yaml", "--gpus-per-node",
                 "1", "--requests", "80", "--seeds", "0", "--max-nodes", "4", "--methods", "none,block4",
                 "--jobs", "1", "--json")  # fmt: skip
    rc, out, err = run_cli("plan", *plan_args, "--acceptance", acc)
    assert rc in (0, 1), err
    r = json.loads(out)["block4"]
    assert r["acceptance_origin"] == "given: calibrated-acceptance.yaml" and r["acceptance_users"]
    assert r["acceptance_length"] == pytest.approx(chain_tau(curve), rel=0.08)
    # the same through a scenario file
    (tmp_path / "s.yaml").write_text(f"speculation:\n  acceptance: {acc}\n")
    rc, out2, err = run_cli("plan", *plan_args, "--scenario", tmp_path / "s.yaml")
    assert rc in (0, 1), err
    assert json.loads(out2)["block4"]["metrics"] == r["metrics"]
    # and it is not the preset's answer
    rc, out3, _ = run_cli("plan", *plan_args)
    assert json.loads(out3)["block4"]["acceptance_length"] != pytest.approx(r["acceptance_length"], rel=0.02)


@pytest.mark.slow
def test_sweep_and_ab_write_their_scenario_and_take_the_new_options(tmp_path):
    common = ("--profile", "llama-3.1-8b", "--gpus-per-node", "1", "--concurrency", "1,4", "--min-requests", "20",
              "--requests-per-user", "2", "--jobs", "1", "--acceptance", "const:0.7", "--router", "round_robin")  # fmt: skip
    rc, out, err = run_cli("sweep", *common, "--methods", "mtp", "--out", tmp_path / "sw")
    assert rc == 0, err
    doc = yaml.safe_load((tmp_path / "sw" / "scenario.yaml").read_text())
    assert doc["speculation"]["acceptance"] == "const:0.7" and doc["engine"]["router"] == "round_robin"
    assert "sla" not in doc  # a sweep takes no SLA
    assert "method  : mtp: acceptance given: const:0.7; hypothetical: llama-3.1-8b has no MTP head" in out
    rc, out, err = run_cli("ab", *common, "--requests", "60", "--seeds", "0", "--max-nodes", "2", "--sla", "p50=30ms",
                           "--out", tmp_path / "ab")  # fmt: skip
    assert rc == 0, err
    report = (tmp_path / "ab" / "report.md").read_text()
    assert f"# or: dsim ab --scenario {tmp_path / 'ab' / 'scenario.yaml'}" in report
    assert "| MTP-1 (hypothetical) |" in report and "| given: const:0.7 |" in report
    assert "via the round-robin router" in report
    doc = yaml.safe_load((tmp_path / "ab" / "scenario.yaml").read_text())
    assert doc["sla"]["sla"] == "p50=30ms" and doc["workload"]["requests"] == 60
