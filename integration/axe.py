"""npm's axe-core (pinned in axe_core/package-lock.json) installed once under ~/.cache/llmgw/npm/
and run in a Playwright page: the accessibility violations it finds there."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from playwright.sync_api import Page

SOURCE = Path(__file__).parent / "axe_core"
VERSION = "4.14.1"
HOW = "needs npm on PATH to fetch axe-core (Debian: apt-get install npm)"
SEVERE = ("serious", "critical")


def installed() -> Path | None:
    """axe.min.js, from `npm ci` once per lock file, or None where npm is missing."""
    npm = shutil.which("npm")
    if npm is None:
        return None
    lock = (SOURCE / "package-lock.json").read_bytes() + (SOURCE / "package.json").read_bytes()
    key = hashlib.sha256(lock).hexdigest()[:16]
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    where = cache / "llmgw" / "npm" / f"axe-core-{VERSION}-{key}"
    where.mkdir(parents=True, exist_ok=True)
    with open(where / ".lock", "w") as lockfile:
        fcntl.flock(lockfile, fcntl.LOCK_EX)
        if not (where / "node_modules" / ".llmgw-done").exists():
            for name in ("package.json", "package-lock.json"):
                shutil.copyfile(SOURCE / name, where / name)
            args = [npm, "ci", "--prefer-offline", "--no-audit", "--no-fund", "--loglevel=error"]
            subprocess.run(args, cwd=where, check=True, timeout=600)
            (where / "node_modules" / ".llmgw-done").touch()
    return where / "node_modules" / "axe-core" / "axe.min.js"


@dataclass(frozen=True, slots=True)
class Violation:
    """One rule broken on a page: its id, impact, words and where (CSS selectors)."""

    rule: str
    impact: str
    help: str
    where: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.impact} {self.rule} ({self.help}) at {', '.join(self.where[:5])}"


def violations(page: Page, script: Path) -> list[Violation]:
    """axe-core's serious and critical violations on the page as it stands (WCAG 2.x A and AA
    and best practices). The page's context must bypass its CSP for the script to load."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(path=str(script))
    found: list[dict[str, Any]] = page.evaluate(
        "async () => (await axe.run(document, {resultTypes: ['violations']})).violations"
    )
    return [
        Violation(v["id"], v["impact"], v["help"], tuple(" ".join(n["target"]) for n in v["nodes"]))
        for v in found
        if v.get("impact") in SEVERE
    ]
