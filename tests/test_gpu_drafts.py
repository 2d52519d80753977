"""The drafter-table re-measurement: `python3 -m validator.gpu.profile --draft-only` files merged into
the shipped H200 profiles by `python3 -m validator.gpu.refit --drafts` (CPU tests; the end-to-end dry
run of the profiler needs torch and skips without it)."""

import copy
import json
import shutil
import statistics
from pathlib import Path

import numpy as np
import pytest
import yaml

from dsim.cost import CostModel, load_profile
from validator.gpu import plan
from validator.gpu import refit as RF
from validator.gpu.profile_files import dump_yaml

ROOT = Path(__file__).resolve().parent.parent
H200 = ROOT / "profiles" / "h200"
# the output of `OUT=... EXTRA=--dry-run REPS=2 PASSES=2 bash validator/gpu/scripts/draft_tables.sh`
# for Llama-3.1-8B (a tiny CPU model: the numbers mean nothing, the form is the GPU run's)
DRY = ROOT / "tests" / "fixtures" / "drafts-dry-run" / "drafts-llama-3.1-8b.json"
GRID = list(plan.DRAFT_REQUESTS)


def _profiles(tmp_path: Path, model: str = "llama-3.1-8b") -> Path:
    """A copy of a shipped profile as it was before any drafter re-measurement (the power-of-two
    tables the raw file keeps as previous, no draft record)."""
    d = tmp_path / "profiles"
    d.mkdir(exist_ok=True)
    shutil.copy(H200 / f"h200-{model}.yaml", d / f"h200-{model}.yaml")
    shutil.copy(ROOT / "archive" / "h200" / f"h200-{model}.raw.json", d / f"h200-{model}.raw.json")
    y, r = d / f"h200-{model}.yaml", d / f"h200-{model}.raw.json"
    raw = json.loads(r.read_text())
    if "draft" in raw:
        prof = yaml.safe_load(y.read_text())
        prof["draft"] = raw.pop("draft")["previous"]
        prof["provenance"].pop("draft_tables", None)
        y.write_text(dump_yaml(prof))
        r.write_text(json.dumps(raw, indent=1) + "\n")
    return d


def _read(d: Path, model: str = "llama-3.1-8b") -> tuple[dict, dict, str, str]:
    y, r = d / f"h200-{model}.yaml", d / f"h200-{model}.raw.json"
    return yaml.safe_load(y.read_text()), json.loads(r.read_text()), y.read_text(), r.read_text()


