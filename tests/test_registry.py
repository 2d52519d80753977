"""The registries of pluggable concepts against the code that switches on them: every registered
speculative method, verify-budget policy, verify mode, confidence head and router is one the
compiled kernels (or the router) handle, every trace format reads, detects and writes back what it
declares, and the command line's choices are the registries' names."""

import inspect
import json
import re

import numpy as np
import pytest

import reference_policy as RP
from dsim import scenario
from dsim.engine import compiled_budget, compiled_bundles, compiled_draws
from dsim.engine import router as R_
from dsim.errors import InputError
from dsim.spec import acceptance as A
from dsim.spec import budget as B
from dsim.spec import head_fit as HF
from dsim.spec import heads as H
from dsim.spec import methods as M
from dsim.workload import readers as RD


def _switch_names(fn) -> set[str]:
    """The constants a compiled function compares its code / mode / head with (``== NAME``)."""
    return set(re.findall(r"[=!]= ([A-Z][A-Z_]+)\b", inspect.getsource(fn.py_func)))


def _constant(value: int, names) -> str:
    (name,) = [n for n in names if getattr(compiled_bundles, n) == value]
    return name


def test_policy_registry_is_the_kernels_code_table():
    assert set(B.POLICY_SPELLINGS) == set(compiled_bundles.POLICY_CODES)
    for spelling, (cls, _implied) in B.POLICY_SPELLINGS.items():
        assert B.POLICIES[cls.name] is cls
        assert B.make_policy(spelling).code == compiled_bundles.POLICY_CODES[spelling], spelling
    # codes 0..n-1, so the kernels' if-chains end in one default: the highest code
    codes = sorted(compiled_bundles.POLICY_CODES.values())
    assert codes == list(range(len(codes)))
    names = ("FIXED", "THRESHOLD", "VLLM", "PAPER", "PAPER_PRODUCTION", "SGLANG")
    assert sorted(getattr(compiled_bundles, n) for n in names) == codes
    compared = _switch_names(compiled_budget._windows_scored) | _switch_names(compiled_budget.step_windows)
    handled = {n for n in names if n in compared}
    # every code but the default is named in the switch; the default is the one left
    default = _constant(codes[-1], names)
    assert handled == set(names) - {default}
    assert f"# {default}" in inspect.getsource(compiled_budget._windows_scored.py_func)


def test_every_registered_policy_runs_its_reference_definition():
    """A closed case per spelling: the kernel's windows equal tests/reference_policy.py's (the
    numpy definition each policy is written against first). A registered spelling without a
    reference fails here."""
    conf = np.array([[[0.9, 0.6, 0.2], [0.5, 0.4, 0.1]]], dtype=np.float32)  # [k=1, R=2, K=3]

    def verify_ms(t):
        return 5.0 + 0.5 * np.ceil(np.asarray(t, dtype=np.float64) / 8.0)

    args = dict(verify_ms=verify_ms, draft_ms=1.0, n_nondraft=np.full(1, 2), token_limit=6, k_max=3)
    for spelling in B.POLICY_SPELLINGS:
        got = B.make_policy(spelling).windows(conf, conf, conf, B.PolicyContext(**args))
        want = RP.make_policy(spelling).windows(conf, conf, conf, RP.PolicyContext(**args))
        assert got.tolist() == want.tolist(), spelling
        assert (got >= 0).all() and (got <= 3).all() and got.sum() + 2 <= 6, spelling


def test_verify_modes_and_heads_are_the_kernels_tables():
    assert B.VERIFY_MODES == tuple(compiled_bundles.VERIFY_CODES) == scenario.VERIFY_MODE_NAMES
    assert RP.VERIFY_MODES == B.VERIFY_MODES
    w = np.array([0, 2, 3])
    for mode, code in compiled_bundles.VERIFY_CODES.items():
        verified, cap = B.verify_tokens_and_commit(mode, w[None, :], 3)
        for i, x in enumerate(w):
            assert compiled_budget.verify_commit.py_func(code, int(x), 3) == (verified[0, i], cap[0, i]), mode


