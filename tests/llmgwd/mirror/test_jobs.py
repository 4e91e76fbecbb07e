"""A set's fetch on the mirror as `llmgw mirror status` shows it: files in flight and verifying."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from llmgw.blobstore import ChecksumMismatch
from llmgw.wire import ModelFile
from llmgwd.mirror.jobs import SetJob

SHA = "a" * 64


async def test_a_file_whose_partial_is_being_verified_is_shown_as_such() -> None:
    files = [ModelFile(path="big.gguf", size=100, sha256=SHA)]
    job = SetJob("acme/big", "c" * 40, files, parallel=2)
    verified = asyncio.Event()
    proceed = asyncio.Event()

    async def fetch_one(
        f: ModelFile, progress: Callable[[int], None], verifying: Callable[[bool], None]
    ) -> str:
        verifying(True)
        verified.set()
        await proceed.wait()
        verifying(False)
        progress(60)
        progress(100)
        return SHA

    run = asyncio.create_task(job.run(fetch_one))
    await verified.wait()
    status = job.status()
    assert status.verifying == ["big.gguf"] and status.current == ["big.gguf"]
    assert status.bytes_done == 0
    proceed.set()
    await run

    status = job.status()
    assert status.state == "done" and status.verifying == [] and status.bytes_done == 100


async def test_a_failed_file_is_raised_as_itself_for_the_callers_except_clauses() -> None:
    files = [ModelFile(path="big.gguf", size=100, sha256=SHA)]
    job = SetJob("acme/big", "c" * 40, files, parallel=2)

    async def fetch_one(
        f: ModelFile, progress: Callable[[int], None], verifying: Callable[[bool], None]
    ) -> str:
        await asyncio.sleep(0)
        raise ChecksumMismatch(f"{f.path}: sha256 expected {SHA}, got {'b' * 64}")

    # Not an ExceptionGroup: the mirror's retry loop catches ChecksumMismatch, DownloadError...
    with pytest.raises(ChecksumMismatch, match=r"big\.gguf: sha256 expected"):
        await job.run(fetch_one)
    status = job.status()
    assert status.state == "failed" and SHA in status.error
