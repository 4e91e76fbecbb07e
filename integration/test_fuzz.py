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

from integration import fuzz_routes as fz
from integration.fuzz_routes import (
    EXPECTED_503,
    check_openai_error,
    engine_fields,
    json_values,
    raw_bodies,
    small_ints,
)
from integration.harness import PrivateSystemd
from integration.llmgw_node import MODEL, Node, gguf, llama_server

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
    path=st.sampled_from(
        ["/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/rerank"]
    ),
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


# Anthropic's Messages API, the Responses API, rerank and transcriptions.

ANTHROPIC_AUTH = st.sampled_from(["bearer"] * 3 + ["x-api-key"] * 3 + ["wrong", "none"])
JSON = ("Content-Type", "application/json")


def post_json(node: Node, path: str, body: bytes, auth: str = "bearer") -> fz.Answer:
    headers = [JSON, *fz.auth_headers(auth, node.key)]
    return fz.tally(fz.send(node.client_port, "POST", path, body, headers))


def as_bytes(body: Any) -> bytes:
    return body if isinstance(body, bytes) else json.dumps(body).encode()


@FUZZ
@given(body=fz.messages_body | raw_bodies, auth=ANTHROPIC_AUTH)
def test_fuzz_messages(node: Node, before: dict[str, int], body: Any, auth: str) -> None:
    answer = post_json(node, "/v1/messages", as_bytes(body), auth)
    fz.check_anthropic_answer(answer, count=False)
    assert auth not in ("wrong", "none") or answer.status == 401, answer.where


@FUZZ
@given(body=fz.count_body | raw_bodies, auth=ANTHROPIC_AUTH)
def test_fuzz_count_tokens(node: Node, before: dict[str, int], body: Any, auth: str) -> None:
    answer = post_json(node, "/v1/messages/count_tokens", as_bytes(body), auth)
    fz.check_anthropic_answer(answer, count=True)
    assert auth not in ("wrong", "none") or answer.status == 401, answer.where


@FUZZ
@given(body=fz.responses_body)
def test_fuzz_responses(node: Node, before: dict[str, int], body: Any) -> None:
    fz.check_responses_answer(post_json(node, "/v1/responses", as_bytes(body)))


@FUZZ
@given(body=fz.rerank_body)
def test_fuzz_rerank(node: Node, before: dict[str, int], body: Any) -> None:
    fz.check_openai_answer(post_json(node, "/v1/rerank", as_bytes(body)))


@FUZZ
@given(form=fz.transcription_form(), expect=st.booleans())
def test_fuzz_transcriptions(
    node: Node, before: dict[str, int], form: tuple[bytes, str], expect: bool
) -> None:
    body, kind = form
    headers = fz.auth_headers("bearer", node.key)
    headers += [("Content-Type", kind)] if kind else []
    headers += [("Expect", "100-continue")] if expect else []
    answer = fz.tally(fz.send(node.client_port, "POST", "/v1/audio/transcriptions", body, headers))
    fz.check_openai_answer(answer)


# The hub's protocol at /hf: a set a model uses (the user key sees it) and one no model uses
# (only staff see it).

HUB_FILES = {
    "README.md": "A set imported for the fuzz.\n",
    "notes/params.json": json.dumps({"temperature": 0.2}) + "\n",
    "deep/a/b/data.txt": "".join(f"{i:05d}\n" for i in range(800)),
    "empty.txt": "",
}


def mirror_import(node: Node, files: dict[str, str], repo: str) -> str:
    """files imported into the node's mirror as repo; its commit."""
    where = f"/srv/import/{repo}"
    for path, text in files.items():
        node.ps.write_file(f"{where}/{path}", text)
    return str(node.llmgw("mirror", "import", where, "--as", repo, "--json")["commit"])


@pytest.fixture(scope="module")
def hub(node: Node, admin_key: str) -> fz.HubSet:
    commit = mirror_import(node, HUB_FILES, "fuzz/set")
    mirror_import(node, {"secret.txt": "only staff see this set\n"}, "fuzz/hidden")
    node.llmgw("model", "add", "fuzz-hf", "--from", "hf:fuzz/set", "--engine", "llama.cpp")
    files = {p: t.encode() for p, t in HUB_FILES.items()}
    hub = fz.HubSet("fuzz/set", "fuzz/hidden", commit, files)
    for key, hidden in ((node.key, 404), (admin_key, 200)):
        auth = fz.auth_headers("bearer", key)
        seen = fz.send(node.client_port, "GET", "/hf/api/models/fuzz/set", None, auth)
        assert seen.status == 200, seen.where
        seen = fz.send(node.client_port, "GET", "/hf/api/models/fuzz/hidden", None, auth)
        assert seen.status == hidden, seen.where
    return hub


