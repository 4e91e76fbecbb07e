"""/api/v1's upgrade: the staged packages and the roll (`llmgw upgrade`), kept in the store as
they are shown."""

from __future__ import annotations

from typing import Literal

import msgspec

from llmgw.wire import UpgradeStep

RollState = Literal["running", "halted", "aborted", "done"]
HostRole = Literal["plane", "node"]


class StagedPackage(msgspec.Struct, frozen=True, kw_only=True):
    """One package `llmgw upgrade stage` sent, kept by sha256 in the mirror's blob store."""

    kind: Literal["deb", "rpm"]
    name: str
    version: str  # the package manager's
    arch: str
    release: str  # the llmgw release it carries (what package_version() will say)
    sha256: str
    size: int
    filename: str
    staged_at: float = 0.0  # unix time


class UpgradeHost(msgspec.Struct, frozen=True, kw_only=True):
    """One host's place in the roll: a control plane's host (upgraded through its agent) or a
    node."""

    name: str
    role: HostRole
    step: UpgradeStep = "waiting"
    attempt: int = 0  # times it was told to upgrade in this roll
    # The node whose agent upgrades it: a control plane's host is named by its advertised
    # address, its agent by the host's name ("": the same as name).
    agent: str = ""
    done_bytes: int = 0
    total_bytes: int = 0
    version: str = ""  # the release it was last seen on
    message: str = ""  # a failure's why, or a note
    since: float = 0.0  # unix time of its step


class UpgradeRoll(msgspec.Struct, frozen=True, kw_only=True):
    """A roll: its hosts in order (control planes one at a time, the leader last, then the
    nodes, `parallel` at once); kept at /upgrade/roll so that a new leader carries it on."""

    id: str
    release: str
    state: RollState = "running"
    hosts: list[UpgradeHost] = []
    parallel: int = 4
    started_at: float = 0.0
    error: str = ""  # why it halted: the first host that failed and its why
    # No staged packages: each host installs its llmgw packages at `release` from its own
    # apt or dnf repositories.
    from_repositories: bool = False
    version: str = ""  # from the repositories: the package manager's, where not `release`


class UpgradeStartIn(msgspec.Struct, frozen=True, kw_only=True):
    """POST /upgrade/start: roll the staged release over the cluster (or some nodes)."""

    nodes: list[str] | None = None  # None: every node; []: the control planes only
    release: str = ""  # "": the one staged release (several staged: name one)
    parallel: int = 4  # nodes at once
    # Nothing staged: each host installs `release` (required) from its own repositories.
    from_repositories: bool = False


class UpgradeView(msgspec.Struct, frozen=True, kw_only=True):
    """GET /upgrade: what is staged, and the roll (None: none was started)."""

    staged: list[StagedPackage] = []
    roll: UpgradeRoll | None = None
