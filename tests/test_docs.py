"""The documentation's links resolve: every relative Markdown link in a tracked .md file names a file
of the tree (and, with #anchor, one of that page's headings), and every page under docs/ that code,
tests or docs name by its repository path exists. A page moved without its links fails here."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]+)\)")
# a page's repository path in prose or code; "--out docs/..." names a file a command writes
MENTION = re.compile(r"(?<![\w/.])(?<!--out )(docs/[\w./-]+\.md)")
# a page of another repository, e.g. "deepseek-ai/DeepEP docs/legacy.md" or "DeepEP V1 (docs/legacy.md)"
OTHER_REPO = re.compile(r"(\b[\w.-]+/[\w.-]+ |DeepEP V\d \()$")


def _tracked() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode:
        pytest.skip("not a git checkout")
    return [ROOT / n for n in listed.stdout.splitlines() if (ROOT / n).is_file()]


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _links(text: str) -> list[str]:
    text = re.sub(r"```.*?```", "", text, flags=re.S)  # code blocks
    text = re.sub(r"`[^`\n]*`", "", text)  # inline code
    return [m.group(2) for m in LINK.finditer(text)]


def broken_links(page: Path) -> list[str]:
    out = []
    name = page.relative_to(ROOT) if page.is_relative_to(ROOT) else page.name
    for target in _links(page.read_text()):
        if re.match(r"^[a-z]+:", target):  # https:, mailto:
            continue
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{name}: {target}: no such file")
        elif frag and dest.suffix == ".md":
            heads = {_anchor(h.lstrip("#")) for h in dest.read_text().splitlines() if h.startswith("#")}
            if frag not in heads:
                out.append(f"{name}: {target}: no such heading")
    return out


def test_every_relative_link_of_the_docs_resolves():
    bad = [b for p in _tracked() if p.suffix == ".md" for b in broken_links(p)]
    assert bad == []


def test_every_mentioned_page_exists():
    bad = []
    for p in _tracked():
        try:
            text = p.read_text()
        except UnicodeDecodeError:
            continue
        for m in MENTION.finditer(text):
            if not (ROOT / m[1]).exists() and not OTHER_REPO.search(text[max(0, m.start() - 60) : m.start()]):
                bad.append(f"{p.relative_to(ROOT)}: {m[1]}")
    assert bad == []


def test_the_checks_can_fail(tmp_path):
    page = ROOT / "docs" / "user" / "usage.md"
    assert broken_links(page) == []
    fake = tmp_path / "probe.md"
    usage = page.resolve()
    fake.write_text(f"[a]({usage}) [b](gone.md) [c]({usage}#no-such-heading) `[d](x.md)`\n")
    assert [b.split(": ")[1] for b in broken_links(fake)] == ["gone.md", f"{usage}#no-such-heading"]
    assert MENTION.findall("see docs/user/usage.md; --out docs/new.md") == ["docs/user/usage.md"]
