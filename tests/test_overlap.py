"""Two-batch overlap in the step-cost composer (dsim.profiling.overlap; dsim profile compose --overlap
dbo): vLLM's DBO schedule of two micro-batches per layer, its threshold, and the composed profile's table."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.errors import InputError
from dsim.profiling.compose import compose_profile, required_ops
from dsim.profiling.compose_cli import main
from dsim.profiling.forward import forward_ms
from dsim.profiling.kernel_tables import KernelTable, Roofline
from dsim.profiling.models import load_model
from dsim.profiling.overlap import (
    DBO_DECODE_TOKEN_THRESHOLD,
    MicroBatchLayer,
    dbo_attention_margin_ms,
    dbo_layer_ms,
    forward_ms_dbo,
    micro_batch_layer,
    parse_dbo_threshold,
)
from dsim.profiling.pricer import Pricer
from dsim.profiling.topology import parse_topology

FLASH = load_model("deepseek-v4-flash")
DP8 = parse_topology("dp8-ep8")


def _pricer(zero=frozenset()):
    return Pricer(None, Roofline(hardware="h200"), frozenset(zero))


def test_schedule_closed_form():
    # vLLM's schedule: max(A0, D1) + max(M1, D0) + max(S1 + M0, C1) + max(S0 + A1, C0)
    mb = MicroBatchLayer(attention_ms=3.0, experts_ms=2.0, shared_ms=1.0, dispatch_ms=2.5, combine_ms=4.0)
    assert dbo_layer_ms(mb, mb) == pytest.approx(3.0 + 2.5 + 4.0 + 4.0)
    # communication fully hidden: the two micro-batches' compute back to back
    small = MicroBatchLayer(3.0, 2.0, 1.0, 0.5, 0.5)
    assert dbo_layer_ms(small, small) == pytest.approx(2 * (3.0 + 2.0 + 1.0))
    # compute fully hidden behind communication
    comm = MicroBatchLayer(0.1, 0.1, 0.0, 5.0, 6.0)
    assert dbo_layer_ms(comm, comm) == pytest.approx(2 * (5.0 + 6.0))
    # no all-to-all (a dense layer): back to back
    dense = MicroBatchLayer(3.0, 0.0, 2.0, 0.0, 0.0)
    assert dbo_layer_ms(dense, dense) == pytest.approx(10.0)


_ms = st.floats(min_value=0.0, max_value=50.0, allow_nan=False)


@settings(max_examples=200, deadline=None)
@given(st.tuples(_ms, _ms, _ms, _ms, _ms), st.tuples(_ms, _ms, _ms, _ms, _ms))
def test_overlap_between_max_and_sum_of_streams(a, b):
    m0, m1 = MicroBatchLayer(*a), MicroBatchLayer(*b)
    compute = sum(m.attention_ms + m.experts_ms + m.shared_ms for m in (m0, m1))
    comm = sum(m.dispatch_ms + m.combine_ms for m in (m0, m1))
    t = dbo_layer_ms(m0, m1)
    assert max(compute, comm) - 1e-9 <= t <= compute + comm + 1e-9


def test_attention_margin_closed_form():
    # min(A0 - D1, S0 + A1 - C0)
    m0 = MicroBatchLayer(attention_ms=3.0, experts_ms=2.0, shared_ms=1.0, dispatch_ms=2.5, combine_ms=4.0)
    m1 = MicroBatchLayer(attention_ms=2.0, experts_ms=2.0, shared_ms=0.5, dispatch_ms=1.0, combine_ms=1.0)
    assert dbo_attention_margin_ms(m0, m1) == pytest.approx(min(3.0 - 1.0, 1.0 + 2.0 - 4.0))
    assert dbo_attention_margin_ms(m1, m0) == pytest.approx(min(2.0 - 2.5, 0.5 + 3.0 - 1.0))


@settings(max_examples=300, deadline=None)
@given(st.tuples(_ms, _ms, _ms, _ms, _ms), st.tuples(_ms, _ms, _ms, _ms, _ms), st.floats(0.0, 20.0))
def test_attention_change_on_the_critical_path(a, b, d):
    """What the per-request attention correction assumes under overlap: with the attention of both
    micro-batches on the critical path (margin >= 0), longer attention lengthens the layer by
    exactly as much; in general by no more than that."""
    import dataclasses

    m0, m1 = MicroBatchLayer(*a), MicroBatchLayer(*b)
    if not (m0.dispatch_ms or m0.combine_ms or m1.dispatch_ms or m1.combine_ms):
        return
    longer = [dataclasses.replace(m, attention_ms=m.attention_ms + d) for m in (m0, m1)]
    grow = dbo_layer_ms(*longer) - dbo_layer_ms(m0, m1)
    assert -1e-9 <= grow <= 2 * d + 1e-9
    if dbo_attention_margin_ms(m0, m1) >= 0:
        assert grow == pytest.approx(2 * d, abs=1e-9)


def test_micro_batch_pieces_add_up_to_the_layer():
    """The five pieces of a micro-batch layer are the layer's whole priced cost."""
    from dsim.profiling.kernel_ops import layer_ops
    from dsim.profiling.pricer import priced_total

    p = _pricer()
    for layer in (0, 5, FLASH.layers - 1):
        mb = micro_batch_layer(FLASH, DP8, "h200", 100, p, layer)
        whole = priced_total(FLASH, DP8, "h200", layer_ops(FLASH, DP8, "h200", 100, layers=[layer]), p)
        assert mb.attention_ms + mb.experts_ms + mb.shared_ms + mb.dispatch_ms + mb.combine_ms == pytest.approx(whole)
        assert min(mb.experts_ms, mb.dispatch_ms, mb.combine_ms, mb.attention_ms) > 0


