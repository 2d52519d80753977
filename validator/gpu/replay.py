"""Step replay: run the exact step shapes of a step log on the GPU, compare with predictions.

    python3 -m validator.gpu.replay STEPLOG [STEPLOG...] --model CONFIG --out $OUT/replay.json [--profile P.yaml]

STEPLOG: JSONL, one object per engine step {"step": i, "q": [query tokens per request],
"ctx": [KV context per request before the step], "predicted_ms": forward-only prediction}.
Steps of n <= 512 tokens run as a CUDA graph padded to the next capture size (as vLLM does),
larger ones as a CUDA graph of exactly n tokens (--eager-tails: eagerly, which times this Python
executor's kernel launches rather than the GPU work). Where predicted_ms is missing, or with
--repredict, and --profile is given, it is computed with dsim's cost model of the profile
(fit.predicted_step_ms: CostModel.step_ms plus prefill_ms for the shape's prefill chunks); the log's
own value is kept as predicted_log_ms.
`STEPLOG` may be 'synthetic': a generated log (steplog.synthetic_steplog).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dsim.cost import CostModel
from validator.gpu.fit import cost_model, predicted_step_ms
from validator.gpu.plan import (
    ATTENTION_IMPLS,
    CAPTURE_LIMIT,
    DRY_CFG,
    PREFILL_MIN_Q,
    StepShape,
    model_dims,
    padded_tokens,
    vllm_capture_sizes,
)
from validator.gpu.profile_files import write_text_atomic
from validator.gpu.steplog import concurrency_of, error_summary, read_steplog, synthetic_steplog


def load_or_make_steps(src: str) -> list[dict]:
    """A step log's steps, or a generated log for 'synthetic'."""
    if src == "synthetic":
        return synthetic_steplog()
    return read_steplog(src)


def dry_run_steps(steps: list[dict], k: int) -> list[dict]:
    """The first k small steps (<= 600 tokens, <= 32 requests), contexts capped at 200: what a CPU
    dry run can execute."""
    steps = [s for s in steps if sum(s["q"]) <= 600 and len(s["q"]) <= 32][:k]
    for st in steps:
        st["ctx"] = [min(c, 200) for c in st["ctx"]]
    return steps


