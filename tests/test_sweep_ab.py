"""dsim sweep and dsim ab: every file is written, figures are non-empty images, bad input exits 2."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from builders import AB_ARGS, SWEEP_ARGS
from dsim.cli.entry import app
from dsim.study.sweep import FIGURES, closed_loop


def _nonempty_png(path):
    import matplotlib.image as mpimg

    assert path.is_file() and path.stat().st_size > 2000, path
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[0] > 100 and img.shape[1] > 100
    assert float(np.std(img[..., :3])) > 0.01, f"{path} looks blank"


def test_closed_loop_repeats_short_traces():
    from dsim.scenario import build_workload

    base = build_workload("default", requests=10)
    w = closed_loop(base, 4, 25)
    assert len(w) == 25 and w.closed_loop_concurrency == 4 and not np.any(w.arrival_s)
    assert list(w.output_tokens[10:20]) == list(base.output_tokens)


@pytest.mark.slow
def test_sweep_writes_table_and_figures(tmp_path):
    out = tmp_path / "sw"
    res = CliRunner().invoke(
        app,
        SWEEP_ARGS + ["--out", str(out)],
    )
    assert res.exit_code == 0, res.output
    df = pd.read_csv(out / "sweep.csv")
    assert len(df) == 4 and set(df["method"]) == {"mtp", "dspark"}
    assert (df["output_tok_s_per_gpu"] > 0).all()
    assert (df[df.method == "mtp"]["verify_tokens_per_request"] == 2.0).all()
    for f in FIGURES:
        _nonempty_png(out / f)


def test_sweep_bad_input():
    r = CliRunner()
    for args in (
        ["sweep", "--concurrency", "0,2", "--out", "/tmp/x"],
        ["sweep", "--concurrency", "a", "--out", "/tmp/x"],
        ["sweep", "--methods", "bogus", "--out", "/tmp/x"],
    ):
        res = r.invoke(app, args)
        assert res.exit_code == 2 and "dsim: error:" in res.output, (args, res.output)


@pytest.mark.slow
def test_ab_report_files(tmp_path):
    out = tmp_path / "ab"
    res = CliRunner().invoke(app, AB_ARGS + ["--out", str(out)])
    assert res.exit_code == 0, res.output
    md = (out / "report.md").read_text()
    html = (out / "report.html").read_text()
    for sec in (
        "Node count for the SLA",
        "Latency distributions",
        "per class",
        "frontier",
        "Seed spread",
        "Sensitivity",
        "Assumptions and sources",
    ):
        assert sec.lower() in md.lower(), sec
    assert "dsim ab" in md.split("##")[0]  # the command at the top
    assert "<style>" in html
    # report.html is self-contained: every figure embedded, none linked
    assert ".png'" not in html and html.count("<img src='data:image/png;base64,") == md.count("![")
    for f in ("latency_cdf.png", "per_class.png", "sensitivity.png") + FIGURES:
        _nonempty_png(out / f)
        assert f in md
    assert (out / "plan.json").is_file() and (out / "sweep.csv").is_file()
    assert "math=1" in md and "chat=1" in md
