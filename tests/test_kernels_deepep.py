"""What-if inter-node tables derived from the measured DeepEP table (dsim.profiling.deepep_tables derive)."""

from __future__ import annotations

import json

import pytest

from dsim.profiling.deepep_tables import derive, main
from dsim.profiling.kernel_ops import layer_ops
from dsim.profiling.kernel_tables import KERNEL_DIR, KernelTable, load_kernel_table
from dsim.profiling.models import load_model
from dsim.profiling.topology import parse_topology

SHIPPED = KERNEL_DIR / "h200-deepep-internode.json"


def _series(table: dict) -> dict:
    out: dict = {}
    for r in table["records"]:
        out.setdefault((r["kind"], r["gpus"], r["hidden"]), []).append((r["bytes"], r["ms"]))
    return {k: sorted(v) for k, v in out.items()}


def test_faster_nic_scales_only_the_time_above_each_latency_floor():
    src = json.loads(SHIPPED.read_text())
    fast = derive(src, nic_gbps=800)
    a, b = _series(src), _series(fast)
    assert a.keys() == b.keys()
    for k in a:
        floor = min(ms for _, ms in a[k])
        assert [x for x, _ in a[k]] == [x for x, _ in b[k]]
        for (_, m0), (_, m1) in zip(a[k], b[k]):
            assert m1 == pytest.approx(floor + (m0 - floor) / 2, abs=1e-5)
        assert b[k][0][1] == pytest.approx(floor) and b[k][-1][1] < a[k][-1][1]
    assert fast["provenance"]["kind"] == "what-if"
    assert "--nic-gbps 800" in fast["provenance"]["command"]

    def key(r):
        return (r["kind"], r["gpus"], r["hidden"], r["bytes"])

    same = derive(src, nic_gbps=400)["records"]  # the measured NIC: the records unchanged
    assert sorted(same, key=key) == sorted(src["records"], key=key)


def test_records_beyond_the_measured_tokens_per_rank_grow_at_the_last_slope():
    src = json.loads(SHIPPED.read_text())
    wide = derive(src, max_tokens_per_rank=1024, name="wide")
    a, b = _series(src), _series(wide)
    for (kind, gpus, hidden), pts in a.items():
        width = 1 if kind == "a2a_dispatch" else 2
        (x0, y0), (x1, y1) = pts[-2], pts[-1]
        slope = (y1 - y0) / (x1 - x0)
        extra = [(x, y) for x, y in b[(kind, gpus, hidden)] if x > x1]
        assert extra[-1][0] == 1024 * hidden * width
        for x, y in extra:
            assert y == pytest.approx(y1 + slope * (x - x1), abs=1e-5)
    # the composer's one-pass records at 512 tokens per rank are answered by the derived table
    tab = KernelTable(name="wide", provenance=wide["provenance"], records=wide["records"])
    m, t = load_model("deepseek-v4-flash"), parse_topology("dp256-ep256")
    ops = [o for o in layer_ops(m, t, "h200", 512) if o.part == "comm"]
    assert ops and all(tab.ms(o.rec) is not None for o in ops)
    assert all(load_kernel_table("h200-deepep-internode").ms(o.rec) is None for o in ops)


def test_derive_rejects_bad_input_in_one_line(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["derive", "--table", str(SHIPPED), "--nic-gbps", "0", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dsim profile deepep: error: --nic-gbps") and "\n" not in err and not out.exists()
    assert main(["derive", "--table", str(tmp_path / "missing.json"), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "missing.json" in err and "\n" not in err and not out.exists()
    assert main(["derive", "--table", str(SHIPPED), "--nic-gbps", "800", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["records"]
