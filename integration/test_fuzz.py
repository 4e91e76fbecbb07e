"""A fuzz run of /v1 and /api/v1 on one real node: bodies made by hypothesis, near-valid and
not, with engine-specific fields mixed in. No 5xx of llmgw's own, every error in its route's
shape, the daemons' PIDs unchanged, and the engine within its memory limit afterwards."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from integration.harness import PrivateSystemd
from integration.llmgw_node import MODEL, Node, gguf
from integration.test_single_node import llama_server

CLIENT_PORT = 17702
CLUSTER_PORT = 17712
MAX_TOKENS = 16  # the catalog's bound: what any request may make the engine generate
# Examples per route; LLMGW_FUZZ_EXAMPLES=2000 for a longer run by hand.
EXAMPLES = int(os.environ.get("LLMGW_FUZZ_EXAMPLES", "250"))
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
# 503s llmgw gives on purpose (with Retry-After): the model is starting, or busy.
EXPECTED_503 = {"model_not_ready", "model_busy"}
# Fields engines take that change how much they generate, which slot is used, or what of their
# internals they return: these must never pass as they are.
ENGINE_FIELDS = [
    "n_predict",
    "ignore_eos",
    "id_slot",
    "t_max_predict_ms",
    "cache_prompt",
    "n_probs",
    "n_keep",
    "n_discard",
    "samplers",
    "lora",
    "grammar",
    "json_schema",
    "post_sampling_probs",
    "return_tokens",
    "timings_per_token",
    "n_indent",
    "n_cmpl",
    "min_keep",
    "dry_multiplier",
    "slot_id",
    "response_fields",
    "return_progress",
    "chat_template_kwargs",
    "api_base",
]

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
small_ints = st.integers(min_value=-3, max_value=40) | st.integers(
    min_value=-(2**40), max_value=2**63
)
roles = st.sampled_from(["system", "user", "assistant", "tool", "developer", "robot", ""])
content = (
    st.text(max_size=60)
    | st.lists(
        st.fixed_dictionaries(
            {"type": st.sampled_from(["text", "image_url", "x"]), "text": st.text(max_size=20)}
        ),
        max_size=3,
    )
    | json_values
)
message = st.fixed_dictionaries(
    {"role": roles | json_values, "content": content},
    optional={"name": json_values, "tool_call_id": json_values, "tool_calls": json_values},
)
tool = st.fixed_dictionaries(
    {
        "type": st.sampled_from(["function", "code"]) | json_values,
        "function": st.fixed_dictionaries(
            {"name": st.text(max_size=12)}, optional={"parameters": json_values}
        )
        | json_values,
    }
)
model_names = st.sampled_from([MODEL, MODEL, MODEL, "no-such-model", ""]) | json_values
sampling = {
    "stream": st.booleans() | json_values,
    "max_tokens": small_ints | json_values,
    "max_completion_tokens": small_ints,
    "n": small_ints,
    "temperature": st.floats(min_value=-1, max_value=3) | json_values,
    "top_p": st.floats(min_value=-1, max_value=2),
    "stop": st.text(max_size=5) | st.lists(st.text(max_size=5), max_size=6) | json_values,
    "seed": small_ints,
    "logit_bias": st.dictionaries(st.text(max_size=6), st.integers(-200, 200), max_size=3)
    | json_values,
    "presence_penalty": st.floats(min_value=-3, max_value=3),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans() | json_values})
    | json_values,
    "user": st.text(max_size=20) | json_values,
}
engine_fields = st.dictionaries(st.sampled_from(ENGINE_FIELDS), json_values, max_size=2)
chat_body = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {"model": model_names, "messages": st.lists(message, max_size=3) | json_values},
        optional={
            **sampling,
            "logprobs": st.booleans() | json_values,
            "top_logprobs": small_ints,
            "tools": st.lists(tool, max_size=2) | json_values,
            "tool_choice": st.sampled_from(["auto", "none", "required"]) | json_values,
            "response_format": st.fixed_dictionaries(
                {"type": st.sampled_from(["text", "json_object", "x"])}
            )
            | json_values,
        },
    ),
    engine_fields,
)
prompt = (
    st.text(max_size=60)
    | st.lists(st.text(max_size=10), max_size=40)
    | st.lists(st.integers(-5, 70000), max_size=20)
    | json_values
)
completion_body = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {"model": model_names, "prompt": prompt},
        optional={
            **sampling,
            "logprobs": small_ints,
            "echo": st.booleans(),
            "best_of": small_ints,
            "suffix": st.text(max_size=10) | json_values,
        },
    ),
    engine_fields,
)
embedding_body = st.builds(
    lambda base, extra: {**base, **extra},
    st.fixed_dictionaries(
        {"model": model_names, "input": prompt},
        optional={
            "encoding_format": st.sampled_from(["float", "base64", "x"]) | json_values,
            "dimensions": small_ints,
            "user": st.text(max_size=10),
        },
    ),
    engine_fields,
)
raw_bodies = st.binary(max_size=200) | st.sampled_from(
    [b"", b"null", b"[]", b'{"model": NaN}', b"{" * 5000, b'{"model":"' + MODEL.encode() + b'"'],
)


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    n = Node(systemd, CLIENT_PORT, CLUSTER_PORT)
    n.install(llama_server())
    n.join(n.init_server())
    n.llmgw(
        "model",
        "add",
        MODEL,
        "--from",
        f"file:{gguf()}",
        "--engine",
        "llama.cpp",
        "--context",
        "2048",
        "--max-tokens",
        str(MAX_TOKENS),
    )
    n.serve_model(1)
    n.key = n.llmgw("key", "create", "fuzz", "--json")["key"]
    yield n


@pytest.fixture(scope="module")
def before(node: Node) -> dict[str, int]:
    """The daemons' and the engine's PIDs before any fuzzing."""
    units = ["llmgwd.service", "llmgw-agentd.service", *node.engine_units()]
    return {unit: node.main_pid(unit) for unit in units}


class Http:
    """Raw requests to the node's client port (bodies no official client would send)."""

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}"

    def request(self, method: str, path: str, body: bytes | None, key: str) -> tuple[int, str, str]:
        """Status, content type and text of the answer (a stream read to its end)."""
        req = urllib.request.Request(self.base + path, data=body, method=method)
        req.add_header("Authorization", f"Bearer {key}")
        req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.headers.get("Content-Type", ""), r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.headers.get("Content-Type", ""), e.read().decode("utf-8", "replace")


