"""A joined member is a learner until it has caught up: then a control plane promotes it; one
that never catches up is left a learner, said once, after GIVE_UP_S."""

from __future__ import annotations

import logging

import pytest

from llmgwd.planes import promotion
from llmgwd.planes.promotion import Promoter
from tests.llmgwd.fake_etcd import FakeEtcd


async def test_a_learner_is_promoted_once_caught_up(caplog: pytest.LogCaptureFixture) -> None:
    etcd = FakeEtcd()
    [learner] = [m for m in await etcd.add("https://10.0.0.2:7721") if m.learner]
    etcd.behind.add(learner.id)
    now = [0.0]
    promoter = Promoter(etcd, clock=lambda: now[0])
    assert await promoter.once() == []
    assert [m.learner for m in await etcd.members()] == [False, True]
    etcd.behind.clear()
    now[0] = 5.0
    with caplog.at_level(logging.WARNING):
        assert [m.id for m in await promoter.once()] == [learner.id]
    assert not any(m.learner for m in await etcd.members())
    assert "promoted to a voter" in caplog.text
    assert await promoter.once() == []  # nothing left to promote


async def test_a_learner_never_caught_up_is_given_up(caplog: pytest.LogCaptureFixture) -> None:
    etcd = FakeEtcd()
    await etcd.add("https://10.0.0.2:7721")
    etcd.behind.add(2)
    now = [0.0]
    promoter = Promoter(etcd, clock=lambda: now[0])
    await promoter.once()
    now[0] = promotion.GIVE_UP_S + 1
    with caplog.at_level(logging.ERROR):
        await promoter.once()
        await promoter.once()
    assert caplog.text.count("has not caught up") == 1
    assert "llmgw plane remove 2" in caplog.text
    etcd.behind.clear()
    assert await promoter.once() == []  # given up: a restarted llmgwd tries again
