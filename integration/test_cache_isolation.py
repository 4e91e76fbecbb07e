"""client.cache_isolation on one real node (llmgwd, llmgw-agentd, the real llama-server and
SmolLM2): a key's request on another organization's prompt is not served from the engine's
cache, while its own organization's next turn is (the engine's own count of cached prompt
tokens, relayed by llmgwd at /metrics/engines, not a time)."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from integration.harness import PrivateSystemd
from integration.llmgw_node import MODEL, Node, engine_counter, llama_server, serving

CLIENT_PORT, CLUSTER_PORT = 17820, 17830  # apart from the other integration tests' ports
# About 600 tokens: several of the router's 256-character blocks, well within a slot.
PROMPT = "Notes of the week. " + " ".join(f"item {i} is on shelf {i % 7}." for i in range(120))


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    yield serving(systemd, llama_server(), CLIENT_PORT, CLUSTER_PORT)


def set_isolation(node: Node, mode: str) -> None:
    """client.cache_isolation set to mode and llmgwd started again; once the agent has started
    the engine again for it (its spec changed: --cache-ram), the replica is ready."""
    text = node.ps.read_file("/etc/llmgw/server.yaml")
    now = next(line for line in text.splitlines() if "cache_isolation:" in line)
    node.ps.write_file("/etc/llmgw/server.yaml", text.replace(now, f"  cache_isolation: {mode}"))
    (unit,) = node.engine_units()
    pid = node.main_pid(unit)
    node.ps.systemctl("restart", "llmgwd.service")
    node.ps.wait_active("llmgwd.service", timeout=60)
    node.wait(lambda: node.main_pid(unit) not in (0, pid), "the engine started again", 120)
    node.wait_ready(1)


def chat(node: Node, secret: str, messages: list[dict[str, str]]) -> dict[str, Any]:
    body = {"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0}
    request = urllib.request.Request(
        f"{node.base_url}/chat/completions",
        json.dumps(body).encode(),
        {"Authorization": f"Bearer {secret}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        answer: dict[str, Any] = json.loads(r.read())
    return answer


def served_from_cache(node: Node, name: str) -> tuple[int, int, int]:
    """A's prompt tokens, those of them B was served from the cache when it sent the same
    prompt, and those A's own next turn was (keys of no organization are each their own)."""
    scrape = node.llmgw("metrics", "token", "--json")["token"]
    a = node.llmgw("key", "create", f"{name}-a", "--json")["key"]
    b = node.llmgw("key", "create", f"{name}-b", "--json")["key"]
    prompt = [{"role": "user", "content": PROMPT}]
    sent = chat(node, a, prompt)["usage"]["prompt_tokens"]
    before = engine_counter(node, scrape, "llamacpp_prompt_tokens_cached_total")
    chat(node, b, prompt)
    by_b = engine_counter(node, scrape, "llamacpp_prompt_tokens_cached_total") - before
    turn = [{"role": "assistant", "content": "Noted."}, {"role": "user", "content": "Shelf 3?"}]
    before = engine_counter(node, scrape, "llamacpp_prompt_tokens_cached_total")
    chat(node, a, prompt + turn)
    by_a = engine_counter(node, scrape, "llamacpp_prompt_tokens_cached_total") - before
    return sent, by_b, by_a


def test_another_key_is_not_served_from_a_keys_cached_prompt(node: Node) -> None:
    """Issue 26, finding 5, with client.cache_isolation org (the default): A's prompt sent
    again by B is computed afresh; A's own next turn is served from the cache."""
    sent, by_b, by_a = served_from_cache(node, "org")
    assert by_b == 0, f"B was served {by_b} of A's {sent} prompt tokens from the cache"
    assert by_a >= sent * 0.9, f"A's own next turn took only {by_a} of {sent} from the cache"


def test_with_isolation_none_another_key_is_served_from_the_cache(node: Node) -> None:
    """The channel the setting closes, as it was and is with none: B's request on A's prompt
    is served from the cache A filled."""
    set_isolation(node, "none")
    try:
        sent, by_b, _ = served_from_cache(node, "none")
    finally:
        set_isolation(node, "org")
    assert by_b >= sent * 0.9, f"B was served only {by_b} of A's {sent} prompt tokens"
