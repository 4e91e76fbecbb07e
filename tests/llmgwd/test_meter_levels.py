"""The Meter's levels (a key's user, organization, team and project, accounting.levels): each one
enforced, the strictest winning, and LiteLLM's three budget bugs absent: a zero-price model
blocked by a spent budget, a budget compared with > rather than >=, and team or project keys
skipping their user's budget."""

from __future__ import annotations

import msgspec
import pytest

from llmgwd.accounting.levels import (
    LEVELS,
    LevelLimits,
    Levels,
    org_level,
    project_level,
    team_level,
    user_level,
)
from llmgwd.accounting.pricing import PICO
from llmgwd.catalog import ApiKey, KeyLimits, Model
from llmgwd.people.directory import PROJECTS
from llmgwd.people.records import Project
from llmgwd.router import errors
from llmgwd.router.metering import Meter, Reservation
from llmgwd.router.token_bounds import Estimate

NOW = 1_800_000_000.0
# 1 unit per million tokens: a token costs a millionth, so 1,000,000 tokens cost exactly 1.
PRICED = Model(name="priced", source="file:/p.gguf", price_prompt=1.0, price_completion=1.0)
FREE = Model(name="local", source="file:/l.gguf")  # no price: a local model
ASK = Estimate(prompt=500_000, completion=500_000)  # costs exactly 1 on PRICED


def key(
    ident: str, user: str = "", org: str = "", project: str = "", service: bool = False
) -> ApiKey:
    return ApiKey(
        id=ident,
        name=ident,
        hash="",
        prefix="",
        user=user,
        org=org,
        project=project,
        service=service,
    )


def put(levels: Levels, level: str, models: list[str] | None = None, **limits: object) -> None:
    record = LevelLimits(limits=KeyLimits(**limits), models=models or [])  # type: ignore[arg-type]
    levels.apply(LEVELS + level, msgspec.json.encode(record))


def project(levels: Levels, org: str, name: str, team: str = "") -> None:
    record = Project(org=org, name=name, team=team)
    levels.apply(f"{PROJECTS}{org}/{name}", msgspec.json.encode(record))


@pytest.fixture
def levels() -> Levels:
    levels = Levels()
    project(levels, "acme", "chat", team="ml")
    project(levels, "acme", "search", team="ml")
    project(levels, "acme", "ops")
    return levels


def meter(levels: Levels) -> Meter:
    return Meter(levels=levels, wall=lambda: NOW, monotonic=lambda: 1000.0)


def spend(m: Meter, k: ApiKey, model: Model = PRICED, estimate: Estimate = ASK) -> Reservation:
    """Admit a request and settle it as having used all it reserved."""
    r = m.admit(k, model, estimate)
    r.tally.answered, r.tally.usage = True, (estimate.prompt, estimate.completion)
    r.settle()
    return r


def refused(m: Meter, k: ApiKey, model: Model = PRICED, estimate: Estimate = ASK) -> str:
    """The code of the error a request gets (it must be refused)."""
    with pytest.raises(errors.ApiError) as caught:
        m.admit(k, model, estimate)
    return caught.value.detail.code or ""


ALICE_CHAT = key("a1", user="alice", org="acme", project="chat")
ALICE_OPS = key("a2", user="alice", org="acme", project="ops")
BOB_SEARCH = key("b1", user="bob", org="acme", project="search")
BOB_OPS = key("b2", user="bob", org="acme", project="ops")


