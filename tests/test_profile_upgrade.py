"""Older profile formats are read through one upgrade (dsim.cost.profile_upgrade): an older file
loads to the same profile and step costs as the file in the current format, the upgrade of a
current file changes nothing, an inconsistent older file is refused naming the section, and
`dsim profile upgrade` writes whole or not at all."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_contract import assert_rejected, run_cli, tree
from dsim.cost import CostModel, load_profile, profile_from_dict, profile_to_dict
from dsim.cost.profile_upgrade import FORMAT_VERSION, SECTION_VERSIONS, upgrade_profile
from dsim.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "profiles").rglob("*.yaml") if "models" not in p.parts)
# measured profiles kept as written (formats 3 and 5): read through the upgrade
ARCHIVED = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "archive" / "kernels").rglob("*.yaml"))
# Step costs of real profiles under the loader before the upgrade existed, which read formats 1 to 5
# by their own branches (tests/fixtures/profile-costs.json; the profiles under profiles/ were then in
# formats 1, 2 and 3, the archived ones are still in 3 and 5). A deliberate change of the cost model
# rewrites it: {rel: costs(CostModel(load_profile(rel))) for rel in PINNED}, as JSON.
PINNED = json.loads((ROOT / "tests" / "fixtures" / "profile-costs.json").read_text())
STEPS = [(1, 0), (7, 3000), (64, 100000), (300, 250000), (5000, 400000)]
CHUNKS = [[(512, 0)], [(2048, 65536), (100, 3)], [(8192, 131072)]]
CONTEXT = [([1, 4, 8], [100, 50000, 120000], [(512, 4096)]), ([2] * 16, list(range(1000, 17000, 1000)), [])]


@functools.cache
def _raw_text(rel: str) -> str:
    return (ROOT / rel).read_text()


def raw(rel: str) -> dict:
    return yaml.safe_load(_raw_text(rel))


def oldest_format(d: dict) -> int:
    """The oldest format that allows d's sections."""
    need = 1
    for path, v in SECTION_VERSIONS:
        cur = d
        for k in path:
            cur = cur.get(k) if isinstance(cur, dict) else None
        if cur is not None:
            need = max(need, v)
    return need


def as_format(d: dict, version: int) -> dict:
    """d (in the current format) as a file of format ``version`` says it, in its place (version 1:
    no format_version at all)."""
    if version == 1:
        return {k: v for k, v in d.items() if k != "format_version"}
    return {k: (version if k == "format_version" else v) for k, v in d.items()}


def costs(cm: CostModel) -> dict:
    r = {"step_ms": [float(cm.step_ms_one(n, kv)) for n, kv in STEPS]}
    r["prefill_ms"] = [float(cm.prefill_ms(c)) for c in CHUNKS]
    r["context_ms"] = [float(cm.context_ms(q, c, ch)) for q, c, ch in CONTEXT]
    r["draft_ms"] = {k: [float(cm.draft_table_ms(k, n)) for n in (1, 33, 700)] for k in sorted(cm.profile.draft)}
    return r


@pytest.mark.parametrize("rel", sorted(PINNED))
def test_step_costs_are_those_the_per_version_loader_gave(rel):
    """Exact floats: the shipped profiles rewritten in the current format and the archived ones
    upgraded on read price every step as the loader with a branch per format did."""
    assert costs(CostModel(load_profile(str(ROOT / rel)))) == PINNED[rel]


@pytest.mark.parametrize("rel", SHIPPED)
def test_shipped_profiles_are_current_and_their_upgrade_changes_nothing(rel):
    d = raw(rel)
    assert d["format_version"] == FORMAT_VERSION
    assert upgrade_profile(d) == d and list(upgrade_profile(d)) == list(d)


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(rel=st.sampled_from(SHIPPED + ARCHIVED), data=st.data())
def test_an_older_format_upgrades_to_the_current_file_and_prices_the_same(rel, data):
    cur = upgrade_profile(raw(rel))
    assert upgrade_profile(cur) == cur  # idempotent
    lo = oldest_format(cur)
    v = data.draw(st.integers(lo, FORMAT_VERSION), label="format_version")
    old = as_format(cur, v)
    before = json.dumps(old)
    up = upgrade_profile(old)
    assert json.dumps(old) == before  # the input is left as it was
    assert up == cur and list(up) == list(cur)
    p_old, p_cur = profile_from_dict(old, "old.yaml"), profile_from_dict(cur, "cur.yaml")
    assert p_old.format_version == v
    assert profile_to_dict(p_old) == profile_to_dict(p_cur)
    assert costs(CostModel(p_old)) == costs(CostModel(p_cur))
    if lo > 1:  # one format too old for a section it carries: refused, naming the section
        with pytest.raises(InputError, match=f"^old.yaml: .*: needs format_version: {lo}$"):
            profile_from_dict(as_format(cur, lo - 1), "old.yaml")


