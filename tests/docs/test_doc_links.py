"""Every relative link in README.md, docs/ and benchmarks/RESULTS.md resolves: the file exists and,
where the link names an anchor, the Markdown file has a heading with that anchor (GitHub's slugs).
Moving a section breaks the links to it; this test names each one."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code, where a link is a link."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return re.sub(r"`[^`\n]*`", "", text)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip()).lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    text = re.sub(r"^```.*?^```", "", path.read_text(), flags=re.MULTILINE | re.DOTALL)
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        base = slug(heading)
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def broken_links(page: Path) -> list[str]:
    broken = []
    for match in LINK.finditer(prose(page.read_text())):
        target = match.group(1) or match.group(2)
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{page.relative_to(ROOT)}: {target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{page.relative_to(ROOT)}: {target}: no heading with anchor #{anchor}")
    return broken


def test_slugs_are_githubs():
    assert slug("`benchmarks/weights.py`: weights between two pods") == "benchmarksweightspy-weights-between-two-pods"
    assert slug("SFT on a teacher's samples") == "sft-on-a-teachers-samples"
    assert slug("Replicas, leader election and failover") == "replicas-leader-election-and-failover"


def test_every_relative_link_resolves():
    assert len(PAGES) > 5
    broken = [b for page in PAGES for b in broken_links(page)]
    assert not broken, "\n".join(broken)