def test_threshold_and_topology():
    p = _pricer()
    # below vLLM's decode threshold (32 tokens per rank) the step is not split
    for n in (1, 16, DBO_DECODE_TOKEN_THRESHOLD - 1):
        assert forward_ms_dbo(FLASH, DP8, "h200", n, p, 512) == forward_ms(FLASH, DP8, "h200", n, p, 512)
    assert forward_ms_dbo(FLASH, DP8, "h200", 64, p, 512) != forward_ms(FLASH, DP8, "h200", 64, p, 512)
    # tensor-parallel attention has no all-to-all: never split
    tp8 = parse_topology("tp8-ep8")
    assert forward_ms_dbo(FLASH, tp8, "h200", 400, p, 512) == forward_ms(FLASH, tp8, "h200", 400, p, 512)


def test_nothing_to_hide_costs_more_than_not_splitting():
    """Communication priced at 0: splitting only reads the experts' weights twice and launches twice."""
    p = _pricer({"comm"})
    for n in (64, 256, 1024):
        assert forward_ms_dbo(FLASH, DP8, "h200", n, p, 512) > forward_ms(FLASH, DP8, "h200", n, p, 512)


@pytest.mark.slow
def test_composed_profile_with_overlap():
    a = compose_profile(FLASH, DP8, "h200", None, draft_block=5)
    b = compose_profile(FLASH, DP8, "h200", None, draft_block=5, overlap="dbo")
    x = a.forward.x
    below = x < DBO_DECODE_TOKEN_THRESHOLD
    np.testing.assert_allclose(a.forward.ms[below], b.forward.ms[below])
    assert not np.allclose(a.forward.ms[~below], b.forward.ms[~below])
    assert "two-batch overlap" in b.provenance["assumptions"]["overlap"]
    assert "from 32 tokens" in b.provenance["assumptions"]["overlap"]
    assert a.provenance["assumptions"]["overlap"].startswith("none")
    for k in a.draft:  # drafter steps are not split
        np.testing.assert_allclose(a.draft[k].ms, b.draft[k].ms)
    # auto: one threshold over the CUDA-graph sizes, never slower than not splitting from it on
    c = compose_profile(FLASH, DP8, "h200", None, draft_block=5, overlap="dbo", dbo_threshold="auto")
    note = c.provenance["assumptions"]["overlap"]
    graphs = x <= 512
    assert np.all(c.forward.ms[graphs] <= a.forward.ms[graphs] + 1e-9)
    if "never split" not in note:
        t = int(note.split(" from ")[1].split()[0])
        np.testing.assert_allclose(c.forward.ms[x < t], a.forward.ms[x < t])


