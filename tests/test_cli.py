"""CLI: embedded defaults, --json keys, --out files, bad input -> one line, exit 2, nothing written."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def dsim(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "dsim", *args], capture_output=True, text=True, cwd=cwd or ROOT, timeout=300
    )


def test_simulate_defaults_json_keys(tmp_path):
    r = dsim("simulate", "--requests", "80", "--json", "--out", str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    for key in ("requests_completed", "sim_time_s", "wall_time_s", "output_tok_s", "output_tok_s_per_gpu"):
        assert key in s
    for m in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(s[m]) == {"mean", "p50", "p90", "p99"}
    assert s["requests_completed"] == 80
    assert sorted(p.name for p in (tmp_path / "o").iterdir()) == [
        ".dsim-output.json",
        "requests.parquet",
        "scenario.yaml",
        "steps.parquet",
        "summary.json",
    ]


@pytest.mark.slow
def test_simulate_spec_json_keys():
    r = dsim("simulate", "--requests", "60", "--method", "dspark", "--json")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    for key in ("acceptance_length", "per_position_acceptance", "mean_verify_tokens_per_request", "head"):
        assert key in s
    assert len(s["per_position_acceptance"]) == 7


@pytest.mark.slow
def test_step_log_written(tmp_path):
    r = dsim("simulate", "--requests", "20", "--method", "mtp", "--quiet", "--step-log", str(tmp_path / "s.jsonl"))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(x) for x in (tmp_path / "s.jsonl").read_text().splitlines()]
    assert rows and all(len(x["q"]) == len(x["ctx"]) and x["predicted_ms"] > 0 for x in rows)


BAD_CASES = [
    (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.0,abc,3\n",
        ["trace.csv:3"],
    ),
    (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:47.0,0,3\n",
        ["trace.csv:3"],
    ),
    (
        "trace.csv",
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.0,374,44\n2023-11-16 18:15:45.0,10,3\n",
        ["trace.csv:3"],
    ),
    ("trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n", ["trace.csv"]),
    ("trace.xyz", "hello\n", ["trace.xyz"]),
]


@pytest.mark.parametrize("name,content,needles", BAD_CASES)
def test_bad_trace_one_line_exit_2_nothing_written(tmp_path, name, content, needles):
    p = tmp_path / name
    p.write_text(content)
    out = tmp_path / "out"
    r = dsim("simulate", "--trace", str(p), "--out", str(out))
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1, r.stderr
    for n in needles:
        assert n in lines[0]
    assert not out.exists()


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--nodes", "0"], "--nodes"),
        (["--rate", "-1"], "--rate"),
        (["--rate-scale", "500"], "rate"),
        (["--method", "bogus"], "bogus"),
        (["--profile", "nope"], "nope"),
        (["--verify-mode", "bad"], "verify-mode"),
        (["--trace", "/does/not/exist.csv"], "exist.csv"),
    ],
)
def test_bad_flags(args, needle, tmp_path):
    r = dsim("simulate", *args, "--out", str(tmp_path / "o"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert needle in r.stderr
    assert not (tmp_path / "o").exists()


def test_bad_profile_file(tmp_path):
    import yaml

    from dsim.cost import load_profile, profile_to_dict

    d = profile_to_dict(load_profile())
    d["capture_sizes"] = [1, 8, 4]
    p = tmp_path / "bad.yaml"
    p.write_text(yaml.safe_dump(d))
    r = dsim("simulate", "--profile", str(p))
    assert r.returncode == 2 and "capture_sizes[2]" in r.stderr and "bad.yaml" in r.stderr


@pytest.mark.slow
def test_simulate_takes_method_tokens_of_plan():
    # `--method dspark5-fixed` is `--method dspark --k 5 --no-adaptive`: the same run, seed for seed
    def summary(*flags):
        r = dsim("simulate", "--requests", "60", "--json", *flags)
        assert r.returncode == 0, r.stderr
        s = json.loads(r.stdout)
        s.pop("wall_time_s")
        return s

    token = summary("--method", "dspark5-fixed")
    assert token == summary("--method", "dspark", "--k", "5", "--no-adaptive")
    assert token["setup"]["spec"]["k"] == 5 and not token["setup"]["spec"]["adaptive"]
    r = dsim("simulate", "--method", "dspark5", "--k", "3")
    assert r.returncode == 2 and r.stderr.strip() == "dsim: error: --k 3: disagrees with --method dspark5 (k = 5)"