@pytest.fixture(scope="module")
def http(node: Node) -> Http:
    return Http(node.client_port)


def check_openai_error(data: Any, where: str) -> None:
    """OpenAI's error shape: {"error": {"message", "type", "param", "code"}}, codes as strings."""
    assert isinstance(data, dict) and isinstance(data.get("error"), dict), (where, data)
    err = data["error"]
    assert isinstance(err.get("message"), str) and err["message"], (where, data)
    assert isinstance(err.get("type"), str), (where, data)
    assert err.get("param") is None or isinstance(err["param"], str), (where, data)
    assert err.get("code") is None or isinstance(err["code"], str), (where, data)
    assert "timings" not in json.dumps(data), (where, data)


def check_v1(http: Http, key: str, path: str, body: bytes) -> None:
    """One /v1 request: no 5xx of llmgw's own, and its answer in OpenAI's shape."""
    status, content_type, text = http.request("POST", path, body, key)
    where = f"POST {path} {body[:300]!r} -> {status}: {text[:500]}"
    assert status < 500 or status == 503, where
    if content_type.startswith("text/event-stream"):
        check_events(text, where)
        return
    data = json.loads(text)
    if status == 503:
        assert data["error"]["code"] in EXPECTED_503, where
    if status >= 400:
        check_openai_error(data, where)
    else:
        assert "timings" not in data and isinstance(data.get("usage"), dict), where