@pytest.mark.slow
def test_required_ops_cover_the_micro_batches():
    roof = Roofline(hardware="h200")
    recs = [dict(r, ms=roof.ms(r)) for r in required_ops(FLASH, DP8, "h200", overlap="dbo")]
    table = KernelTable("roof-as-table", {"kind": "measured", "method": "test"}, recs)
    b = compose_profile(FLASH, DP8, "h200", table, overlap="dbo")
    assert "0 of" in b.provenance["method"]
    a = compose_profile(FLASH, DP8, "h200", None, overlap="dbo")
    np.testing.assert_allclose(a.forward.ms, b.forward.ms, rtol=1e-9)


def test_bad_input_is_one_line_exit_2(tmp_path, capsys):
    out = tmp_path / "p.yaml"
    base = ["profile", "--model", "deepseek-v4-flash", "--hardware", "h200", "--out", str(out)]
    assert main(base + ["--topology", "tp8-ep8", "--overlap", "dbo"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("dsim profile compose: error: --overlap dbo") and "\n" not in err and not out.exists()
    assert main(base + ["--topology", "dp8-ep8", "--overlap", "dbo", "--dbo-threshold", "0"]) == 2
    assert "--dbo-threshold" in capsys.readouterr().err and not out.exists()
    assert parse_dbo_threshold("auto") == "auto" and parse_dbo_threshold("48") == 48
    for bad in ("x", "-1", "0", "2.5"):
        with pytest.raises(InputError):
            parse_dbo_threshold(bad)


@pytest.mark.parametrize(
    "name,threshold,holds",
    [
        ("deepseek-v4-flash-h200-dp256-ep256-dbo", 96, False),
        ("deepseek-v4-pro-h200-dp384-ep384-dbo", 72, False),
        ("deepseek-v4-flash-h200-dp8-ep8-dbo", 272, True),
        ("deepseek-v4-pro-b300-dp8-ep8-dbo", 272, True),
    ],
)
def test_paper_scenario_profiles_say_what_they_price(name, threshold, holds):
    from dsim.cost import load_profile

    p = load_profile(name)
    a = p.provenance["assumptions"]
    assert p.name == name and a["draft_block"] == 5 and p.gpus_per_replica == 1
    assert f"two-batch overlap (DeepSeek-V3 report Sec. 3.4; vLLM --enable-dbo) from {threshold} tokens" in a["overlap"]
    assert "--overlap dbo --dbo-threshold auto" in p.provenance["command"]
    assert "--draft-block 5" in p.provenance["command"]
    # format 3 with the MoE DP chunks: the per-request attention correction rides on the overlapped
    # table, and the profile says where that holds (attention on the critical path at every split size)
    assert p.request_attention is not None
    assert "chunks of 256 tokens" in a["moe_dp_chunk"]
    assert "per-request attention correction" in a["overlap"]
    # wide EP: past ~270 tokens per rank the inter-node all-to-all outlasts the attention it overlaps,
    # and the profile says so (where, and by how much per layer)
    assert ("which holds: every split size" in a["overlap"]) == holds
    assert holds or "which does not hold everywhere: at 1024 tokens per rank" in a["overlap"]
    # every paper-scenario profile prices a verify window as its tokens' one-token decodes (Sec. 5.3)
    assert "--verify-attention tokens" in p.provenance["command"] and "verify_attention" in a
    if p.provenance["topology"]["ep"] > 8:
        # one routed expert per GPU (EP = experts), its experts from the measured one-expert chain
        # (no GEMM stand-in left), the inter-node all-to-all from the DeepEP table: nothing left to the roofline
        assert p.provenance["topology"]["ep"] == load_model(p.provenance["model"]).experts
        assert "moe from h200-torch-one-expert first" in p.provenance["method"]
        assert "routed-expert lookups of a one-expert EP rank" not in p.provenance["method"]
        assert "h200-deepep-internode" in p.provenance["method"]
        assert "0 of" in p.provenance["method"] and "fell back to the roofline (none)" in p.provenance["method"]
