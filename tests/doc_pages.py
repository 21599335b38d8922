"""The documentation as the tests read it: README.md and docs/*.md, their fenced code blocks
(with the ``<!-- norun: reason -->`` tag that keeps a block from running), and their
relative links and heading anchors, checked the way mkdocs resolves them."""
from __future__ import annotations

import importlib.util
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"

RUNNABLE = {"bash", "sh", "console", "python"}
FENCE = re.compile(r"^(?:<!-- norun: (?P<norun>[^\n]*?) -->\n)?```(?P<lang>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$",
                   re.M | re.S)
LINK = re.compile(r"(?<!!)\[(?P<text>[^\]\n]*)\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$", re.M)


def pages() -> list[Path]:
    """README.md and every docs/*.md page (docs/api is generated HTML, not a page)."""
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]


def name(page: Path) -> str:
    return page.relative_to(ROOT).as_posix()


@dataclass
class Block:
    page: str
    line: int
    lang: str
    body: str
    norun: str | None   # the reason given in <!-- norun: ... -->, or None


def blocks(page: Path) -> list[Block]:
    """The fenced code blocks of a page, in order."""
    text = page.read_text(encoding="utf-8")
    return [Block(name(page), text.count("\n", 0, m.start("lang")) + 1, m["lang"].strip(), m["body"], m["norun"])
            for m in FENCE.finditer(text)]


def _unfenced(text: str) -> str:
    """The page with its fenced blocks blanked (lines kept)."""
    return FENCE.sub(lambda m: "\n" * m[0].count("\n"), text)


def _prose(text: str) -> str:
    """The page without its code: fenced blocks and inline code spans blanked (lines kept)."""
    return re.sub(r"`[^`\n]*`", "", _unfenced(text))


def slug(heading: str) -> str:
    """The anchor mkdocs (Python-Markdown's toc) gives a heading: code marks and punctuation
    dropped, lower case, runs of spaces and hyphens as one hyphen."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m[1] or "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def anchors(page: Path) -> set[str]:
    return {slug(m[2]) for m in HEADING.finditer(_unfenced(page.read_text(encoding="utf-8")))}


def _api_page_exists(rel: str) -> bool:
    """docs/api is pdoc's output, built before the site: api/rmqstore.html and
    api/rmqstore/<module>.html name the modules pdoc documents."""
    module = rel.removesuffix(".html").replace("/", ".")
    return rel.endswith(".html") and module.split(".")[0] == "rmqstore" and (
        importlib.util.find_spec(module) is not None)


def broken_links(page: Path) -> list[str]:
    """Every relative link of ``page`` whose file or anchor does not resolve, as
    'page:line: target (why)'. External links (a scheme or //) are left out."""
    out = []
    text = _prose(page.read_text(encoding="utf-8"))
    for m in LINK.finditer(text):
        target = m["target"]
        if re.match(r"[a-z][a-z0-9+.-]*:|//", target):
            continue
        path, _, anchor = target.partition("#")
        where = f"{name(page) if page.is_relative_to(ROOT) else page}:{text.count(chr(10), 0, m.start()) + 1}: {target}"
        dest = (page.parent / path) if path else page
        rel_docs = dest.resolve().relative_to(DOCS.resolve()).as_posix() if dest.resolve().is_relative_to(
            DOCS.resolve()) else None
        if rel_docs is not None and rel_docs.startswith("api/"):
            if not _api_page_exists(rel_docs[4:]) or anchor:
                out.append(f"{where} (no such API page)")
            continue
        if not dest.exists():
            out.append(f"{where} (no such file)")
            continue
        if anchor and (dest.suffix != ".md" or anchor not in anchors(dest)):
            out.append(f"{where} (no such anchor)")
    return out
