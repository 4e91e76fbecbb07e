"""llmgwd's composition keeps usage: a clean stop writes every count before the store closes,
and a restart spends budgets from what was used before it."""

from __future__ import annotations

import calendar
import functools
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from llmgw.config import ClientPort, ClusterPort, ServerConfig
from llmgwd import daemon as daemon_module
from llmgwd.accounting.periods import day_id
from llmgwd.accounting.usage import USAGE
from llmgwd.catalog import KeyLimits, Model
from llmgwd.daemon import Daemon
from llmgwd.router import ApiError
from llmgwd.router.metering import Meter
from llmgwd.router.token_bounds import Estimate
from llmgwd.store.sqlite import SqliteStore

NOW = calendar.timegm((2025, 3, 4, 12, 0, 0))  # noon UTC, mid-month
MODEL = Model(name="smol", source="file:/m.gguf", price_prompt=1.0, price_completion=2.0)
ANSWER = json.dumps({"usage": {"prompt_tokens": 30, "completion_tokens": 70}}).encode()


@pytest.fixture
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ServerConfig:
    fixed: Callable[..., Meter] = functools.partial(Meter, wall=lambda: NOW)
    monkeypatch.setattr(daemon_module, "Meter", fixed)  # the budgets' day does not move
    return ServerConfig(
        state_dir=str(tmp_path / "state"),
        socket=str(tmp_path / "llmgwd.sock"),
        client=ClientPort(listen="127.0.0.1:0"),
        cluster=ClusterPort(listen="127.0.0.1:0", advertise="https://127.0.0.1:17710"),
    )


def answered(d: Daemon, key_id: str) -> None:
    """One request as the router meters it: admitted, answered with usage, settled."""
    keys = d.catalog.keys()
    key = next(k for k in keys if k.id == key_id)
    reservation = d.meter.admit(key, MODEL, Estimate(prompt=50, completion=100))
    reservation.tally.whole(200, ANSWER)
    reservation.settle()


async def test_stop_writes_the_usage_and_a_restart_counts_it(config: ServerConfig) -> None:
    d = Daemon(config)
    await d.start()
    key, _ = await d.catalog.create_key("alice", limits=KeyLimits(budget_tokens=250))
    answered(d, key.id)
    answered(d, key.id)
    await d.stop()

    store = await SqliteStore.open(Path(config.state_dir) / "state.db")
    try:
        kv = await store.get(f"{USAGE}{day_id(NOW)}/{key.id}/smol")
    finally:
        await store.close()
    assert kv is not None
    assert json.loads(kv.value) == {
        "requests": 2,
        "prompt_tokens": 60,
        "completion_tokens": 140,
        "spend_pico": 2 * (30 * 1_000_000 + 70 * 2_000_000),  # at 1 and 2 per million
    }

    d = Daemon(config)
    await d.start()
    try:
        assert d.meter.budgets.used(key.id, day_id(NOW)) == (200, 340_000_000)
        with pytest.raises(ApiError) as refused:  # 200 used, 150 more asked, 250 allowed
            answered(d, key.id)
        assert refused.value.detail.code == "insufficient_quota"
    finally:
        await d.stop()