@pytest.mark.parametrize(
    ("level", "shared_by"),
    [
        (user_level("alice"), (ALICE_CHAT, ALICE_OPS)),
        (org_level("acme"), (ALICE_CHAT, BOB_OPS)),
        (team_level("acme", "ml"), (ALICE_CHAT, BOB_SEARCH)),
        (project_level("acme", "ops"), (ALICE_OPS, BOB_OPS)),
    ],
)
def test_each_level_holds_every_key_under_it(
    levels: Levels, level: str, shared_by: tuple[ApiKey, ApiKey]
) -> None:
    put(levels, level, rpm=3, budget_spend=2.0)
    m = meter(levels)
    first, second = shared_by
    spend(m, first)
    spend(m, second)  # 2 spent of 2 between two keys
    assert refused(m, first) == "insufficient_quota"
    assert refused(m, second) == "insufficient_quota"
    other = key("z", user="zed", org="other", project="x")
    spend(m, other)  # another organization's key is not held by this level
    put(levels, level, rpm=2)  # no budget now: the rate is the strictest
    assert refused(m, first) == "rate_limit_exceeded"


def test_the_strictest_level_wins(levels: Levels) -> None:
    put(levels, org_level("acme"), budget_tokens=10_000_000)
    put(levels, team_level("acme", "ml"), budget_tokens=5_000_000)
    put(levels, project_level("acme", "chat"), budget_tokens=3_000_000)
    put(levels, user_level("alice"), budget_tokens=4_000_000)
    m = meter(levels)
    for _ in range(3):
        spend(m, ALICE_CHAT)
    assert refused(m, ALICE_CHAT) == "insufficient_quota"  # the project's 3M
    with pytest.raises(errors.ApiError) as caught:
        m.admit(ALICE_CHAT, PRICED, ASK)
    assert "project acme/chat" in caught.value.detail.message
    spend(m, ALICE_OPS)  # alice's 4th million, in another project
    assert "user alice" in _message(m, ALICE_OPS)
    spend(m, BOB_SEARCH)
    spend(m, BOB_SEARCH)  # the team's 5th million (alice's ops million is not the team's)
    assert "team acme/ml" in _message(m, BOB_SEARCH)


def test_the_rate_headers_show_the_limit_that_refuses_first(levels: Levels) -> None:
    # The key allows 10 a minute, its organization 3 and its project 50,000 tokens: the
    # headers show what will refuse first, whichever level holds it (a key with no limit of
    # its own gets them too).
    put(levels, org_level("acme"), rpm=3)
    put(levels, project_level("acme", "chat"), tpm=50_000)
    m = meter(levels)
    limited = msgspec.structs.replace(ALICE_CHAT, limits=KeyLimits(rpm=10))
    small = Estimate(prompt=1_000, completion=1_000)
    headers = m.admit(limited, PRICED, small).headers
    assert headers["x-ratelimit-limit-requests"] == "3"
    assert headers["x-ratelimit-remaining-requests"] == "2"
    assert headers["x-ratelimit-limit-tokens"] == "50000"
    assert headers["x-ratelimit-remaining-tokens"] == "48000"
    headers = m.admit(ALICE_CHAT, PRICED, small).headers  # the same levels, no key limit
    assert headers["x-ratelimit-remaining-requests"] == "1"
    bob = m.admit(BOB_OPS, PRICED, small).headers  # ops: the organization's rpm only
    assert bob["x-ratelimit-remaining-requests"] == "0"
    assert "x-ratelimit-limit-tokens" not in bob
    assert refused(m, limited, estimate=small) == "rate_limit_exceeded"


def _message(m: Meter, k: ApiKey) -> str:
    with pytest.raises(errors.ApiError) as caught:
        m.admit(k, PRICED, ASK)
    return caught.value.detail.message


# LiteLLM's bugs, each absent.


def test_a_model_with_no_price_is_never_blocked_by_a_spend_budget(levels: Levels) -> None:
    """LiteLLM: zero-cost local models blocked once a budget is hit."""
    put(levels, org_level("acme"), budget_spend=1.0)
    put(levels, user_level("alice"), budget_spend=1.0)
    k = msgspec.structs.replace(ALICE_CHAT, limits=KeyLimits(budget_spend=1.0))
    m = meter(levels)
    spend(m, k)  # every spend budget now used up, to the last pico
    assert refused(m, k) == "insufficient_quota"
    for _ in range(5):
        spend(m, k, FREE)  # the free model goes on
    m.budgets.add(user_level("alice"), "2027-01-15", 0, 5 * PICO)  # even overspent
    spend(m, k, FREE)
    put(levels, org_level("acme"), budget_tokens=1)  # a token budget does hold it
    assert refused(m, k, FREE) == "insufficient_quota"


