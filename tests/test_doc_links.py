"""The docs hang together: every relative link and anchor of README.md and docs/*.md
resolves, every page is in the site's navigation, and (when mkdocs is installed, the
``docs`` extra) the site builds with ``mkdocs build --strict`` and the API reference in it."""
import os
import re
import shutil
import subprocess
import sys

import pytest
from doc_pages import DOCS, ROOT, broken_links, pages, slug


def test_every_relative_link_and_anchor_resolves():
    assert [bad for page in pages() for bad in broken_links(page)] == []


def test_the_checker_reports_what_does_not_resolve(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# A `code` heading: with, punctuation\n\n## Second\n\n"
                    "[ok](#a-code-heading-with-punctuation) [ok2](#second) [bad anchor](#third)\n"
                    "[missing](nowhere.md) [ok3](https://example.org/x.md) `[in code](nowhere.md)`\n"
                    "```bash\necho '[in a block](nowhere.md)'\n```\n", encoding="utf-8")
    assert [b.split(": ", 1)[1] for b in broken_links(page)] == ["#third (no such anchor)",
                                                                "nowhere.md (no such file)"]


def test_anchors_are_the_ones_mkdocs_makes():
    assert slug("Operating a broker's store") == "operating-a-brokers-store"
    assert slug("CLI reference: the `rmqstore` command") == "cli-reference-the-rmqstore-command"
    assert slug("Keeping an embedded store small") == "keeping-an-embedded-store-small"


def _nav_pages():
    """The pages mkdocs.yml's nav names, commented-out entries left out."""
    text = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    return set(re.findall(r"^\s*-\s[^#\n]*:\s*(\S+\.md)\s*$", text, re.M))


def test_every_page_is_in_the_nav():
    present = {p.name for p in DOCS.glob("*.md")}
    assert present - _nav_pages() == set()
    assert _nav_pages() - present == set()


def test_site_builds_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("pdoc")
    docs = tmp_path / "docs"
    shutil.copytree(DOCS, docs, symlinks=False, ignore=shutil.ignore_patterns("api"))
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-m", "pdoc", "rmqstore", "-o", str(docs / "api")], capture_output=True,
                       text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    p = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    site = tmp_path / "site"
    for page in DOCS.glob("*.md"):
        built = site / ("index.html" if page.stem == "index" else f"{page.stem}/index.html")
        assert built.is_file(), built
    assert "MessageStore.get_messages" in (site / "api" / "rmqstore.html").read_text(encoding="utf-8")
