"""The front door stays a door: README.md short, and every page it and docs/ link to exists."""
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", REPO / "CONTRIBUTING.md", REPO / "STYLE.md", *sorted((REPO / "docs").glob("*.md"))]
README_MAX_LINES = 200  # nanoGPT's is 234, picotron's 67: what it is, how to start, figures, links


def test_the_readme_is_a_start_page():
    lines = len((REPO / "README.md").read_text().splitlines())
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines, at most {README_MAX_LINES}: move the detail to a page in docs/ and link it")


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(REPO)) for p in PAGES])
def test_every_relative_link_leads_to_a_file(page):
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text())
    missing = [link for link in links
               if not re.match(r"[a-z]+://|mailto:", link) and not (page.parent / link).exists()]
    assert not missing, f"{page.relative_to(REPO)} links to files that do not exist: {missing}"


def test_every_docs_page_is_reachable_from_the_readme():
    readme = (REPO / "README.md").read_text()
    orphans = [p.name for p in (REPO / "docs").glob("*.md") if f"docs/{p.name}" not in readme]
    assert not orphans, f"docs pages the README does not link: {orphans}"
