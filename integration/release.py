"""The previous tagged release, runnable: its tag's tree and a venv synced from its own uv.lock,
built once and cached under ~/.cache/llmgw/releases/VERSION, and installed into a private
systemd in place of this checkout's daemons."""

from __future__ import annotations

import fcntl
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from integration.harness import CACHE, REPO, PrivateSystemd, drop_in

PREVIOUS = "0.1.0"
# `git rev-parse v0.1.0^{commit}`: a clone without tags (CI's checkout) may still hold it.
PREVIOUS_COMMIT = "d652b4f871a483b45eb6fcdbda7394b06ff35f93"
DAEMONS = ("llmgwd", "llmgw-agentd")


@dataclass(frozen=True)
class Release:
    """A release's tree (root) at commit, with its own venv in root/.venv."""

    version: str
    commit: str
    root: Path

    @property
    def venv(self) -> Path:
        return self.root / ".venv"


def _git(*args: str) -> str:
    r = subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else ""


def commit_of(version: str, fallback: str) -> str:
    """The commit tagged v{version}, else fallback where this clone holds it; "" when neither."""
    found = _git("rev-parse", "--verify", "--quiet", f"v{version}^{{commit}}")
    return found or _git("rev-parse", "--verify", "--quiet", f"{fallback}^{{commit}}")


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _uv() -> str:
    mine = REPO / ".venv/bin/uv"
    return str(mine) if mine.exists() else (shutil.which("uv") or "uv")


def _build(release: Release, say: Callable[[str], None]) -> None:
    """git archive the commit into root, then uv sync --frozen its venv (no dev tools)."""
    shutil.rmtree(release.root, ignore_errors=True)
    release.root.mkdir(parents=True)
    t = time.monotonic()
    say(f"llmgw {release.version}: git archive {release.commit[:12]} into {release.root}")
    archive = subprocess.Popen(["git", "-C", str(REPO), "archive", release.commit],
                               stdout=subprocess.PIPE)  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(release.root)], stdin=archive.stdout, check=True)
    if archive.wait() != 0:
        raise RuntimeError(f"git archive {release.commit} failed")
    say(f"llmgw {release.version}: uv sync --frozen (its own uv.lock)")
    subprocess.run([_uv(), "sync", "--frozen", "--quiet", "--no-dev", "--all-packages",
                    "--python", "/usr/bin/python3"], cwd=release.root, check=True)  # fmt: skip
    subprocess.run([str(release.venv / "bin/python"), "-m", "compileall", "-q",
                    *(str(release.root / d) for d in ("src", "llmgwd", "llmgw-agentd"))],
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    say(f"llmgw {release.version}: built in {time.monotonic() - t:.1f} s")


def previous(say: Callable[[str], None] = _stderr) -> Release | str:
    """The previous release, built from its tag or reused from the cache (keyed by version
    and commit); a string saying why not where this clone lacks its commit."""
    commit = commit_of(PREVIOUS, PREVIOUS_COMMIT)
    if not commit:
        return (f"the commit of v{PREVIOUS} ({PREVIOUS_COMMIT[:12]}) is not in this clone: "
                f"git fetch --tags")  # fmt: skip
    base = CACHE / "releases" / PREVIOUS
    base.mkdir(parents=True, exist_ok=True)
    release = Release(PREVIOUS, commit, base / "src")
    built = base / "built"  # the commit whose tree and venv are in src, once complete
    with (base / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; the others wait and reuse it
        if built.exists() and built.read_text().strip() == commit and release.venv.is_dir():
            say(f"llmgw {PREVIOUS}: cached in {release.root} ({commit[:12]})")
            return release
        built.unlink(missing_ok=True)
        _build(release, say)
        built.write_text(commit + "\n")
    return release


def previous_debs(say: Callable[[str], None] = _stderr) -> list[Path] | str:
    """The previous release's .debs, built by its own scripts/build-packages from a worktree
    of its commit, once (under previous()'s lock): cached in ~/.cache/llmgw/releases/VERSION/
    debs; a string saying why not where this clone lacks its commit."""
    commit = commit_of(PREVIOUS, PREVIOUS_COMMIT)
    if not commit:
        return (f"the commit of v{PREVIOUS} ({PREVIOUS_COMMIT[:12]}) is not in this clone: "
                f"git fetch --tags")  # fmt: skip
    base = CACHE / "releases" / PREVIOUS
    out, built = base / "debs", base / "debs" / "built"
    base.mkdir(parents=True, exist_ok=True)
    with (base / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if built.exists() and built.read_text().strip() == commit:
            return sorted(out.glob("*.deb"))
        shutil.rmtree(out, ignore_errors=True)
        tree = base / "worktree"  # build-packages copies what git tracks: a worktree, not src
        _git("worktree", "remove", "--force", str(tree))
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), commit],
                       check=True, capture_output=True)  # fmt: skip
        try:
            say(f"llmgw {PREVIOUS}: building its .debs from {commit[:12]}")
            argv = [str(tree / "scripts/build-packages"), "--deb", "--no-lint", "--out", str(out)]
            r = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            if r.returncode != 0:
                raise RuntimeError(f"build-packages of {commit[:12]} failed:\n{r.stderr[-3000:]}")
        finally:
            _git("worktree", "remove", "--force", str(tree))
        built.write_text(commit + "\n")
    return sorted(out.glob("*.deb"))


def run_release(ps: PrivateSystemd, release: Release, daemons: tuple[str, ...] = DAEMONS) -> None:
    """Run daemons in ps from release, with that release's own units, as its package would
    (call before they start). Its venv may lie under /root: the daemons' users may pass
    through the directories above it (in ps's overlay only) and ProtectHome is read-only."""
    shut = [str(d) for d in release.root.parents if not d.stat().st_mode & 0o001]
    if shut:
        ps.run(["chmod", "o+x", *shut])
    for daemon in daemons:
        unit = f"{daemon}.service"
        ps.write_file(f"/etc/systemd/system/{unit}", (release.root / "units" / unit).read_text())
        ps.write_file(f"/etc/systemd/system/{unit}.d/checkout.conf",
                      drop_in(release.venv / "bin" / daemon))  # fmt: skip
    ps.systemctl("daemon-reload")