def test_dry_run_file_merges_into_the_drafter_tables_only(tmp_path):
    """The dry run's file (two processes) merged into a copy of a shipped profile: each drafter
    table is the per-size median over the processes, rounded as profile_dict rounds, at every
    drafter capture size; every other field of the YAML and the raw file is as it was; the
    provenance says where the tables come from; the profile loads and dsim reads a batch of 257
    at 272 requests. Merging again changes nothing but keeps the power-of-two tables as previous."""
    d = _profiles(tmp_path)
    before, raw_before, _, _ = _read(d)
    src = json.loads(DRY.read_text())
    assert src["format"] == plan.DRAFT_FORMAT and len(src["runs"]) == 2
    assert RF.main(["--drafts", str(DRY), "--profiles", str(d), "--allow-dry-run"]) == 0
    after, raw_after, ytext, rtext = _read(d)
    for kind in plan.DRAFT_ORDER:
        want = [
            round(statistics.median(run["tables"][kind]["ms"][i] for run in src["runs"]), 5) for i in range(len(GRID))
        ]
        assert after["draft"][kind] == {"requests": GRID, "ms": want}
        assert raw_after["draft"]["tables"][kind]["process_ms"] == [run["tables"][kind]["ms"] for run in src["runs"]]
    assert list(after["draft"]) == list(before["draft"])
    assert {k: v for k, v in after.items() if k != "draft"} == {
        k: (dict(v, draft_tables=after["provenance"]["draft_tables"]) if k == "provenance" else v)
        for k, v in before.items()
        if k != "draft"
    }
    assert {k: v for k, v in raw_after.items() if k != "draft"} == raw_before
    assert raw_after["draft"]["previous"] == before["draft"] and raw_after["draft"]["runs"] == src["runs"]
    rec = after["provenance"]["draft_tables"]
    assert rec["dry_run"] is True and rec["hardware"] == "cpu (dry run)" and rec["kinds"] == list(plan.DRAFT_ORDER)
    assert rec["processes"] == {k: 2 for k in plan.DRAFT_ORDER} and rec["kept"] == []
    assert rec["command"].startswith("bash validator/gpu/scripts/draft_tables.sh")
    assert rec["merge_command"].startswith("python3 -m validator.gpu.refit --drafts ")
    assert rec["previous_requests"] == [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
    cm = CostModel(load_profile(str(d / "h200-llama-3.1-8b.yaml")))
    acc = np.maximum.accumulate(after["draft"]["dspark"]["ms"])
    assert cm.draft_table_ms("dspark", 257) == pytest.approx(acc[GRID.index(272)])
    # again: the same tables, the first merge's previous (the power-of-two grid) kept
    assert RF.main(["--drafts", str(DRY), "--profiles", str(d), "--allow-dry-run"]) == 0
    again, raw_again, ytext2, _ = _read(d)
    assert again["draft"] == after["draft"] and raw_again["draft"]["previous"] == before["draft"]
    assert ytext2 == ytext


def _synthetic(runs_c=(1.0, 2.0, 4.0), gpu="NVIDIA H200", cut_last=False) -> dict:
    """A --draft-only file whose run i times every kind at c_i x R ms (median: 2 R)."""
    runs = []
    for i, c in enumerate(runs_c):
        tables = {
            k: dict(requests=GRID, ms=[c * r for r in GRID], reps=[[c * r] for r in GRID], complete=True)
            for k in plan.DRAFT_ORDER
        }
        runs.append(
            dict(
                process=i + 1,
                date="2026-12-03",
                info=dict(gpu=gpu, driver="580", torch="2.11.0+cu130", cuda="13.0", sms=132, mem_gib=139.8),
                command="python3 -m validator.gpu.profile --draft-only ...",
                job="bash validator/gpu/scripts/draft_tables.sh (PASSES=3 REPS=5 DEADLINE=400)",
                dry_run=False,
                reps=5,
                context=plan.DRAFT_CTX,
                block_k=plan.BLOCK_K,
                block_layers=plan.BLOCK_LAYERS,
                split=dict(policy="continuous", fill=2.0, balance=2.0, min_chunk=64, sms=132),
                tables=tables,
            )
        )
    if cut_last:  # a fourth process cut short in its first kind: left out
        r = copy.deepcopy(runs[0])
        r["tables"] = {"dspark": dict(requests=GRID[:5], ms=[100.0] * 5, complete=False)}
        runs.append(r)
    return dict(format=plan.DRAFT_FORMAT, model="qwen3-8b", runs=runs)


def test_merge_closed_form_median_comparison_and_cut_runs(tmp_path, capsys):
    """Three processes at 1, 2 and 4 x R ms and one cut short: the table is 2 R (the cut run left
    out); against a previous table of 2 R at the powers of two the drift is 0, dsim charged R = 129
    the cost of 256 where the new table charges 136 (1.882x, as 257: 512 against 272), and both
    slopes are 2 ms per request."""
    d = _profiles(tmp_path, "qwen3-8b")
    prof = yaml.safe_load((d / "h200-qwen3-8b.yaml").read_text())
    for k in plan.DRAFT_ORDER:
        prof["draft"][k] = dict(requests=[2**i for i in range(10)], ms=[2.0 * 2**i for i in range(10)])
    (d / "h200-qwen3-8b.yaml").write_text(dump_yaml(prof))
    f = tmp_path / "drafts-qwen3-8b.json"
    f.write_text(json.dumps(_synthetic(cut_last=True)))
    assert RF.main(["--drafts", str(f), "--profiles", str(d)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("qwen3-8b: ['dspark', 'mtp', 'eagle3', 'block'] from ")
    new = yaml.safe_load((d / "h200-qwen3-8b.yaml").read_text())
    rec = new["provenance"]["draft_tables"]
    assert "dry_run" not in rec and rec["hardware"] == "NVIDIA H200" and rec["torch"] == "2.11.0+cu130"
    assert rec["runs_cut_short"] == {"dspark": 1} and rec["processes"]["dspark"] == 3
    for k in plan.DRAFT_ORDER:
        assert new["draft"][k] == dict(requests=GRID, ms=[2.0 * r for r in GRID])
        c = rec["compared"][k]
        assert c["drift_at_previous_sizes_pct"]["median"] == 0 and c["drift_at_previous_sizes_pct"]["max_abs"] == 0
        po = c["previous_over_new"]
        assert po["max_ratio"] == round(512 / 272, 3) and po["at_requests"] == 129  # 256 / 136, the first
        ratio = [min(2**i for i in range(10) if 2**i >= R) / min(g for g in GRID if g >= R) for R in range(1, 513)]
        assert po["mean_pct"] == round((float(np.mean(ratio)) - 1) * 100, 1)
        assert c["slope_ms_per_request"] == dict(last=2.0, fitted_last_128=pytest.approx(2.0))


def _err(tmp_path, capsys, doc, d=None, text=None) -> str:
    d = d or _profiles(tmp_path, "qwen3-8b")
    f = tmp_path / "drafts-qwen3-8b.json"
    f.write_text(text if text is not None else json.dumps(doc))
    keep = [(p, p.read_bytes()) for p in sorted(d.iterdir())]
    assert RF.main(["--drafts", str(f), "--profiles", str(d)]) == 2
    assert [(p, p.read_bytes()) for p in sorted(d.iterdir())] == keep  # nothing written
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {f}: ")
    return err.strip()[len(f"error: {f}: ") :]


def _set(doc, path, value):
    x = doc
    for k in path[:-1]:
        x = x[k]
    if value is KeyError:
        del x[path[-1]]
    else:
        x[path[-1]] = value
    return doc


BAD = [
    ((("format",), "other"), "format: 'other', not 'dsim-draft-tables-1'"),
    ((("runs",), []), "runs: no run"),
    ((("runs", 1, "tables", "dspark", "ms", 3), -1.0), "runs[1].tables.dspark.ms[3]: -1.0 is not a positive time"),
    ((("runs", 0, "tables", "mtp", "ms", 0), "x"), "runs[0].tables.mtp.ms[0]: 'x' is not a positive time"),
    (
        (("runs", 0, "tables", "mtp", "requests"), [1, 2, 4, 8, 32]),
        "runs[0].tables.mtp.requests: not the drafter sizes",
    ),
    ((("runs", 2, "tables", "block", "ms"), [1.0] * 3), "runs[2].tables.block.ms: has 3 values, requests has 51"),
    ((("runs", 0, "tables", "medusa"), {}), "runs[0].tables.medusa: unknown drafter kind"),
    ((("runs", 0, "dry_run"), True), "runs[0].dry_run: a dry run"),
    ((("runs", 1, "info", "gpu"), "NVIDIA A100"), "runs[1].info.gpu: 'NVIDIA A100': the profile h200-qwen3-8b.yaml"),
    ((("runs", 0, "split", "fill"), 4.0), "runs[0].split.fill: 4.0: the profile's executor ran 2.0"),
    ((("runs", 0, "context"), 2048), "runs[0].context: 2048, the profiles' drafters have 1024"),
    ((("model",), "qwen3-99b"), "model: 'qwen3-99b': no profile"),
]


@pytest.mark.parametrize("change,msg", BAD, ids=[m.split(":")[0] for _, m in BAD])
def test_merge_bad_input_is_one_line_naming_the_file_and_field(tmp_path, capsys, change, msg):
    doc = _synthetic()
    assert _err(tmp_path, capsys, _set(doc, *change)).startswith(msg)


def test_merge_rejects_unreadable_and_all_cut_files(tmp_path, capsys):
    assert _err(tmp_path, capsys, None, text="{not json").startswith("not JSON")
    doc = _synthetic(runs_c=(1.0,))
    doc["runs"][0]["tables"] = {"dspark": dict(requests=[], ms=[], complete=False)}
    assert _err(tmp_path, capsys, doc) == "runs: no drafter table timed at every size (1 runs, all cut short)"
    assert RF.main(["--drafts", str(tmp_path / "nowhere.json")]) == 2


def test_merge_checks_every_file_before_writing_any(tmp_path, capsys):
    """Two files, the second bad (or of the same model): neither profile is written."""
    d = _profiles(tmp_path, "qwen3-8b")
    _profiles(tmp_path, "llama-3.1-8b")
    good, bad = _synthetic(), _synthetic(gpu="NVIDIA A100")
    good["model"], bad["model"] = "llama-3.1-8b", "qwen3-8b"
    (tmp_path / "a.json").write_text(json.dumps(good))
    (tmp_path / "b.json").write_text(json.dumps(bad))
    keep = [(p, p.read_bytes()) for p in sorted(d.iterdir())]
    assert (
        RF.main(["--drafts", str(tmp_path / "a.json"), "--drafts", str(tmp_path / "b.json"), "--profiles", str(d)]) == 2
    )
    assert "b.json: runs[0].info.gpu: 'NVIDIA A100'" in capsys.readouterr().err
    assert (
        RF.main(["--drafts", str(tmp_path / "a.json"), "--drafts", str(tmp_path / "a.json"), "--profiles", str(d)]) == 2
    )
    assert "another --drafts file is of the same model" in capsys.readouterr().err
    assert [(p, p.read_bytes()) for p in sorted(d.iterdir())] == keep


@pytest.mark.gpu
def test_draft_only_dry_run_end_to_end(tmp_path):
    """The profiler's --draft-only mode on the CPU (tiny model): two processes' runs appended to one
    file at every drafter capture size, a third stopped before it began (--stop-at in the past: its
    tables empty, left out by the merge), and the file merged into a copy of a shipped profile."""
    pytest.importorskip("torch")
    from validator.gpu import profile as PR

    cfg = str(ROOT / "profiles" / "models" / "llama-3.1-8b.json")
    base = ["--draft-only", "--dry-run", "--model", cfg, "--out", str(tmp_path), "--reps", "1"]
    base += ["--split", "continuous:fill=2,balance=2", "--draft-kinds", "mtp"]
    PR.main(base)
    PR.main(base)
    PR.main(base + ["--stop-at", "1"])
    with pytest.raises(SystemExit, match="needs --split"):
        PR.main(base[:-4])
    f = tmp_path / "drafts-llama-3.1-8b.json"
    doc = json.loads(f.read_text())
    assert [r["process"] for r in doc["runs"]] == [1, 2, 3]
    for r in doc["runs"][:2]:
        assert list(r["tables"]) == ["mtp"] and r["stopped"] is None
        for t in r["tables"].values():
            assert t["requests"] == GRID and len(t["ms"]) == len(GRID) and t["complete"]
    assert doc["runs"][2]["stopped"].startswith("deadline in mtp after 0 of 51")
    d = _profiles(tmp_path)
    before = yaml.safe_load((d / "h200-llama-3.1-8b.yaml").read_text())
    assert RF.main(["--drafts", str(f), "--profiles", str(d), "--allow-dry-run"]) == 0
    after = yaml.safe_load((d / "h200-llama-3.1-8b.yaml").read_text())
    rec = after["provenance"]["draft_tables"]
    assert rec["kinds"] == ["mtp"] and rec["kept"] == ["eagle3", "block", "dspark"]
    assert rec["runs_cut_short"] == {"mtp": 1}
    assert after["draft"]["dspark"] == before["draft"]["dspark"] and after["draft"]["mtp"]["requests"] == GRID


def test_draft_tables_extrapolate_the_slope_of_their_top_quarter():
    """Past a drafter table's last size dsim charges the least-squares slope of the sizes >= 3/4 of
    the last (closed form: exact on a line, the last two points of a power-of-two grid), so one
    noisy point at 496 or 512 does not set the cost of every larger batch; never a negative slope."""
    import numpy as np

    from dsim.cost import draft_extrapolation_slope, drafter_request_sizes

    x = np.array(drafter_request_sizes(512, 512), dtype=float)
    line = 3.0 + 0.04 * x
    assert draft_extrapolation_slope(x, line) == pytest.approx(0.04, rel=1e-12)
    noisy = line.copy()
    noisy[-2] -= 0.5  # 496 timed 0.5 ms fast: the last-two-point slope would be 0.071
    assert (noisy[-1] - noisy[-2]) / 16 == pytest.approx(0.04 + 0.5 / 16)
    assert abs(draft_extrapolation_slope(x, noisy) - 0.04) < 0.005
    pow2 = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256, 512], dtype=float)
    ms = 1.0 + 0.01 * pow2**1.2
    assert draft_extrapolation_slope(pow2, ms) == pytest.approx((ms[-1] - ms[-2]) / 256, rel=1e-12)
    assert draft_extrapolation_slope(pow2, np.full(10, 2.0)) == 0.0
    assert draft_extrapolation_slope(np.array([8.0]), np.array([1.0])) == 0.0
