"""dsim profile: one command from a config.json to a profile. A dense model goes through the
analytical path and a MoE model through the composer, reproducing the shipped profiles those
modules wrote; provenance says what is measured and what is assumed; bad input exits 2."""

from __future__ import annotations

import json

import numpy as np
import pytest
from typer.testing import CliRunner

from dsim.cli.entry import app
from dsim.cost import PROFILE_DIR, load_profile
from dsim.errors import InputError
from dsim.profiling.own_model import hardware_kinds, is_moe, own_profile

MODELS = PROFILE_DIR / "models"

# Llama-3.1-70B's public config.json (architecture fields): 141 GB of bf16 weights
LLAMA_70B = {
    "model_type": "llama",
    "hidden_size": 8192,
    "intermediate_size": 28672,
    "num_hidden_layers": 80,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "torch_dtype": "bfloat16",
}


def test_hardware_kinds_cover_both_paths():
    assert {"H200", "B300"} <= set(hardware_kinds())


def test_dense_reproduces_shipped_analytical_profile(tmp_path):
    out = tmp_path / "llama.yaml"
    r = CliRunner().invoke(
        app, ["profile", "model", str(MODELS / "llama-3.1-8b.json"), "--hardware", "H200", "--out", str(out)]
    )
    assert r.exit_code == 0, r.output
    assert "path     : analytical (dense)" in r.output and "measured : efficiencies fitted" in r.output
    got = load_profile(str(out))
    ref = load_profile(str(PROFILE_DIR / "analytical" / "analytical-llama-3.1-8b-h200x1.yaml"))
    assert np.array_equal(got.forward.ms, ref.forward.ms) and got.kv_cache_gib == ref.kv_cache_gib
    basis = got.provenance["basis"]
    assert basis["path"] == "analytical (dense)" and basis["measured"] and basis["assumed"]
    # the datasheet's peaks are the vendor's statement, not a measurement
    assert not any("datasheet" in m for m in basis["measured"])
    assert any("datasheet" in s for s in basis["stated"]) and "stated   : hardware figures: " in r.output
    assert not any("carried to" in a for a in basis["assumed"])  # H200: the fit's own hardware
    assert got.provenance["command"].startswith("dsim profile model ")


def test_dense_on_other_hardware_says_the_fit_is_carried():
    p = own_profile(MODELS / "llama-3.1-8b.json", "B300")
    assert p.provenance["hardware"] == "1 x NVIDIA B300 SXM"
    assert any("H200 efficiency fit carried to B300" in a for a in p.provenance["basis"]["assumed"])


def test_dense_gpus_per_replica_fewest_that_fit(tmp_path):
    cfg = tmp_path / "llama-70b.json"
    cfg.write_text(json.dumps(LLAMA_70B))
    # 141 GB of weights: more than one H200 (141 GB HBM x 0.9), within one B300 (288 GB)
    assert own_profile(cfg, "H200").gpus_per_replica == 2
    assert own_profile(cfg, "B300").gpus_per_replica == 1
    assert own_profile(cfg, "H200", gpus=4).gpus_per_replica == 4


@pytest.mark.parametrize(
    ("hardware", "shipped", "tables"),
    [
        ("B300", "deepseek-v4-flash-b300-dp8-ep8", "b300-aic-vllm"),
        ("H200", "deepseek-v4-flash-h200-dp8-ep8", "h200-aic-vllm, h200-torch"),  # the default profile
    ],
)
@pytest.mark.slow
def test_moe_reproduces_shipped_composed_profile(hardware, shipped, tables):
    cfg = json.loads((MODELS / "deepseek-v4-flash.json").read_text())
    assert is_moe(cfg) and not is_moe(LLAMA_70B)
    got = own_profile(MODELS / "deepseek-v4-flash.json", hardware)
    ref = load_profile(str(PROFILE_DIR / "composed" / f"{shipped}.yaml"))
    np.testing.assert_allclose(got.forward.ms, ref.forward.ms, atol=1e-5)  # (the file keeps 5 decimals)
    for k in ("mtp", "dspark"):
        np.testing.assert_allclose(got.draft[k].ms, ref.draft[k].ms, atol=1e-5)
    basis = got.provenance["basis"]
    assert basis["path"] == "composer (MoE)" and tables in basis["measured"][0]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--hardware", "TPU9"], "--hardware TPU9"),
        (["--gpus", "3", "--topology", "dp8-ep8"], "--topology"),
        # Llama-3.1-8B: 32 attention heads, 8 KV heads; vLLM refuses these tensor-parallel sizes
        (["--gpus", "3"], "--gpus 3: "),
        (["--gpus", "5"], "32 attention heads do not divide over 5 GPUs"),
        (["--gpus", "6"], "--gpus 6: "),
    ],
)
def test_bad_input_exit_2(tmp_path, args, needle):
    r = CliRunner().invoke(
        app, ["profile", "model", str(MODELS / "llama-3.1-8b.json"), "--out", str(tmp_path / "x.yaml"), *args]
    )
    assert r.exit_code == 2 and "dsim: error:" in r.output and needle in r.output, r.output
    assert not (tmp_path / "x.yaml").exists()