def test_head_registry_is_the_draws_switch():
    """One compiled constant per registered head, its code; the draws compare exactly the constants
    of the heads with a capability (a noisy head draws its own normal, a class-curve head copies
    its confidences from the offset rows); the head with neither is the default branch (the drawn
    acceptance itself). A head registered without its branch fails here."""
    assert H.HEADS == tuple(H.HEAD_KINDS) == tuple(H.HEAD_CODES) == scenario.HEADS
    assert [k.code for k in H.HEAD_KINDS.values()] == list(range(len(H.HEADS)))
    names = [n for n, v in vars(compiled_bundles).items() if n.startswith("HEAD_") and type(v) is int]
    assert sorted(getattr(compiled_bundles, n) for n in names) == list(range(len(H.HEADS)))
    compared = set(re.findall(r"[=!]= (HEAD_[A-Z_]+)\b", inspect.getsource(compiled_draws)))
    with_branch = {_constant(k.code, names) for k in H.HEAD_KINDS.values() if k.noisy or k.class_curve}
    assert compared == with_branch
    assert len(H.HEADS) - len(with_branch) == 1  # one default
    assert scenario.Scenario.__dataclass_fields__["head"].metadata["help"] == "confidence head: " + ", ".join(H.HEADS)
    assert H.HEAD_KINDS[H.NO_HEAD].class_curve  # a method without a head has no per-request confidence


@pytest.mark.parametrize("name", list(H.HEADS))
def test_every_registered_head_keeps_its_interface(name):
    """post: confidences in [0, 1] drawn by the compiled sampler; a class-curve head's are the class
    curve exactly, an unfitted one's the true acceptance, a noisy one's reach its AUC target (under
    the perfect head's ceiling); outcomes are Bernoulli(p_true) whatever the head."""
    kind = H.HEAD_KINDS[name]
    m = A.AcceptanceModel(A.load_acceptance("deepseek-v4", "dspark"), ("math", "code", "chat"), 5, head=name)
    assert m.kernel_params()[0] == kind.code
    rng = np.random.default_rng(3)
    cls = np.arange(2000) % 3
    d = m.sample(rng, cls, m.request_latent(rng, cls), 4)
    assert d.conf.dtype == np.float32 and ((d.conf >= 0) & (d.conf <= 1)).all()
    assert np.abs(d.accept.mean() - d.p_true.mean()) < 0.01
    auc, _ = HF.head_quality(d.conf, d.accept)
    if kind.class_curve:
        assert np.array_equal(d.conf, np.broadcast_to(m.P[cls][None], d.conf.shape).astype(np.float32))
    elif not kind.noisy:
        assert np.allclose(d.conf, d.p_true, atol=1e-6)
        assert (m.head_noise, m.head_bias, m.head_temp) == (0.0, 0.0, 1.0)
    else:
        assert m.head_noise > 0 and abs(auc - 0.85) < 0.02
    with pytest.raises(InputError, match="head: expected"):
        A.AcceptanceModel(A.load_acceptance("deepseek-v4", "dspark"), ("math",), 5, head=name + "-x")


def test_method_registry_declares_what_the_methods_do():
    assert scenario.METHODS == M.METHODS == tuple(M.METHOD_KINDS)
    for name, kind in M.METHOD_KINDS.items():
        for spelling in (name, *kind.aliases):
            m = M.make_method(spelling)
            assert m.name == name and m.k == kind.default_k and m.has_head == kind.has_head, spelling
            assert (m.model_head is not None) == kind.model_head, spelling
        assert M.acceptance_name(None, name) == kind.acceptance
        if kind.default_k:
            assert M.make_method(name, kind.k_max).k == kind.k_max
            with pytest.raises(InputError):
                M.make_method(name, kind.k_max + 1)
        # adaptive verification is open exactly to a method with a confidence head
        if kind.has_head:
            assert M.make_method(name, adaptive=True).adaptive
        else:
            with pytest.raises(InputError):
                M.make_method(name, adaptive=True)


def test_command_line_choices_are_the_registries():
    assert set(scenario.POLICY_NAMES) == set(B.POLICY_SPELLINGS)
    assert scenario.Scenario.__dataclass_fields__["router"].metadata["help"] == "router: " + ", ".join(R_.ROUTERS)
    assert R_.ROUTERS == tuple(R_.ROUTES)


def test_every_registered_router_keeps_its_interface():
    """post: an index in [0, n), the same for the same calls in the same order."""

    class Rep:
        def __init__(self, outstanding):
            self.outstanding = outstanding

    session = np.array([3, -1, 3, -1, 5, 5])
    prefixes = [np.array([7]), np.array([], dtype=np.int64), np.array([7]), np.array([9]), np.array([]), np.array([1])]
    for name in R_.ROUTERS:
        picks = []
        for _ in range(2):
            reps = [Rep(o) for o in (2, 0, 1)]
            r = R_.Router(name, reps, session, prefixes)
            out = []
            for rid in range(6):
                i = r.route(rid)
                assert 0 <= i < 3, name
                reps[i].outstanding += 1
                out.append(i)
            picks.append(out)
        assert picks[0] == picks[1], name
    assert R_.Router("round_robin", [Rep(0)] * 3).route(0) == 0