def replay_steps(
    model: Any,
    steps: list[dict],
    dims: dict,
    device: Any,
    timer: Callable,
    caps: list[int],
    cost: CostModel | None = None,
    depth_scale: float = 1.0,
    eager_tails: bool = False,
    repredict: bool = False,
    big_timer: Callable | None = None,
    on_row: Callable[[list[dict]], None] | None = None,
) -> tuple[list[dict], dict]:
    """Time each step's exact shape on the executor; rows with measured and predicted ms, and their
    error summary. cost: dsim's cost model of the profile, for predictions the log lacks (or all of
    them with repredict); big_timer (optional): timer for steps above the capture limit (fewer reps
    for the long ones)."""
    from validator.gpu import model as M

    rows = []
    for st in steps:
        shape = StepShape(tuple(int(x) for x in st["q"]), tuple(int(x) for x in st["ctx"]))
        n_pad = padded_tokens(shape.n, caps)
        m = M.StepMeta(shape, n_pad, dims, device)
        graph = shape.n <= caps[-1] or not eager_tails
        tm = big_timer if (big_timer is not None and shape.n > caps[-1]) else timer
        t_start = time.time()
        ms, reps = tm(lambda: model.forward(m), graph=graph)
        pred = st.get("predicted_ms")
        if (pred is None or repredict) and cost is not None:
            pred = predicted_step_ms(cost, shape)
        dec = [c for s, c in zip(shape.q, shape.ctx) if s < PREFILL_MIN_Q]
        rows.append(
            dict(
                step=st.get("step"),
                concurrency=concurrency_of(st),
                n=shape.n,
                n_pad=n_pad,
                kv=shape.kv,
                R=shape.requests,
                graph=graph,
                mode=m.mode,
                chunks=int(m.n_chunks),
                merge_rows=int(m.merge_rows),
                ctx_max=max(dec) if dec else 0,
                prefill_tokens=sum(s for s in shape.q if s >= PREFILL_MIN_Q),
                measured_ms=ms * depth_scale,
                reps_ms=[round(r * depth_scale, 4) for r in reps],
                t_start_unix_s=round(t_start, 3),
                t_end_unix_s=round(time.time(), 3),
                predicted_ms=pred,
                predicted_log_ms=st.get("predicted_ms"),
            )
        )
        if on_row is not None:
            on_row(rows)
    return rows, error_summary(rows)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("steplog", nargs="+")
    ap.add_argument("--model", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--profile", default="", help="profile YAML for predictions missing from the log")
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=2, help="untimed graph replays before timing")
    ap.add_argument("--pool-gib", type=float, default=24.0)
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--repredict", action="store_true", help="predict from --profile even where the log has a value")
    ap.add_argument("--eager-tails", action="store_true", help="run steps above the capture limit eagerly")
    ap.add_argument(
        "--split",
        default="",
        help="decode split-KV policy (profile.py --split syntax; 'auto' is not timed here); "
        "default: the split recorded in --profile's provenance, else the executor's default",
    )
    ap.add_argument(
        "--attention-impl",
        default="split",
        choices=ATTENTION_IMPLS,
        help="the executor's attention path (as the profile was measured with: its run's attention_impl)",
    )
    ap.add_argument("--compile-dense", action="store_true", help="the dense parts through torch.compile")
    a = ap.parse_args(argv)
    import torch

    from validator.gpu import model as M
    from validator.gpu.model import Timer, parse_split

    device = torch.device("cpu" if a.dry_run else "cuda")
    if device.type == "cuda":
        M.SPLIT["sms"] = torch.cuda.get_device_properties(0).multi_processor_count
    if a.split:
        M.SPLIT.update(M.split_settings(parse_split(a.split)))
    elif a.profile:
        import yaml

        rec = yaml.safe_load(Path(a.profile).read_text()).get("provenance", {}).get("attention_check", {}).get("split")
        if rec:
            M.SPLIT.update({k: v for k, v in M.split_settings(rec).items() if k != "sms"})
    print(f"split: {json.dumps(M.SPLIT)}", flush=True)
    dtype = torch.float32 if a.dry_run else torch.bfloat16
    cfg = json.loads(Path(a.model).read_text())
    if a.dry_run:
        cfg = {**cfg, **DRY_CFG}
    dims = model_dims(cfg)
    layers = a.layers or dims["layers"]
    M.ATTENTION_IMPL["impl"] = a.attention_impl
    model = M.Model(cfg, device, dtype, layers=layers, pool_gib=a.pool_gib if not a.dry_run else 0.6)
    if a.compile_dense:
        M.compile_dense(model)
    caps = vllm_capture_sizes(CAPTURE_LIMIT)
    sc = None
    if a.profile:
        import yaml

        p = yaml.safe_load(Path(a.profile).read_text())
        sc = cost_model(p, a.profile)
    results: dict[str, dict] = {}
    timer = Timer(device, a.reps, warm=a.warm)

    def write() -> None:
        doc = dict(
            model=a.model,
            profile=a.profile,
            eager_tails=a.eager_tails,
            repredict=a.repredict,
            attention_impl=a.attention_impl,
            compiled_dense=a.compile_dense,
            logs=results,
        )
        write_text_atomic(a.out, json.dumps(doc, indent=1))

    for src in a.steplog:  # one model build, several logs; results written after every step
        t0 = time.time()
        steps = load_or_make_steps(src)
        if a.dry_run:
            steps = dry_run_steps(steps, 6)

        def partial(rows: list[dict], src: str = src) -> None:
            results[src] = dict(rows=rows, summary=error_summary(rows), partial=True)
            write()

        rows, summary = replay_steps(
            model,
            steps,
            dims,
            device,
            timer,
            caps,
            sc,
            dims["layers"] / layers,
            eager_tails=a.eager_tails,
            repredict=a.repredict,
            on_row=partial,
        )
        results[src] = dict(rows=rows, summary=summary)
        write()
        print(src, json.dumps(summary), f"({time.time() - t0:.1f}s)", flush=True)


if __name__ == "__main__":
    main()
