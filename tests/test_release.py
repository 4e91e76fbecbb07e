"""One release number for the three packages: debian/changelog's first entry (what
scripts/build-packages builds), the three pyproject.toml files, the .rpm spec's default and
CHANGELOG.md's newest release all say the same."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def debian_version() -> str:
    first = (ROOT / "debian/changelog").read_text().splitlines()[0]
    found = re.match(r"llmgw \(([^)]+)\)", first)
    assert found, first
    return found.group(1)


def test_every_package_and_the_changelog_carry_the_same_version() -> None:
    release = debian_version()
    for p in ("pyproject.toml", "llmgwd/pyproject.toml", "llmgw-agentd/pyproject.toml"):
        assert tomllib.loads((ROOT / p).read_text())["project"]["version"] == release, p
    spec = (ROOT / "rpm/llmgw.spec").read_text()
    assert f"%{{!?llmgw_version:%global llmgw_version {release}}}" in spec
    assert re.search(rf"^\* .* - {re.escape(release)}-1$", spec, re.M), "rpm %changelog"
    heads = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert heads and heads[0] == release, "CHANGELOG.md's newest release"
