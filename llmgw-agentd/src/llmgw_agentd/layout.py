"""The agent's two directories, and the move from the layout before them: state (private:
the node's key, records) in /var/lib/llmgw-agent, cache (world-readable, fetched or built
again if lost: the model cache, vLLM environments, llama-server builds) in
/var/cache/llmgw-agent."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

from llmgw.config import AgentConfig

log = logging.getLogger("llmgw_agentd.layout")

CACHE = Path("/var/cache/llmgw-agent")
# Where the layout before kept what the cache holds now (models and engines under
# /var/lib/llmgw-agentd, llama-server builds under /var/cache/llmgw).
OLD_MODELS = Path("/var/lib/llmgw-agentd/models")
OLD_ENGINES = Path("/var/lib/llmgw-agentd/engines")
OLD_BUILDS = Path("/var/cache/llmgw/llama.cpp")


def moves(config: AgentConfig) -> list[tuple[Path, Path]]:
    """(old, new) for each directory that moved and that this config leaves at its default
    (a place agent.yaml names is the site's, and stays where it is)."""
    found = [(OLD_BUILDS, CACHE / "llama.cpp")]  # where llamacpp.SYSTEM_CACHE has them
    defaults = AgentConfig()
    if config.models_dir == defaults.models_dir:
        found.append((OLD_MODELS, Path(config.models_dir)))
    if config.engines.dir == defaults.engines.dir:
        found.append((OLD_ENGINES, Path(config.engines.dir)))
    return found


def adopt_old(config: AgentConfig) -> None:
    """At start: each old directory still there goes to its new place, once."""
    for old, new in moves(config):
        try:
            adopt(old, new)
        except OSError as e:
            log.warning("%s left where it is, not moved to %s: %s", old, new, e.strerror)


def adopt(old: Path, new: Path) -> str:
    """Move old to new (renamed: fast, on one filesystem) and leave a link at old, since the
    units of engines started before the upgrade name files under it; across filesystems (or
    from a mount point) new is a link to old instead, read in place. What was done, said."""
    if old.is_symlink() or not old.is_dir():
        return "nothing"  # a node installed with this layout, or one moved already
    if new.is_symlink() or (new.exists() and (not new.is_dir() or any(new.iterdir()))):
        log.warning("%s and %s both exist: %s is not used (remove it)", old, new, old)
        return "both"
    if new.exists():
        new.rmdir()  # made empty at a start before this one
    new.parent.mkdir(mode=0o755, parents=True, exist_ok=True)  # engines' users walk it
    try:
        os.rename(old, new)
    except OSError as e:
        if e.errno not in (errno.EXDEV, errno.EBUSY):
            raise
        new.symlink_to(old)
        log.info("%s is on another filesystem: used where it is (%s links to it)", old, new)
        return "linked"
    old.symlink_to(new)
    log.info("moved %s to %s (a link to it left in its old place)", old, new)
    return "moved"