def test_format_version_out_of_range_is_refused():
    d = raw(SHIPPED[0])
    for bad, msg in ((FORMAT_VERSION + 1, "newer than this dsim reads"), (0, "must be >= 1"), ("2", "integer")):
        with pytest.raises(InputError, match=f"^x.yaml: format_version: .*{msg}"):
            profile_from_dict(dict(d, format_version=bad), "x.yaml")


def test_a_file_without_format_version_gets_it_where_profile_to_dict_writes_it():
    d = raw("profiles/analytical/deepseek-v4-class-h200x8.yaml")
    old = as_format(d, 1)
    assert "format_version" not in old
    up = upgrade_profile(old)
    written = [k for k in profile_to_dict(profile_from_dict(old)) if k in up]
    assert list(up) == written and up["format_version"] == FORMAT_VERSION
    assert upgrade_profile("not a mapping") == "not a mapping"


# ---- dsim profile upgrade ---------------------------------------------------------------------


def _old_file(tmp_path: Path, version: int = 2, rel: str = "profiles/h200/h200-qwen3-8b.yaml") -> Path:
    d = as_format(upgrade_profile(raw(rel)), version)
    d["provenance"] = {k: v for k, v in d["provenance"].items() if k != "format_upgrades"}
    p = tmp_path / "old.yaml"
    p.write_text(yaml.safe_dump(d, sort_keys=False, width=120))
    return p


def test_cli_upgrade_writes_the_current_format_and_notes_it(tmp_path):
    src = _old_file(tmp_path)
    text = src.read_text()
    out = tmp_path / "new.yaml"
    rc, so, err = run_cli("profile", "upgrade", src, "--out", out)
    assert rc == 0 and "format_version 2 -> 5" in so, err
    assert src.read_text() == text  # --out leaves the input alone
    new = yaml.safe_load(out.read_text())
    (note,) = new["provenance"].pop("format_upgrades")
    assert note["from_format_version"] == 2 and note["to_format_version"] == FORMAT_VERSION
    assert note["by"].startswith("dsim ") and len(note["date"]) == 10
    assert new == upgrade_profile(yaml.safe_load(text))
    assert costs(CostModel(load_profile(str(out)))) == costs(CostModel(load_profile(str(src))))
    # current: nothing to do, nothing written
    before = out.read_bytes()
    rc, so, _ = run_cli("profile", "upgrade", out, "--in-place")
    assert rc == 0 and "nothing written" in so and out.read_bytes() == before
    # in place
    rc, _, err = run_cli("profile", "upgrade", src, "--in-place")
    assert rc == 0, err
    assert yaml.safe_load(src.read_text())["format_version"] == FORMAT_VERSION


def test_cli_upgrade_bad_input_is_one_line_exit_2_nothing_written(tmp_path):
    src = _old_file(tmp_path)
    w = tmp_path
    out = tmp_path / "new.yaml"
    assert_rejected("profile", "upgrade", src, needles=("--out", "--in-place"), watch=w)
    assert_rejected("profile", "upgrade", src, "--out", out, "--in-place", needles=("--in-place",), watch=w)
    d = yaml.safe_load(src.read_text())
    bad = tmp_path / "bad.yaml"
    for mapping, needles in (
        (as_format(d, 1), ("bad.yaml:", "attention: needs format_version: 2")),
        (dict(d, format_version=FORMAT_VERSION + 1), ("bad.yaml:", "format_version", "newer")),
        ({k: v for k, v in d.items() if k != "forward"}, ("bad.yaml", "missing field 'forward'")),
        (dict(d, kv_ms_per_ktok=-1), ("bad.yaml:", "kv_ms_per_ktok", "must be >= 0")),
    ):
        bad.write_text(yaml.safe_dump(mapping, sort_keys=False))
        text = bad.read_text()
        assert_rejected("profile", "upgrade", bad, "--out", out, needles=needles, watch=w)
        assert_rejected("profile", "upgrade", bad, "--in-place", needles=needles, watch=w)
        assert bad.read_text() == text
    # the loader every command uses refuses it the same way
    bad.write_text(yaml.safe_dump(as_format(d, 1), sort_keys=False))
    assert_rejected("simulate", "--profile", bad, "--requests", "5", needles=("attention: needs format_version: 2",))
    bad.write_text("name: [unclosed\n")
    assert_rejected("profile", "upgrade", bad, "--out", out, needles=("bad.yaml:", "not valid YAML"), watch=w)
    assert_rejected("profile", "upgrade", tmp_path / "absent.yaml", "--out", out, needles=("absent.yaml",), watch=w)
    out.write_text("mine\n")
    before = tree(w)
    assert_rejected("profile", "upgrade", src, "--out", out, needles=("exists", "--force"), watch=w)
    assert out.read_text() == "mine\n" and tree(w) == before
    rc, _, err = run_cli("profile", "upgrade", src, "--out", out, "--force")
    assert rc == 0 and yaml.safe_load(out.read_text())["format_version"] == FORMAT_VERSION, err
    assert_rejected("profile", "upgrade", src, "--out", tmp_path, needles=("directory",), watch=w)
