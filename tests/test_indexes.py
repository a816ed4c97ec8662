"""The two indexes are complete, and no page points outside the repository.

docs/README.md links every file under docs/ (a result nobody can find is a result lost);
scripts/README.md lists every script; the README and the pages under docs/ link only files the
repository holds (a user has nothing outside it). docs/ keeps the guide's pages apart from the
results: a result's data sits in its folder under docs/results/, beside its page, and no page
speaks of the numbered work sessions that produced it (a reader has no key to them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def linked_files(index: Path) -> set[Path]:
    targets = (t.split("#", 1)[0] for t in LINK.findall(index.read_text()))
    return {(index.parent / t).resolve() for t in targets if t and "://" not in t and not t.startswith("mailto:")}


def test_every_file_under_docs_is_linked_from_its_index():
    index = REPO / "docs" / "README.md"
    files = {p.resolve() for p in (REPO / "docs").rglob("*") if p.is_file() and p != index}
    missing = sorted(str(p.relative_to(REPO)) for p in files - linked_files(index))
    assert not missing, f"docs/README.md does not link: {', '.join(missing)}"


def test_every_script_is_listed_in_the_scripts_index():
    scripts = REPO / "scripts"
    files = {p.resolve() for p in scripts.rglob("*") if p.suffix in (".py", ".sh") and p.name != "__init__.py"}
    missing = sorted(str(p.relative_to(scripts)) for p in files - linked_files(scripts / "README.md"))
    assert not missing, f"scripts/README.md does not list: {', '.join(missing)}"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_a_page_links_only_files_inside_the_repository(page):
    outside = [t for t in linked_files(page) if not t.is_relative_to(REPO)]
    dangling = [t for t in linked_files(page) if t.is_relative_to(REPO) and not t.exists()]
    # a path in backticks that climbs out of the repository (`../shared/...`) is a reference too
    climbing = re.findall(r"`(\.\./[^`]*)`", page.read_text())
    assert not (outside or dangling or climbing), \
        f"{page.relative_to(REPO)}: outside {outside}, missing {dangling}, out of the repository {climbing}"


def test_result_files_live_in_a_results_folder_not_at_the_top_of_docs():
    top = sorted(p.name for p in (REPO / "docs").iterdir() if p.is_file() and p.suffix != ".md")
    assert top == [], f"docs/: move {', '.join(top)} into docs/results/<topic>/, beside its page"
    for folder in (REPO / "docs" / "results").iterdir():
        assert (folder / "README.md").is_file(), f"{folder.relative_to(REPO)}: no README.md page for its data"


NUMBERED_SESSION = re.compile(r"\bsessions?[ -]?\d", re.IGNORECASE)


def test_the_session_pattern_sees_a_numbered_session():
    assert NUMBERED_SESSION.search("measured in Session 5's run") and NUMBERED_SESSION.search("sessions 2-8")
    assert not NUMBERED_SESSION.search("a 36-task agent session of 58 turns")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_a_page_names_no_numbered_development_session(page):
    found = [m.group(0) for m in NUMBERED_SESSION.finditer(page.read_text())]
    assert not found, f"{page.relative_to(REPO)}: {found}"


def test_the_patch_list_in_docs_is_the_series():
    """docs/patches.md names every patch patches/series applies, in its order, and no other."""
    series = [ln.split("#", 1)[0].strip() for ln in (REPO / "patches" / "series").read_text().splitlines()]
    listed = re.findall(r"^- `(\d{4}-[\w.-]+\.patch)`", (REPO / "docs" / "patches.md").read_text(), re.MULTILINE)
    assert listed == [name for name in series if name]