@FUZZ
@given(
    data=st.data(),
    query=fz.hub_query,
    method=st.sampled_from(["GET", "GET", "HEAD"]),
    who=st.sampled_from(["user"] * 3 + ["staff"] * 3 + ["wrong", "none"]),
)
def test_fuzz_hub(
    node: Node,
    admin_key: str,
    hub: fz.HubSet,
    before: dict[str, int],
    data: st.DataObject,
    query: str,
    method: str,
    who: str,
) -> None:
    path = data.draw(fz.hub_paths(hub), "path")
    headers = data.draw(fz.hub_headers(hub), "headers")
    key = {"user": node.key, "staff": admin_key}.get(who, "")
    headers += fz.auth_headers("bearer" if key else who, key)
    answer = fz.tally(fz.send(node.client_port, method, path + query, None, headers))
    fz.check_hub_answer(answer, head=method == "HEAD")
    if answer.status < 400 and who in ("wrong", "none"):
        raise AssertionError(f"no key, yet answered: {answer.where}")
    info = f"/hf/api/models/{hub.hidden}"
    hidden = path == info or path.startswith((info + "/", f"/hf/{hub.hidden}/"))
    assert not (hidden and who == "user" and answer.status < 400), answer.where
    if answer.status in (200, 206) and method == "GET" and "/resolve/" in path:
        fz.check_hub_bytes(answer, hub)


# SCIM, with its own token: users and groups made first, then every route fuzzed.

SCIM_ROUTES = [
    ("GET", "/Users", None), ("GET", "/Groups", None), ("POST", "/Users", "user"),
    ("POST", "/Groups", "group"), ("GET", "/Users/{}", None), ("PUT", "/Users/{}", "user"),
    ("PATCH", "/Users/{}", "patch"), ("PATCH", "/Users/{}", "patch"),
    ("DELETE", "/Users/{}", None), ("GET", "/Groups/{}", None), ("PUT", "/Groups/{}", "group"),
    ("PATCH", "/Groups/{}", "patch"), ("DELETE", "/Groups/{}", None),
    ("POST", "/.search", "search"), ("POST", "/Users/.search", "search"),
    ("POST", "/Groups/.search", "search"), ("GET", "/Schemas/{}", None),
    ("GET", "/ResourceTypes/{}", None), ("GET", "/ServiceProviderConfig", None),
    ("PUT", "/Users", "user"), ("GET", "/Nope", None), ("POST", "/Users/{}/x", "user"),
]  # fmt: skip


@pytest.fixture(scope="module")
def scim_token(node: Node) -> str:
    return str(node.llmgw("scim", "token", "--json")["token"])


@pytest.fixture(scope="module")
def scim_ids(node: Node, scim_token: str) -> list[str]:
    """Two users' ids and a group's (of both), made by SCIM."""
    headers = [("Content-Type", fz.MEDIA), *fz.auth_headers("bearer", scim_token)]
    ids = []
    for name in ("ada", "bea"):
        doc = {"schemas": [fz.USER], "userName": name, "emails": [{"value": f"{name}@x.org"}]}
        made = fz.send(node.client_port, "POST", "/scim/v2/Users", as_bytes(doc), headers)
        assert made.status == 201, made.where
        ids.append(made.json()["id"])
    group = {"schemas": [fz.GROUP], "displayName": "fuzzers",
             "members": [{"value": i} for i in ids]}  # fmt: skip
    made = fz.send(node.client_port, "POST", "/scim/v2/Groups", as_bytes(group), headers)
    assert made.status == 201, made.where
    return [*ids, made.json()["id"]]


@FUZZ
@given(
    data=st.data(),
    route=st.sampled_from(SCIM_ROUTES),
    query=fz.scim_query,
    token=st.sampled_from(["scim"] * 9 + ["key", "wrong", "none"]),
    media=st.sampled_from([fz.MEDIA, fz.MEDIA, "application/json", "text/plain", ""]),
)
def test_fuzz_scim(
    node: Node,
    scim_token: str,
    scim_ids: list[str],
    before: dict[str, int],
    data: st.DataObject,
    route: tuple[str, str, str | None],
    query: dict[str, str],
    token: str,
    media: str,
) -> None:
    method, path, kind = route
    ident = data.draw(fz.scim_ident(scim_ids, deleting=method == "DELETE"), "id")
    path = "/scim/v2" + path.format(ident) + ("?" + fz.quoted(query) if query else "")
    body = None
    if kind is not None:
        body = as_bytes(data.draw(fz.scim_bodies(scim_ids)[kind] | raw_bodies, "body"))
    secret = {"scim": scim_token, "key": node.key}.get(token, "")
    headers = fz.auth_headers("bearer" if secret else token, secret)
    headers += [("Content-Type", media)] if media else []
    answer = fz.tally(fz.send(node.client_port, method, path, body, headers))
    fz.check_scim_answer(answer)
    assert token == "scim" or answer.status == 401, answer.where


def test_after_the_fuzz_nothing_died_and_the_engine_kept_its_limit(
    node: Node, before: dict[str, int], http: Http, admin_key: str, scim_token: str
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
    for secret in (node.key, admin_key, scim_token):
        assert secret not in journal
    assert "Error handling request" not in journal, "aiohttp's own traceback reached the journal"
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}
    status, _, text = http.request(
        "POST", "/v1/chat/completions", json.dumps(chat).encode(), node.key
    )
    assert status == 200, text
