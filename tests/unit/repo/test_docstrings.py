"""Every module says what it is for in a few words and links the docs/ section that says why.

The reasoning lives in docs/ once (docs/architecture.md#the-house-layers-imports-pointing-down);
this test keeps module docstrings short and their links to docs/ pointing at headings that exist.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
TREES = ("remediation", "watchers", "workers", "simulator", "demo")
MAX_WORDS = 90
LINK = re.compile(r"docs/([\w.-]+\.md)(?:#([\w-]+))?")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lowercase, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link shows only its text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading anchor in a markdown text; headings inside code fences are not headings."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in markdown.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        match = None if fenced else HEADING.match(line)
        if match is None:
            continue
        anchor = github_anchor(match.group(1))
        count = seen.get(anchor, 0)
        seen[anchor] = count + 1
        found.add(anchor if count == 0 else f"{anchor}-{count}")
    return found


@cache
def doc_anchors(name: str) -> set[str] | None:
    """The anchors of docs/<name>, or None when there is no such file."""
    path = ROOT / "docs" / name
    return anchors(path.read_text(encoding="utf-8")) if path.is_file() else None


def problems(path: Path) -> list[str]:
    """What is wrong with one module's docstring; empty when nothing is."""
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")))
    if doc is None:
        empty_package = path.name == "__init__.py"
        return [] if empty_package else ["no module docstring"]
    out = []
    words = len(doc.split())
    if words > MAX_WORDS:
        out.append(f"{words} words (at most {MAX_WORDS})")
    for name, anchor in LINK.findall(doc):
        known = doc_anchors(name)
        if known is None:
            out.append(f"docs/{name} does not exist")
        elif anchor and anchor not in known:
            out.append(f"docs/{name} has no heading #{anchor}")
    return out


MODULES = sorted(path.relative_to(ROOT) for tree in TREES for path in (ROOT / tree).rglob("*.py"))


@pytest.mark.parametrize("module", MODULES, ids=str)
def test_module_docstring_is_short_and_links_hold(module: Path) -> None:
    assert problems(ROOT / module) == []


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("Glossary", "glossary"),
        ("Repeat offender: 3 failures within 7 days", "repeat-offender-3-failures-within-7-days"),
        ("Throttles: max_concurrent = 4, min gap = 10 s", "throttles-max_concurrent--4-min-gap--10-s"),
        ("Ask (`workflow.checkpoint_signal`, off)", "ask-workflowcheckpoint_signal-off"),
        ("See [the policy](policy.md)", "see-the-policy"),
    ],
    ids=["word", "colon-and-digits", "equals-sign", "code-span", "link"],
)
def test_github_anchor(heading: str, anchor: str) -> None:
    assert github_anchor(heading) == anchor


def test_anchors_skip_code_fences_and_number_repeats() -> None:
    text = "# Top\n```\n# not a heading\n```\n## Top\n## Other\n"
    assert anchors(text) == {"top", "top-1", "other"}


def test_problems_finds_a_long_docstring_and_a_broken_link(tmp_path: Path) -> None:
    module = tmp_path / "mod.py"
    module.write_text('"""' + "word " * (MAX_WORDS + 1) + 'docs/policy.md#no-such-heading"""\n')
    assert problems(module) == [
        f"{MAX_WORDS + 2} words (at most {MAX_WORDS})",
        "docs/policy.md has no heading #no-such-heading",
    ]
    module.write_text('"""Short. Why: docs/nowhere.md#x"""\n')
    assert problems(module) == ["docs/nowhere.md does not exist"]
    module.write_text("x = 1\n")
    assert problems(module) == ["no module docstring"]
