"""With shares (several control planes), a level's budget pot starts from the stored usage of
every key under the level in its period, as a key's starts from its own."""

from __future__ import annotations

import calendar
from collections.abc import AsyncIterator

import msgspec
import pytest

from llmgwd.accounting.allotments import Allotments
from llmgwd.accounting.levels import LEVELS, LevelLimits, Levels, org_level
from llmgwd.accounting.periods import day_id
from llmgwd.accounting.usage import Counts, Usage, usage_key
from llmgwd.catalog import KEYS, ApiKey, KeyLimits, Model
from llmgwd.router import errors
from llmgwd.router.metering import Meter
from llmgwd.router.token_bounds import Estimate
from llmgwd.store.sqlite import SqliteStore

NOW = calendar.timegm((2025, 3, 4, 12, 0, 0))
DAY = day_id(NOW)
MODEL = Model(name="smol", source="file:/m.gguf")
OLD = ApiKey(id="k1", name="old", hash="", prefix="", user="u1", org="acme", project="p")
NEW = ApiKey(id="k2", name="new", hash="", prefix="", user="u2", org="acme", project="q")
ELSEWHERE = ApiKey(id="k3", name="else", hash="", prefix="", user="u3", org="globex")


@pytest.fixture
async def store() -> AsyncIterator[SqliteStore]:
    s = await SqliteStore.open(":memory:")
    yield s
    await s.close()


async def test_a_levels_pot_starts_from_its_keys_stored_usage(store: SqliteStore) -> None:
    for k in (OLD, NEW, ELSEWHERE):
        await store.put(KEYS + k.id, msgspec.json.encode(k))
    for k, tokens in ((OLD, 900), (ELSEWHERE, 5000)):  # used earlier today, on other planes
        counts = Counts(requests=1, prompt_tokens=tokens)
        await store.put(usage_key((DAY, k.id, MODEL.name)), msgspec.json.encode(counts))
    record = LevelLimits(limits=KeyLimits(budget_tokens=1000))
    await store.put(LEVELS + org_level("acme"), msgspec.json.encode(record))
    levels = Levels()
    await levels.load(store)
    shares = Allotments(
        store, wall=lambda: NOW, tick_s=0.01, dry_s=0.05, wait_s=2.0, keys_in=levels.keys_in
    )
    await shares.start()
    try:
        meter = Meter(Usage(store), shares=shares, levels=levels, wall=lambda: NOW)
        with pytest.raises(errors.ApiError) as caught:  # 900 + 150 > 1000
            await meter.reserve(NEW, MODEL, Estimate(prompt=50, completion=100))
        assert caught.value.detail.code == "insufficient_quota"
        assert "organization acme" in caught.value.detail.message
        (await meter.reserve(NEW, MODEL, Estimate(prompt=50, completion=50))).settle()
    finally:
        await shares.stop()
    assert levels.keys_in(org_level("acme")) == {"k1", "k2"}
