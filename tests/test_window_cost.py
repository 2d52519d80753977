"""A decode window prices each of its steps as the cost model prices that step's own shape.

The engine simulates decode-only stretches as windows (several steps' draws and costs at once,
dsim.engine.compiled_window.window_steps); a single step goes through CostModel directly. Running the same
trace with windows of one step and of 256 steps must give the same step durations, step by step,
on the shipped MoE profiles: format 3 (the default: forward shares by token count), format 4 and
format 5 (the shard-check profile: per-request attention with step-wide key lists, and the pooling
of completed compressed-cache blocks).
"""

from __future__ import annotations

import numpy as np
import pytest

from dsim.cost import CostModel, load_profile
from dsim.engine.config import EngineConfig
from dsim.sim import SimConfig, SpecConfig, simulate
from dsim.workload import Workload


def _open_loop(n: int, seed: int) -> Workload:
    rng = np.random.default_rng(seed)
    arr = np.cumsum(rng.exponential(0.03, n))
    return Workload(
        arrival_s=arr - arr[0],
        prompt_tokens=rng.integers(64, 4000, n).astype(np.int64),
        output_tokens=rng.integers(1, 400, n).astype(np.int64),
        cls=rng.integers(0, 3, n).astype(np.int16),
        class_names=("math", "code", "chat"),
        session_id=np.full(n, -1, dtype=np.int64),
        source="open-loop test trace",
    )


@pytest.mark.parametrize(
    "profile",
    [
        "deepseek-v4-flash-h200-dp8-ep8",
        "deepseek-v4-flash-h200-dp8-ep8-torch",
        "archive/kernels/h200-torch-checks/deepseek-v4-flash-h200-shard-check.yaml",
    ],
)
@pytest.mark.parametrize(
    "spec",
    [SpecConfig(), SpecConfig("mtp"), SpecConfig("dspark", adaptive=True)],
    ids=["none", "mtp", "dspark-adaptive"],
)
def test_window_steps_cost_what_single_steps_cost(profile, spec):
    prof = load_profile(profile)
    assert CostModel(prof).request_attention is not None  # the per-request table (format 3 on)
    w = _open_loop(160, seed=5)
    a, b = (
        simulate(SimConfig(workload=w, profile=prof, spec=spec, engine=EngineConfig(max_window=mw))) for mw in (1, 256)
    )
    assert a.summary["steps"] == b.summary["steps"] > 160
    np.testing.assert_allclose(a.steps.duration_ms.to_numpy(), b.steps.duration_ms.to_numpy(), rtol=1e-9)
    np.testing.assert_allclose(a.requests.e2e_ms.to_numpy(), b.requests.e2e_ms.to_numpy(), rtol=1e-9)