def test_format_registry_is_the_command_lines_choices():
    assert scenario.FORMAT_NAMES == RD.FORMATS == tuple(RD.FORMAT_KINDS)
    assert scenario.Scenario.__dataclass_fields__["format"].metadata["help"] == "auto, " + ", ".join(RD.FORMATS)


_NATIVE_RECORDS = [
    {
        "arrival_s": 0.0,
        "prompt_tokens": 10,
        "output_tokens": 5,
        "class": "math",
        "session_id": 3,
        "prefix_hashes": [1, 2],
    },
    {
        "arrival_s": 0.5,
        "prompt_tokens": 12,
        "output_tokens": 6,
        "class": "code",
        "session_id": 4,
        "prefix_hashes": [1, 3],
    },
]
# Two requests of each registered format, with every field it reads and yields (a format
# registered without a sample here fails).
FORMAT_SAMPLES = {
    "azure": [
        {"TIMESTAMP": "2023-11-16 18:15:46.6805900", "ContextTokens": 374, "GeneratedTokens": 44},
        {"TIMESTAMP": "2023-11-16 18:15:50.9951690", "ContextTokens": 396, "GeneratedTokens": 109},
    ],
    "mooncake": [
        {"timestamp": 0, "input_length": 600, "output_length": 20, "hash_ids": [1, 2]},
        {"timestamp": 1500, "input_length": 700, "output_length": 30, "hash_ids": [1, 3]},
    ],
    "burstgpt": [
        {"Timestamp": 0, "Session ID": 7, "Model": "ChatGPT", "Request tokens": 10, "Response tokens": 20},
        {"Timestamp": 1.5, "Session ID": 8, "Model": "ChatGPT", "Request tokens": 11, "Response tokens": 21},
    ],
    "native-csv": _NATIVE_RECORDS,
    "native-jsonl": _NATIVE_RECORDS,
    "native-parquet": _NATIVE_RECORDS,
}


def _write_sample(kind, records, path):
    if kind.container == "json":
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    elif kind.container == "csv":
        cols = list(records[0])
        cell = lambda v: " ".join(map(str, v)) if isinstance(v, list) else str(v)  # noqa: E731
        path.write_text(",".join(cols) + "\n" + "".join(",".join(cell(r[c]) for c in cols) + "\n" for r in records))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({c: [r[c] for r in records] for c in records[0]}), path)
    return path


@pytest.mark.parametrize("name", RD.FORMATS)
def test_every_registered_format_keeps_its_interface(name, tmp_path):
    """A sample of the format: detected as it, read under each spelling to the columns it declares
    it yields; without any one field it reads, refused in one line naming the field; a native
    format written back and read again is the same workload."""
    kind = RD.FORMAT_KINDS[name]
    ext = {"csv": ".csv", "json": ".jsonl", "parquet": ".parquet"}[kind.container]
    path = _write_sample(kind, FORMAT_SAMPLES[name], tmp_path / f"sample{ext}")
    assert RD.detect_format(path) == name
    w = RD.load_workload(path, name)
    for spelling in kind.aliases:
        assert RD.load_workload(path, spelling).source == w.source
    assert len(w) == 2 and w.arrival_s[0] == 0 and w.arrival_s[1] > 0
    assert (w.prompt_tokens > 0).all() and (w.output_tokens > 0).all()
    assert ("session_id" in kind.yields) == bool((w.session_id >= 0).any())
    assert ("prefix_hashes" in kind.yields) == (w.prefix_hashes is not None)
    assert ("class" in kind.yields) == (not w.class_mix_assumed)
    for field in kind.reads:
        less = [{k: v for k, v in r.items() if k != field} for r in FORMAT_SAMPLES[name]]
        bad = _write_sample(kind, less, tmp_path / f"less{ext}")
        with pytest.raises(InputError, match=re.escape(field)) as e:
            RD.load_workload(bad, name)
        assert "\n" not in str(e.value)
    if kind.writer is not None:
        for ext_out in kind.extensions:
            out = RD.save_workload(w, tmp_path / f"out{ext_out}")
            assert RD.detect_format(out) == name and RD.resolve_format("native", out) == name
            again = RD.load_workload(out)
            assert again.arrival_s.tolist() == w.arrival_s.tolist()
            assert again.class_labels.tolist() == w.class_labels.tolist()
            assert again.session_id.tolist() == w.session_id.tolist()
    with pytest.raises(InputError, match="unknown format"):
        RD.load_workload(path, name + "-x")
