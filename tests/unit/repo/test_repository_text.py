"""The repository names features, never ticket numbers: a newcomer has no way to look a number up.

Every text file in the tree is read (code, comments, docs, deploy files, scripts); what is not ours
(the virtualenv, git's own files, build output, caches) and what is not text is passed over.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
SKIP_DIRS = {
    ".git",
    ".venv",
    "venv",
    "node_modules",
    "__pycache__",
    ".mypy_cache",
    ".ruff_cache",
    ".pytest_cache",
    "build",
    "dist",
}
# The word, then a number: with a space, a hash or a dash between, singular or plural, any case.
TICKET = re.compile(r"\bissues?[\s#-]*\d", re.IGNORECASE)


def text_files(root: Path) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        parts = path.relative_to(root).parts
        if any(p in SKIP_DIRS or p.endswith(".egg-info") for p in parts[:-1]) or not path.is_file():
            continue
        if path.stat().st_size > 2_000_000:
            continue
        found.append(path)
    return found


def ticket_numbers(root: Path) -> list[str]:
    hits = []
    for path in text_files(root):
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # not text: images, databases
        for lineno, line in enumerate(text.splitlines(), 1):
            if TICKET.search(line):
                hits.append(f"{path.relative_to(root)}:{lineno}: {line.strip()}")
    return hits


def test_no_issue_numbers_in_the_tree() -> None:
    hits = ticket_numbers(ROOT)
    assert not hits, "name the feature, not the ticket:\n" + "\n".join(hits)


WORD = "issue"  # spelled apart from its numbers below, so that this file passes its own test


@pytest.mark.parametrize(
    "line",
    [
        f"# as before {WORD} 12",
        f'"""{WORD.title()} 22 at the ingest."""',
        f"see {WORD}s 11 and 12",
        f"({WORD} #24)",
        f"the {WORD}-7 fix",
    ],
    ids=["comment", "docstring", "plural", "hash", "dash"],
)
def test_a_ticket_number_is_found(tmp_path: Path, line: str) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(f"x = 1\n{line}\n")
    assert ticket_numbers(tmp_path) == [f"pkg/mod.py:2: {line}"]


def test_what_is_not_ours_is_passed_over(tmp_path: Path) -> None:
    (tmp_path / ".venv" / "lib").mkdir(parents=True)
    (tmp_path / ".venv" / "lib" / "dep.py").write_text(f"# fixes {WORD} 42\n")
    (tmp_path / "img.png").write_bytes(b"\x89PNG\xff\xfe " + WORD.encode() + b" 1")
    (tmp_path / "mod.py").write_text("# a site issues the token; 3 tissues 4\n")
    assert ticket_numbers(tmp_path) == []


LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize(
    "doc",
    sorted(
        str(p.relative_to(ROOT))
        for p in [*ROOT.glob("*.md"), *ROOT.glob("docs/*.md"), *ROOT.glob("deploy/*.md"), *ROOT.glob("bench/*.md")]
    ),
)
def test_every_relative_link_in_the_docs_resolves(doc: str) -> None:
    """The manual lives in several files under docs/; a link that points nowhere is a manual that lies."""
    path = ROOT / doc
    missing = [
        target
        for target in LINK.findall(path.read_text())
        if "://" not in target and not target.startswith("mailto:") and not (path.parent / target).exists()
    ]
    assert not missing, f"{doc} links to files that do not exist: {missing}"
