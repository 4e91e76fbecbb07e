"""Package code silences mypy only with a code and a reason: each `# type: ignore[code]` is
followed by a comment saying why (a library with no types, and which)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = [REPO / "src", REPO / "llmgwd" / "src", REPO / "llmgw-agentd" / "src"]
EXPLAINED = re.compile(r"# type: ignore\[[a-z-]+(, [a-z-]+)*\]  # \w")


def test_every_type_ignore_names_its_code_and_reason() -> None:
    unexplained, seen = [], 0
    for root in PACKAGES:
        for path in sorted(root.rglob("*.py")):
            for n, line in enumerate(path.read_text().splitlines(), 1):
                if "type: ignore" in line:
                    seen += 1
                    if not EXPLAINED.search(line):
                        unexplained.append(f"{path.relative_to(REPO)}:{n}: {line.strip()}")
    assert seen  # the tree was read (authlib's imports have theirs)
    assert unexplained == []
