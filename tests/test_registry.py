"""The registries of pluggable concepts against the code that switches on them: every registered
speculative method, verify-budget policy, verify mode, confidence head and router is one the compiled kernels (or the
router) handle, and the command line's choices are the registries' names."""

import inspect
import re

import numpy as np
import pytest

import reference_policy as RP
from dsim import scenario
from dsim.engine import compiled_step as K_
from dsim.engine import router as R_
from dsim.errors import InputError
from dsim.spec import budget as B
from dsim.spec import methods as M


def _switch_names(fn) -> set[str]:
    """The constants a compiled function compares its code / mode / head with (``== NAME``)."""
    return set(re.findall(r"[=!]= ([A-Z][A-Z_]+)\b", inspect.getsource(fn.py_func)))


def _constant(value: int, names) -> str:
    (name,) = [n for n in names if getattr(K_, n) == value]
    return name


def test_policy_registry_is_the_kernels_code_table():
    assert set(B.POLICY_SPELLINGS) == set(K_.POLICY_CODES)
    for spelling, (cls, _implied) in B.POLICY_SPELLINGS.items():
        assert B.POLICIES[cls.name] is cls
        assert B.make_policy(spelling).code == K_.POLICY_CODES[spelling], spelling
    # codes 0..n-1, so the kernels' if-chains end in one default: the highest code
    codes = sorted(K_.POLICY_CODES.values())
    assert codes == list(range(len(codes)))
    names = ("FIXED", "THRESHOLD", "VLLM", "PAPER", "PAPER_PRODUCTION", "SGLANG")
    assert sorted(getattr(K_, n) for n in names) == codes
    compared = _switch_names(K_._windows_scored) | _switch_names(K_.step_windows)
    handled = {n for n in names if n in compared}
    # every code but the default is named in the switch; the default is the one left
    default = _constant(codes[-1], names)
    assert handled == set(names) - {default}
    assert f"# {default}" in inspect.getsource(K_._windows_scored.py_func)


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
    assert B.VERIFY_MODES == tuple(K_.VERIFY_CODES) == scenario.VERIFY_MODE_NAMES
    assert RP.VERIFY_MODES == B.VERIFY_MODES
    w = np.array([0, 2, 3])
    for mode, code in K_.VERIFY_CODES.items():
        verified, cap = B.verify_tokens_and_commit(mode, w[None, :], 3)
        for i, x in enumerate(w):
            assert K_.verify_commit.py_func(code, int(x), 3) == (verified[0, i], cap[0, i]), mode
    assert set(K_.HEAD_CODES) == set(scenario.HEAD_MODES)
    assert sorted(K_.HEAD_CODES.values()) == list(range(len(K_.HEAD_CODES)))
    # the draws switch on every head but the default (perfect: the drawn acceptance itself)
    src = inspect.getsource(K_)
    for name in ("HEAD_MODEL", "HEAD_USELESS"):
        assert f"head == {name}" in src or f"head != {name}" in src, name


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
