"""A model added without --context (issue 9, finding 10): the router bounds its requests by the
context its replica's engine reports, and it still answers."""

from __future__ import annotations

import json

from integration.llmgw_node import MODEL, Node
from integration.test_single_node import node, post

__all__ = ["node"]  # the fixture, for the test here


def chat(node: Node, content: str, **extra: object) -> tuple[int, dict[str, object]]:
    body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
    status, answer = post(node, "/v1/chat/completions", json.dumps(body).encode(), node.key)
    return status, answer


def test_a_model_without_a_catalog_context_is_bounded_by_its_replica(node: Node) -> None:
    assert node.model()["context"] == 0  # SmolLM2 was added without --context
    status, answer = chat(node, "Say yes.")
    assert status == 200, answer
    # SmolLM2 was trained, and so placed, with 8,192 tokens: the engine says so in /props.
    status, answer = chat(node, "Say yes.", max_tokens=9000)
    assert status == 400 and "at most 8192 completion tokens" in str(answer), answer
    status, answer = chat(node, "word " * 9000)
    assert status == 400 and "maximum context length is 8192 tokens" in str(answer), answer
