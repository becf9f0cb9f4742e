"""Every relative link and #anchor in README.md, CHANGELOG.md and docs/*.md resolves.

Anchors are made as GitHub makes them from headings (lower case, punctuation
dropped, spaces to hyphens, a repeated heading numbered -1, -2, ...), so a
renamed or moved section breaks this test rather than the reader's click.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]
PAGES = sorted(
    [REPOSITORY / "README.md", REPOSITORY / "CHANGELOG.md", *(REPOSITORY / "docs").glob("*.md")]
)
README_LIMIT = 300  # issue 23: a README for users, at most 300 lines

_FENCE = re.compile(r"^(```|~~~).*?^\1[^\n]*$", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced blocks and inline code, where `[a](b)` is not a link."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    return re.sub(r"[^\w\- ]", "", text.replace("`", "").strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+?)\s*$", _FENCE.sub("", page.read_text()), re.M):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def links(page: Path) -> list[str]:
    return [
        target
        for target in _LINK.findall(prose(page.read_text()))
        if not re.match(r"[a-z][a-z0-9+.-]*:", target)
    ]  # http:, https:, mailto:


def test_the_slugs_are_githubs() -> None:
    assert (
        slug("Limits: what any client can make the server hold")
        == "limits-what-any-client-can-make-the-server-hold"
    )
    assert (
        slug("Short-lived logins from the kubelet's credential-provider plugins")
        == "short-lived-logins-from-the-kubelets-credential-provider-plugins"
    )
    assert slug("`mirrors[].onMirrorDown`") == "mirrorsonmirrordown"
    assert slug("1. The image") == "1-the-image"
    assert slug("Production clusters: EKS, GKE, AKS") == "production-clusters-eks-gke-aks"


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    """The negative control: the checks below can fail."""
    page = tmp_path / "page.md"
    page.write_text(
        "# Title\n\n## Same\n\n## Same\n\n[a](#same-1) [b](#nowhere) `[c](#code)`\n"
        "```\n[d](#fenced)\n```\n[e](https://example.com/#x)\n"
    )
    assert anchors(page) == {"title", "same", "same-1"}
    assert links(page) == ["#same-1", "#nowhere"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPOSITORY)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading #{anchor} in {destination.name}")
    assert not broken, broken


def test_the_readme_is_for_users() -> None:
    """At most 300 lines; the rest is under docs/."""
    assert len((REPOSITORY / "README.md").read_text().splitlines()) <= README_LIMIT


def test_the_readme_draws_the_flow() -> None:
    """One Mermaid diagram: Pod -> API server -> mirrorgate (patch + Secret) -> kubelet -> mirror.

    Mermaid ends a message at `;` and starts a comment at `#`: neither may appear in it."""
    (diagram,) = re.findall(r"```mermaid\n(.*?)```", (REPOSITORY / "README.md").read_text(), re.S)
    messages = re.findall(r"^\s*(\w+)-{1,2}>>(\w+): (.*)$", diagram, re.M)
    assert [(a, b) for a, b, _ in messages] == [
        ("C", "A"),
        ("A", "M"),
        ("M", "A"),
        ("M", "A"),
        ("A", "K"),
        ("K", "R"),
    ]
    assert "Secret" in messages[2][2]
    assert "patch" in messages[3][2]
    assert not any(";" in text or "#" in text for _, _, text in messages)
