"""A local model and an external provider's under one key, on a real llmgwd and llama-server
with SmolLM2: the provider is provider_standin (OpenAI's and Anthropic's APIs as their
references answer), added by `llmgw provider add`; one token budget spent across all three
models is exact (`llmgw usage` is the answers' usage, summed, and never over the budget), and
the credential is in no journal, answer, listing or byte of the store."""

from __future__ import annotations

import asyncio
import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web

from integration.harness import PrivateSystemd
from integration.llmgw_node import MODEL, Node, llama_server, serving
from tests.llmgwd.router.provider_standin import StandIn

CLIENT_PORT, CLUSTER_PORT = 17980, 17990  # apart from the other integration tests' ports
STAND_IN_PORT = 17995
CREDENTIAL = "sk-upstream-SEKRIT-integration-0123456789"
BUDGET = 700  # tokens a day: some requests of each model, then a refusal
HI = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def stand_in() -> Iterator[StandIn]:
    """The stand-in on the host's loopback (the private systemd shares the host's network)."""
    fake = StandIn(CREDENTIAL)
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runner = web.AppRunner(fake.app())
    asyncio.run_coroutine_threadsafe(runner.setup(), loop).result(10)
    site = web.TCPSite(runner, "127.0.0.1", STAND_IN_PORT)
    asyncio.run_coroutine_threadsafe(site.start(), loop).result(10)
    fake.url = f"http://127.0.0.1:{STAND_IN_PORT}"
    yield fake
    asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd, stand_in: StandIn) -> Iterator[Node]:
    n = serving(systemd, llama_server(), CLIENT_PORT, CLUSTER_PORT)
    systemd.write_file("/root/credential", CREDENTIAL + "\n", mode=0o600)
    for name, protocol, upstream in (("gpt", "openai", "gpt-4o-mini"),
                                     ("claude", "anthropic", "claude-opus-4-6")):  # fmt: skip
        url = f"{stand_in.url}/v1"
        n.llmgw("provider", "add", name, "--protocol", protocol, "--url", url,
                "--model", upstream, "--credential-file", "/root/credential")  # fmt: skip
    yield n


def post(node: Node, key: str, path: str, body: dict[str, Any]) -> tuple[int, str]:
    """POST body as JSON with key; the status and the answer's text."""
    data = json.dumps(body).encode()
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    url = f"http://127.0.0.1:{node.client_port}/v1/{path}"
    request = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=120) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def used(path: str, text: str) -> int:
    """The tokens an answer says it used."""
    usage = json.loads(text)["usage"]
    if path == "messages":
        return int(usage["input_tokens"] + usage["output_tokens"])
    return int(usage["prompt_tokens"] + usage["completion_tokens"])


def spend_until_refused(node: Node, key: str) -> tuple[int, list[str], dict[str, int]]:
    """Requests to the three models in turn until the budget refuses one: the tokens the
    answers said, every answer's text, and the largest reservation (body bytes + max_tokens)."""
    asks = [("chat/completions", MODEL), ("chat/completions", "gpt"), ("messages", "claude")]
    spent, texts, reserve = 0, [], {"most": 0}
    for i in range(60):
        path, model = asks[i % 3]
        body = {"model": model, "messages": HI, "max_tokens": 8}
        reserve["most"] = max(reserve["most"], len(json.dumps(body).encode()) + 8)
        status, text = post(node, key, path, body)
        texts.append(text)
        if status == 429:
            assert "quota" in text or "budget" in text, text
            return spent, texts, reserve
        assert status == 200, f"{model}: {text}\n" + node.ps.journal("llmgwd.service", 40)
        spent += used(path, text)
    raise AssertionError("the budget never refused a request")


def usage_total(node: Node) -> tuple[int, dict[str, int]]:
    report = node.llmgw("usage", "--by", "model", "--json")
    rows = {r["model"]: r["prompt_tokens"] + r["completion_tokens"] for r in report["rows"]}
    total = report["total"]
    return int(total["prompt_tokens"] + total["completion_tokens"]), rows


def test_one_budget_across_a_local_and_external_models_is_exact(
    node: Node, stand_in: StandIn
) -> None:
    key = node.llmgw("key", "create", "both", "--budget-tokens", f"{BUDGET}/day", "--json")["key"]
    spent, texts, reserve = spend_until_refused(node, key)
    assert BUDGET - reserve["most"] < spent <= BUDGET  # refused only once too little was left
    deadline = time.monotonic() + 30  # usage is flushed to the store every 5 s
    while usage_total(node)[0] < spent and time.monotonic() < deadline:
        time.sleep(1)
    total, by_model = usage_total(node)
    # the tests' key of serving() used nothing here: all of it is this key's
    assert total == spent, by_model
    assert set(by_model) == {MODEL, "gpt", "claude"}
    assert all(s.path in ("/v1/chat/completions", "/v1/messages") for s in stand_in.seen)
    assert all(s.body["model"] in ("gpt-4o-mini", "claude-opus-4-6") for s in stand_in.seen)
    for text in texts:
        assert CREDENTIAL not in text


def test_the_credential_is_in_no_journal_listing_or_store_byte(node: Node) -> None:
    said = [
        node.ps.journal(None, 100000),
        json.dumps(node.llmgw("providers", "--json")),
        json.dumps(node.llmgw("models", "--json")),
    ]
    for text in said:
        assert CREDENTIAL not in text
    assert "gpt-4o-mini" in said[1]
    found = node.ps.run(["grep", "-rlaF", CREDENTIAL, "/var/lib/llmgw"], check=False)
    assert found.returncode == 1 and not found.stdout, found.stdout
