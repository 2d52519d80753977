"""The analytical roofline's smooth maximum (dsim.profiling.analytical.forward_ms, Efficiency.knee)."""

import json
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dsim.profiling.analytical import HARDWARE, Efficiency, forward_ms, model_shape

ROOT = Path(__file__).resolve().parents[1]
SHAPE = model_shape(json.loads((ROOT / "profiles" / "models" / "qwen3-14b.json").read_text()))
HW = HARDWARE["H200"]


def _terms(eff: Efficiency, n: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """t_weights, t_flops (ms) and the rest of F(n) (launch floor + activation), by hand."""
    w = (SHAPE["dense"] - SHAPE["embedding"]) * 2.0 / (HW["bw"] * eff.bw) * 1e3
    f = 2 * (SHAPE["active"] - SHAPE["embedding"]) * n / (HW["bf16"] * eff.flops) * 1e3
    rest = (
        SHAPE["layers"] * eff.launch_us_per_layer * 1e-3
        + eff.activation_ps * 1e-9 * n * SHAPE["layers"] * SHAPE["hidden"]
    )
    return np.full_like(f, w), f, rest


N = np.array([1, 8, 64, 128, 256, 512, 2048, 8192], dtype=float)


def test_knee_none_is_the_hard_maximum_and_one_is_the_sum():
    base = Efficiency(bw=0.8, launch_us_per_layer=100.0, activation_ps=50.0)
    w, f, rest = _terms(base, N)
    np.testing.assert_allclose(forward_ms(SHAPE, N, HW, 1, 2.0, base), np.maximum(w, f) + rest, rtol=1e-12)
    one = Efficiency(bw=0.8, launch_us_per_layer=100.0, activation_ps=50.0, knee=1.0)
    np.testing.assert_allclose(forward_ms(SHAPE, N, HW, 1, 2.0, one), w + f + rest, rtol=1e-12)
    two = Efficiency(bw=0.8, launch_us_per_layer=100.0, activation_ps=50.0, knee=2.0)
    np.testing.assert_allclose(forward_ms(SHAPE, N, HW, 1, 2.0, two), np.hypot(w, f) + rest, rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(k=st.floats(1.0, 20.0), bw=st.floats(0.3, 1.0))
def test_smooth_maximum_lies_between_the_maximum_and_the_sum_and_grows_with_tokens(k, bw):
    eff = Efficiency(bw=bw, launch_us_per_layer=100.0, activation_ps=50.0, knee=k)
    w, f, rest = _terms(eff, N)
    got = forward_ms(SHAPE, N, HW, 1, 2.0, eff)
    assert np.all(got >= np.maximum(w, f) + rest - 1e-9) and np.all(got <= w + f + rest + 1e-9)
    assert np.all(np.diff(got) > 0)
    # the bend is widest at the ridge point, where both terms are equal: 2^(1/k) x either
    n_ridge = w[0] / (f[0] / N[0])
    mid = forward_ms(SHAPE, np.array([n_ridge]), HW, 1, 2.0, eff)[0] - _terms(eff, np.array([n_ridge]))[2][0]
    assert abs(mid / w[0] - 2 ** (1 / k)) < 1e-9
