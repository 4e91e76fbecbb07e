"""A file of a whole set deleted from the mirror's disk outside it (by hand) is noticed at the
next look, said in the log, and fetched again checked; a set never whole is not taken for one
that lost a file."""

from __future__ import annotations

import asyncio
import hashlib
import logging

import pytest

from llmgwd.mirror.disk_check import DiskCheck
from tests.llmgwd.mirror.test_mirror import (  # noqa: F401 (sites: the fixture)
    FILES,
    REPO,
    Site,
    _fetched,
    _import,
    sites,
)

SHA = hashlib.sha256(FILES["tiny-Q4_1.gguf"]).hexdigest()


async def _add_tiny(b: Site) -> str:
    body = {"name": "tiny", "engine": "llama.cpp", "source": f"hf:{REPO}@main:*Q4_1.gguf"}
    status, m = await b.call("POST", "/models", body)
    assert status == 201, m
    await _fetched(b, "tiny")
    return str(m["source"])


async def test_a_file_deleted_outside_the_mirror_is_fetched_again(
    sites: tuple[Site, Site],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = sites
    await _import(a)
    source = await _add_tiny(b)
    check = DiskCheck(b.mirror, b.catalog)
    assert await check.look() == []  # whole
    blob = b.mirror.settings.dir / "blobs" / SHA

    blob.unlink()  # an operator's rm
    assert b.mirror.blob(SHA) is None
    with caplog.at_level(logging.WARNING):
        found = await check.look()

    assert found == [f"{source}: tiny-Q4_1.gguf"]
    assert "1 file(s) of " + source + " deleted outside the mirror" in caplog.text
    for _ in range(200):
        if blob.is_file():
            break
        await asyncio.sleep(0.05)
    assert blob.read_bytes() == FILES["tiny-Q4_1.gguf"]  # fetched again, checked
    assert await check.look() == []  # whole again: nothing more to say


async def test_a_set_never_whole_is_not_said_deleted(
    sites: tuple[Site, Site],  # noqa: F811
    caplog: pytest.LogCaptureFixture,
) -> None:
    a, b = sites
    await _import(a)
    await _add_tiny(b)
    (b.mirror.settings.dir / "blobs" / SHA).unlink()  # gone before the first look
    check = DiskCheck(b.mirror, b.catalog)

    with caplog.at_level(logging.WARNING):
        assert await check.look() == []
    assert "deleted outside the mirror" not in caplog.text
