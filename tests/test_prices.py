"""Prices per GPU kind: each kind at its own public quote, a kind without one at no dollar figure
(or the user's own), never at another kind's quote."""

from __future__ import annotations

import pytest

from builders import plan_small
from dsim.errors import InputError
from dsim.sim import SpecConfig
from dsim.study.capacity import format_plan
from dsim.study.prices import PRICES, gpu_kind, price_for
from dsim.study.sla import parse_sla


@pytest.mark.parametrize(
    ("hardware", "kind"),
    [
        ("8 x NVIDIA H200 SXM", "H200"),
        ("NVIDIA H200", "H200"),
        ("1 x NVIDIA H100 80GB HBM3", "H100"),
        ("8 x NVIDIA B300 SXM", "B300"),
        ("NVIDIA B200", "B200"),
        ("72 x NVIDIA GB200 NVL72", "GB200"),  # not read as B200
        ("Intel Xeon (vllm-cpu)", None),
        ("", None),
        (None, None),
        ("NVIDIA H100 and H200", None),  # two kinds: no single price fits
        ("8xH200", "H200"),  # counted as hardware is often written
        ("8X H200", "H200"),
        ("H200x8", "H200"),
        ("H100_SXM", "H100"),
        ("nvidia_h100_80gb", "H100"),
        ("4xGB200", "GB200"),  # still not B200
        ("H2000", None),
        ("XH200", None),
    ],
)
def test_gpu_kind(hardware, kind):
    assert gpu_kind(hardware) == kind


def test_every_quote_names_source_and_date():
    for kind in ("H100", "H200", "B200", "B300", "GB200"):
        assert kind in PRICES
    for q in PRICES.values():
        if q.on_demand is not None:
            assert q.on_demand > 0 and q.source and q.date
            assert q.spot is None or 0 < q.spot < q.on_demand
        else:
            assert q.spot is None and q.note  # why there is no figure


def test_own_quote_per_kind_never_another():
    for kind, q in PRICES.items():
        p = price_for(f"8 x NVIDIA {kind} SXM")
        assert p.gpu == kind
        assert p.per_gpu_hour == q.on_demand and p.spot_per_gpu_hour == q.spot
    b300 = price_for("8 x NVIDIA B300 SXM")
    assert b300.per_gpu_hour is None and b300.spot_per_gpu_hour is None
    assert "B300" not in PRICES or PRICES["B300"].on_demand is None
    assert "--price-per-gpu-hour" in b300.source
    unknown = price_for("test rig")
    assert unknown.per_gpu_hour is None and "test rig" in unknown.source


def test_given_price_wins_and_is_checked():
    p = price_for("8 x NVIDIA B300 SXM", 7.5)
    assert p.per_gpu_hour == 7.5 and p.spot_per_gpu_hour is None
    assert p.source == "given on the command line (--price-per-gpu-hour)"
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        with pytest.raises(InputError):
            price_for("NVIDIA H200", bad)


def _b300_flat():
    import dataclasses

    from builders import flat_profile

    prof = flat_profile()
    return dataclasses.replace(prof, provenance={**prof.provenance, "hardware": "8 x NVIDIA B300 SXM"})


def test_plan_on_unpriced_gpu_has_no_dollar_figure():
    from builders import const_workload

    w = const_workload(13.0, 13 * 10)
    slos = parse_sla("p50=11ms")
    specs = {"none": SpecConfig("none"), "none2": SpecConfig("none")}
    res = plan_small(w, _b300_flat(), slos, specs)
    for n in specs:
        assert res[n]["cost_per_hour"] is None and res[n]["cost_per_million_output_tokens"] is None
        assert res[n]["cost_per_hour_spot"] is None
    assert res["comparison"]["cost_per_hour_saved"] is None
    a = res["assumptions"]
    assert a["price_per_gpu_hour"] is None and a["price_gpu"] == "B300"
    text = format_plan(res, slos, list(specs))
    assert "$" not in text.split("assumptions:")[0].replace("$/hour", "").replace("$/M out tok", "")
    assert "no dollar figure" in text
    # the user's own price is used as given
    res = plan_small(w, _b300_flat(), slos, price=7.0)
    r = res["none"]
    assert r["cost_per_hour"] == pytest.approx(r["gpus"] * 7.0)
    assert res["assumptions"]["price_source"].startswith("given on the command line")


@pytest.mark.slow
def test_ab_report_on_unpriced_gpu_and_its_warnings(tmp_path):
    """dsim ab on B300 (no public quote): no dollar figure anywhere, the reason in the assumptions;
    a P99 SLA over 60 requests is listed under Warnings."""
    import json

    from typer.testing import CliRunner

    from dsim.cli.entry import app
    from dsim.cost import PROFILE_DIR

    out = tmp_path / "ab"
    prof = PROFILE_DIR / "composed" / "deepseek-v4-flash-b300-dp8-ep8.yaml"
    r = CliRunner().invoke(
        app,
        [
            "ab",
            "--a",
            "mtp",
            "--b",
            "dspark",
            "--profile",
            str(prof),
            "--sla",
            "p50=20ms,ttft_p99=5s",
            "--requests",
            "60",
            "--seeds",
            "0",
            "--concurrency",
            "1,4",
            "--min-requests",
            "12",
            "--requests-per-user",
            "2",
            "--max-nodes",
            "4",
            "--jobs",
            "1",
            "--out",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text()
    plan_json = json.loads((out / "plan.json").read_text())
    assert all(v["cost_per_hour"] is None for v in plan_json.values())
    assert "no dollar figure" in md and "$5.55" not in md and "B300" in md
    assert "## Warnings" in md and "P99 TTFT" in md.split("## Warnings")[1]