def check_events(text: str, where: str) -> None:
    """A stream: every event is JSON (or [DONE]); an error event is in OpenAI's shape."""
    for line in text.splitlines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        event = json.loads(line.removeprefix("data: "))
        assert "timings" not in event, where
        if "error" in event:
            check_openai_error(event, where)


@FUZZ
@given(body=chat_body)
def test_fuzz_chat(node: Node, http: Http, before: dict[str, int], body: Any) -> None:
    check_v1(http, node.key, "/v1/chat/completions", json.dumps(body).encode())


@FUZZ
@given(body=completion_body)
def test_fuzz_completions(node: Node, http: Http, before: dict[str, int], body: Any) -> None:
    check_v1(http, node.key, "/v1/completions", json.dumps(body).encode())


@FUZZ
@given(body=embedding_body)
def test_fuzz_embeddings(node: Node, http: Http, before: dict[str, int], body: Any) -> None:
    check_v1(http, node.key, "/v1/embeddings", json.dumps(body).encode())


@FUZZ
@given(
    body=raw_bodies,
    path=st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"]),
)
def test_fuzz_raw_bodies(
    node: Node, http: Http, before: dict[str, int], body: bytes, path: str
) -> None:
    check_v1(http, node.key, path, body)


API_WRITES = [
    ("POST", "/api/v1/models"),
    ("POST", "/api/v1/keys"),
    ("PUT", "/api/v1/models/fuzzed/context"),
    ("POST", "/api/v1/models/fuzzed/serve"),
    ("POST", "/api/v1/models/fuzzed/replicas"),
    ("PATCH", "/api/v1/keys/fuzzed/limits"),
    ("PUT", "/api/v1/models/fuzzed/price"),
]


@pytest.fixture(scope="module")
def admin_key(node: Node) -> str:
    return str(node.llmgw("key", "create", "fuzz-admin", "--admin", "--json")["key"])


@FUZZ
@given(
    route=st.sampled_from(API_WRITES),
    body=json_values.map(lambda v: json.dumps(v).encode()) | raw_bodies,
    admin=st.booleans(),
)
def test_fuzz_api(
    node: Node,
    http: Http,
    admin_key: str,
    before: dict[str, int],
    route: tuple[str, str],
    body: bytes,
    admin: bool,
) -> None:
    method, path = route
    key = admin_key if admin else node.key
    status, _, text = http.request(method, path, body, key)
    where = f"{method} {path} {body[:300]!r} -> {status}: {text[:500]}"
    assert status < 500, where
    if not admin:
        assert status == 403, where
    if status >= 400:
        err = json.loads(text)["error"]
        assert isinstance(err["message"], str) and isinstance(err["code"], str), where


def test_after_the_fuzz_nothing_died_and_the_engine_kept_its_limit(
    node: Node, before: dict[str, int], http: Http
) -> None:
    """Run last in this module (pytest keeps file order)."""
    after = {unit: node.main_pid(unit) for unit in before}
    assert after == before, "a daemon or the engine was restarted by a request"
    for unit in before:
        if unit.startswith("llmgw-engine-"):
            limit = node.ps.systemctl("show", "-P", "MemoryMax", unit).stdout.strip()
            used = int(node.ps.systemctl("show", "-P", "MemoryCurrent", unit).stdout.strip())
            assert limit != "infinity", f"{unit} runs with no memory limit"
            assert used <= int(limit), f"{unit}: {used} bytes used, limit {limit}"
            assert node.restarts(unit) == 0, f"{unit} was restarted"
    journal = node.ps.journal("llmgwd.service", 5000)
    assert node.key not in journal
    assert "Error handling request" not in journal, "aiohttp's own traceback reached the journal"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    status, _, text = http.request(
        "POST", "/v1/chat/completions", json.dumps(chat).encode(), node.key
    )
    assert status == 200, text