def test_bad_configs_exit_2(tmp_path):
    cases = {
        "missing.json": None,
        "broken.json": "{",
        "nokeys.json": json.dumps({"model_type": "llama"}),
        "mixtral.json": json.dumps({**LLAMA_70B, "model_type": "mixtral", "num_local_experts": 8}),
        "text.json": json.dumps({**LLAMA_70B, "hidden_size": "abc"}),
        "list.json": json.dumps({**LLAMA_70B, "num_experts": [1]}),
        "float.json": json.dumps({**LLAMA_70B, "num_attention_heads": 63.5}),
        "zero.json": json.dumps({**LLAMA_70B, "num_hidden_layers": 0}),
    }
    keys = {
        "text.json": "hidden_size",
        "list.json": "num_experts",
        "float.json": "num_attention_heads",
        "zero.json": "num_hidden_layers",
    }
    for fname, text in cases.items():
        p = tmp_path / fname
        if text is not None:
            p.write_text(text)
        r = CliRunner().invoke(app, ["profile", "model", str(p), "--out", str(tmp_path / "x.yaml")])
        assert r.exit_code == 2 and "dsim: error:" in r.output, (fname, r.output)
        assert len(r.output.strip().splitlines()) == 1, r.output
        if fname in keys:  # a wrong type names the file and the key
            assert f"{p}: {keys[fname]}:" in r.output, r.output
    assert not (tmp_path / "x.yaml").exists()


def test_kernel_tables_for_each_hardware():
    from dsim.profiling.own_model import kernel_tables_for

    assert kernel_tables_for("H200") == ["h200-aic-vllm", "h200-torch"]  # the default profile's tables
    assert kernel_tables_for("b300") == ["b300-aic-vllm"]
    assert kernel_tables_for("tpu9") == []  # none: the composer prices every op by the roofline


def test_model_named_from_a_hugging_face_config_json(tmp_path):
    from dsim.spec.capability import method_fit

    # a downloaded V4 checkpoint: <folder>/config.json, no dsim _name; it has one MTP layer
    cfg = json.loads((MODELS / "deepseek-v4-flash.json").read_text())
    cfg.pop("_name", None)
    assert cfg["num_nextn_predict_layers"] == 1
    (tmp_path / "DeepSeek-V4-Flash").mkdir()
    (tmp_path / "DeepSeek-V4-Flash" / "config.json").write_text(json.dumps(cfg))
    p = own_profile(tmp_path / "DeepSeek-V4-Flash" / "config.json", "H200")
    assert p.provenance["model"] == "deepseek-v4-flash" and "config" not in p.name  # dsim's model id
    assert "mtp" in p.provenance["heads"]
    assert method_fit("mtp", p).runnable is True
    # Hugging Face's _name_or_path names it wherever the file lies; a dense model without MTP
    # layers is known not to have the head (not "unknown")
    dense = {**LLAMA_70B, "_name_or_path": "meta-llama/Llama-3.1-70B"}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(dense))
    d = own_profile(tmp_path / "m" / "config.json", "H200")
    assert d.provenance["model"] == "llama-3.1-70b" and d.name.startswith("analytical-llama-3.1-70b-")
    assert d.provenance["heads"] == [] and method_fit("mtp", d).runnable is False


@pytest.mark.parametrize(
    ("qcfg", "bpp"),
    [
        ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}, 0.5),
        ({"quant_method": "gptq", "bits": 8, "group_size": 128}, 1.0),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "int"}}},
            },
            0.5,
        ),
        ({"quant_method": "mxfp4"}, 4.25 / 8),
        ({"quant_method": "fp8", "fmt": "e4m3"}, 1.0),
    ],
)
def test_quantized_dense_config_priced_at_its_bits(tmp_path, qcfg, bpp):
    cfg = tmp_path / "llama-70b-q.json"
    cfg.write_text(json.dumps({**LLAMA_70B, "quantization_config": qcfg}))
    p = own_profile(cfg, "H200")
    assert p.provenance["assumptions"]["bytes_per_param"] == bpp
    # 141 GB of bf16 weights need 2 H200s; at 1 byte or less they fit one
    assert p.gpus_per_replica == 1
    why = [a for a in p.provenance["basis"]["assumed"] if a.startswith("weights ")]
    assert why and qcfg["quant_method"] in why[0] and "unquantized)" not in why[0]