@pytest.mark.parametrize("level", [None, user_level("alice"), org_level("acme")])
def test_a_budget_is_spent_up_to_its_amount_and_never_past_it(
    levels: Levels, level: str | None
) -> None:
    """LiteLLM: spend > budget rather than >=, so a spent budget lets one more through."""
    k = ALICE_CHAT
    if level is None:
        k = msgspec.structs.replace(k, limits=KeyLimits(budget_spend=10.0))
    else:
        put(levels, level, budget_spend=10.0)
    m = meter(levels)
    for _ in range(9):
        spend(m, k)  # 9 of 10 spent
    assert refused(m, k, estimate=Estimate(prompt=1_000_000, completion=1)) == (
        "insufficient_quota"  # would pass 10 by a millionth: refused
    )
    spend(m, k)  # exactly 10: allowed, the budget is 10
    assert refused(m, k, estimate=Estimate(prompt=1, completion=0)) == "insufficient_quota"
    assert m.budgets.used(level or k.id, "2027-01")[1] == 10 * PICO


@pytest.mark.parametrize(
    "other",
    [
        key("a3", user="alice", org="acme", project="search"),  # a project key
        key("a4", user="alice", org="acme", project="ops", service=True),  # a service key
        key("a5", user="alice"),  # alice's own key (staff, no project)
    ],
)
def test_project_and_team_keys_never_skip_their_users_budget(levels: Levels, other: ApiKey) -> None:
    """LiteLLM: keys of a team skip their user's budget."""
    put(levels, user_level("alice"), budget_spend=2.0)
    m = meter(levels)
    spend(m, ALICE_CHAT)
    spend(m, other)
    assert refused(m, other) == "insufficient_quota"
    assert refused(m, ALICE_CHAT) == "insufficient_quota"
    spend(m, BOB_SEARCH)  # another user in the same team and org goes on


# Which models an organization or project may use.


def test_a_model_outside_an_allow_list_is_not_found(levels: Levels) -> None:
    put(levels, org_level("acme"), models=["priced", "local"])
    put(levels, project_level("acme", "chat"), models=["local"])
    m = meter(levels)
    spend(m, ALICE_CHAT, FREE)
    with pytest.raises(errors.ApiError) as caught:
        m.admit(ALICE_CHAT, PRICED, ASK)
    assert (caught.value.status, caught.value.detail.code) == (404, "model_not_found")
    assert caught.value.detail.message == "The model 'priced' does not exist."  # nothing more told
    spend(m, ALICE_OPS)  # the organization allows it in its other projects
    assert refused(m, key("o", user="zed", org="acme"), key_model(levels)) == "model_not_found"
    spend(m, key("x", user="zed", org="other", project="x"))  # other organizations: any


def key_model(levels: Levels) -> Model:
    return Model(name="other-model", source="file:/o.gguf")


def test_a_reservation_is_held_and_released_at_every_level_at_once(levels: Levels) -> None:
    put(levels, org_level("acme"), budget_tokens=2_000_000)
    put(levels, project_level("acme", "chat"), budget_tokens=1_000_000)
    m = meter(levels)
    r = m.admit(ALICE_CHAT, PRICED, ASK)  # reserved at the project and org, in flight
    assert refused(m, ALICE_CHAT) == "insufficient_quota"
    assert refused(m, key("c2", user="carol", org="acme", project="chat")) == "insufficient_quota"
    r.settle()  # answered nothing: released everywhere, nothing counted
    spend(m, ALICE_CHAT)
    spend(m, BOB_OPS)
    assert refused(m, BOB_OPS) == "insufficient_quota"  # the org's 2M, all spent
