"""Runs the node's Slurm set-up (slurm/setup.py) as the transient oneshot unit
llmgw-slurm-setup.service over D-Bus, outside the agent's sandbox, and reads what it did."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

import msgspec
from dbus_fast import Variant

from llmgw_agentd.slurm import install
from llmgw_agentd.slurm.setup import UNIT, Done, Order

ORDER, DONE = "slurm-setup-order.json", "slurm-setup-done.json"  # in the agent's state dir
TIMEOUT_S = install.INSTALL_S + 120.0  # an install, then the rest


class Transient(Protocol):
    """What is asked of systemd (llmgw_agentd.systemd.Systemd)."""

    async def start_transient(
        self, name: str, argv: Sequence[str], properties: Sequence[tuple[str, Variant]]
    ) -> str: ...
    async def reset_failed(self, name: str) -> None: ...


class SetupUnit:
    """One set-up at a time (the keeper's lock holds it), in the unit UNIT."""

    def __init__(
        self, systemd: Transient, state_dir: Path, proxy_env: Mapping[str, str] | None = None
    ) -> None:
        self._systemd = systemd
        self._proxy_env = dict(proxy_env or {})  # network.proxy's, for the package installs
        self._order = state_dir / ORDER
        self._done = state_dir / DONE

    async def __call__(self, order: Order) -> Done:
        """Run order in the unit, wait for it to end; what it did (or why it failed)."""
        self._order.parent.mkdir(parents=True, exist_ok=True)
        self._done.unlink(missing_ok=True)
        fd = os.open(self._order, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(msgspec.json.encode(msgspec.structs.replace(order, proxy_env=self._proxy_env)))
        argv = [sys.executable, "-m", "llmgw_agentd.slurm.setup", str(self._order), str(self._done)]
        props = [
            ("Description", Variant("s", "llmgw: the node's Slurm set up (packages, files)")),
            ("Type", Variant("s", "oneshot")),
            ("TimeoutStartUSec", Variant("t", int(TIMEOUT_S * 1e6))),
        ]
        result = ""
        try:
            await self._systemd.reset_failed(UNIT)
            result = await self._systemd.start_transient(UNIT, argv, props)
            return msgspec.json.decode(self._done.read_bytes(), type=Done)
        except (OSError, msgspec.DecodeError):
            return Done(message=f"{UNIT} ended {result!r}: see journalctl -u {UNIT}")
        finally:
            self._order.unlink(missing_ok=True)