def test_unsupported_quantization_exit_2(tmp_path):
    cfg = tmp_path / "q.json"
    cfg.write_text(json.dumps({**LLAMA_70B, "quantization_config": {"quant_method": "hqq", "nbits": 4}}))
    r = CliRunner().invoke(app, ["profile", "model", str(cfg), "--out", str(tmp_path / "x.yaml")])
    assert r.exit_code == 2 and "quant_method hqq: unsupported" in r.output and str(cfg) in r.output, r.output
    assert not (tmp_path / "x.yaml").exists()


def test_tensor_parallel_rule_is_vllms():
    from dsim.profiling.own_model import tensor_parallel_problem

    llama8b = json.loads((MODELS / "llama-3.1-8b.json").read_text())
    assert [g for g in range(1, 9) if tensor_parallel_problem(llama8b, g) is None] == [1, 2, 4, 8]
    # fewer KV heads than GPUs: each replicated on a whole number of GPUs (vLLM allows it)
    gqa2 = {"num_attention_heads": 16, "num_key_value_heads": 2}
    assert tensor_parallel_problem(gqa2, 8) is None and tensor_parallel_problem(gqa2, 4) is None
    assert "KV heads" in tensor_parallel_problem({"num_attention_heads": 24, "num_key_value_heads": 3}, 2)


def test_out_checked_and_not_overwritten(tmp_path):
    cfg = str(MODELS / "llama-3.1-8b.json")
    r = CliRunner().invoke(app, ["profile", "model", cfg, "--out", str(tmp_path)])
    assert r.exit_code == 2 and f"--out: {tmp_path}: is a directory" in r.output, r.output
    r = CliRunner().invoke(app, ["profile", "model", cfg, "--out", str(tmp_path / "no" / "x.yaml")])
    assert r.exit_code == 2 and "does not exist" in r.output, r.output
    out = tmp_path / "mine.yaml"
    out.write_text("kept\n")
    r = CliRunner().invoke(app, ["profile", "model", cfg, "--out", str(out)])
    assert r.exit_code == 2 and "exists (--force overwrites it)" in r.output and out.read_text() == "kept\n"
    r = CliRunner().invoke(app, ["profile", "model", cfg, "--out", str(out), "--force"])
    assert r.exit_code == 0 and load_profile(str(out)).provenance["model"] == "llama-3.1-8b", r.output
    assert sorted(q.name for q in tmp_path.iterdir()) == ["mine.yaml"]  # no staging debris


def test_profile_group_runs_the_builders_with_their_exit_contract(tmp_path, capsys):
    """`dsim profile compose|aic|deepep` hand the rest of the line to the builder's own argparse
    main: its help, and its bad-input contract (one line, exit 2, nothing written)."""
    from cli_contract import assert_rejected, run_cli

    rc, out, err = run_cli("profile", "--help")
    assert rc == 0 and all(f" {c} " in out for c in ("model", "compose", "aic", "deepep")), out
    rc, out, err = run_cli("profile", "deepep", "--help")
    assert rc == 0 and "{build,published,derive}" in out, (out, err)
    out_file = tmp_path / "t.json"
    assert_rejected(
        "profile",
        "deepep",
        "build",
        "--model",
        "nope:3",
        "--out",
        out_file,
        needles=["--model", "nope:3"],
        watch=tmp_path,
    )
    assert_rejected(
        "profile",
        "compose",
        "profile",
        "--model",
        "no-such-model",
        "--topology",
        "tp8-ep8",
        "--hardware",
        "h200",
        "--out",
        out_file,
        needles=["no-such-model"],
        watch=tmp_path,
    )


@pytest.mark.slow
def test_moe_on_a_gpu_without_its_own_moe_table_uses_the_carried_silicon_table():
    # H100: no shipped MoE silicon table and no aic extra here: AIC's H200 table carried to the H100 (stated),
    # the roofline only for what no table holds
    if __import__("importlib").util.find_spec("aiconfigurator_core") is not None:
        pytest.skip("with the aic extra AIC's own H100 tables price it")
    got = own_profile(MODELS / "deepseek-v3.json", "H100", topology="dp16-ep16")
    basis = got.provenance["basis"]
    assert "h200-aic-vllm@h100" in basis["measured"][0]
    assert basis["assumed"][0].startswith("no silicon table for H100 x vllm at dp16-ep16")
    assert "carried" in got.provenance["method"] or "h200-aic-vllm@h100" in got.provenance["method"]
    with pytest.raises(InputError, match="--backend 'tensorrt'"):
        own_profile(MODELS / "deepseek-v3.json", "H100", topology="dp16-ep16", backend="tensorrt")
