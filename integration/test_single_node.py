"""One node on a real systemd: llmgwd and llmgw-agentd from units/, the real llama-server and
SmolLM2, and the official openai client against /v1."""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from integration.harness import REPO, PrivateSystemd
from integration.llmgw_node import MODEL, Node, gguf, llama_server, serving
from integration.steady import Stream
from llmgw import pki

CLIENT_PORT = 17700  # not 7700: a quickstart cluster may run on this machine too
CLUSTER_PORT = 17710


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    yield serving(systemd, llama_server(), CLIENT_PORT, CLUSTER_PORT)


@pytest.fixture
def client(node: Node) -> openai.OpenAI:
    return openai.OpenAI(base_url=node.base_url, api_key=node.key, max_retries=0, timeout=120)


def post(node: Node, path: str, body: bytes, key: str | None = None) -> tuple[int, Any]:
    """A raw POST (for bodies the openai client would never send)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{node.client_port}{path}",
        data=body,
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    if key is not None:
        req.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_chat_answers_through_llmgwd(client: openai.OpenAI) -> None:
    r = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=16
    )
    assert r.choices[0].message.content
    assert r.usage is not None and r.usage.completion_tokens > 0


def test_completions_answers(client: openai.OpenAI) -> None:
    r = client.completions.create(model=MODEL, prompt="The capital of France is", max_tokens=8)
    assert r.choices[0].text


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert MODEL in [m.id for m in client.models.list()]


def test_a_stream_arrives_as_the_engine_makes_it(client: openai.OpenAI) -> None:
    arrivals: list[float] = []
    text = ""
    stream = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Count from one to twenty."}],
        max_tokens=64, stream=True, temperature=0, seed=7,  # the same, long answer every run
    )  # fmt: skip
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic())
            text += chunk.choices[0].delta.content
    assert len(arrivals) > 5 and text
    # Passed on as made, not buffered: the chunks did not all land at one moment.
    assert arrivals[-1] - arrivals[0] > 0.05


def test_errors_have_openai_shape_and_status(node: Node, client: openai.OpenAI) -> None:
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=node.base_url, api_key="sk-llmgw-wrong", max_retries=0).models.list()
    status, body = post(node, "/v1/chat/completions", b"{}", key=None)
    assert status == 401 and "error" in body
    with pytest.raises(openai.NotFoundError) as nf:
        client.chat.completions.create(model="no-such-model", messages=msgs)
    assert nf.value.code == "model_not_found"
    status, body = post(
        node, "/v1/chat/completions", b'{"model": "smollm2", "messages": [', node.key
    )
    assert status == 400 and set(body["error"]) >= {"message", "type", "param", "code"}
    status, body = post(node, "/v1/chat/completions", b'{"model": 5, "messages": []}', node.key)
    assert status == 400 and body["error"]["param"] == "model"
    status, body = post(node, "/v1/chat/completions", b"x" * (5 * 1024 * 1024), node.key)
    assert status == 413 and "error" in body
    # In the catalog but not served: 503, and the daemon says why.
    node.llmgw(
        "model", "add", "parked", "--from", "file:/nonexistent.gguf", "--engine", "llama.cpp"
    )
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="parked", messages=msgs)
    assert e.value.status_code == 503


def test_agent_restart_during_a_stream(node: Node, client: openai.OpenAI) -> None:
    [unit] = node.engine_units()
    pid = node.main_pid(unit)
    chunks: list[str] = []
    done = threading.Event()
    problems: list[BaseException] = []

    def read() -> None:
        try:
            stream = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "Tell a long story."}],
                max_tokens=200, stream=True,
            )  # fmt: skip
            for chunk in stream:
                if chunk.choices and chunk.choices[0].delta.content:
                    chunks.append(chunk.choices[0].delta.content)
                    if len(chunks) == 5:
                        started.set()
        except BaseException as e:
            problems.append(e)
        finally:
            done.set()

    started = threading.Event()
    t = threading.Thread(target=read)
    t.start()
    assert started.wait(60), "the stream never began"
    node.ps.systemctl("restart", "llmgw-agentd.service")
    assert done.wait(120)
    t.join()
    assert not problems and len(chunks) > 5
    node.ps.wait_active("llmgw-agentd.service")
    node.wait_ready(1)
    assert node.engine_units() == [unit] and node.main_pid(unit) == pid  # no second engine
    assert client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    ).choices


def test_a_killed_engine_is_seen_restarted_and_served_again(
    node: Node, client: openai.OpenAI
) -> None:
    [unit] = node.engine_units()
    pid = node.main_pid(unit)
    node.ps.run(["kill", "-9", str(pid)])
    # The agent saw it by D-Bus and started it again: a new process, a counted restart.
    node.wait(lambda: node.model()["replica_status"][0]["restarts"] >= 1
              and node.main_pid(unit) not in (0, pid), "engine restarted")  # fmt: skip
    node.wait_ready(1)
    log = node.ps.journal("llmgw-agentd.service", 200)
    assert unit.removesuffix(".service") in log or "restart" in log
    assert client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    ).choices


def test_llmgwd_restart_keeps_catalog_keys_and_replicas(node: Node, client: openai.OpenAI) -> None:
    [unit] = node.engine_units()
    pid = node.main_pid(unit)
    keys_before = node.llmgw("key", "list", "--json")
    node.ps.systemctl("restart", "llmgwd.service")
    node.ps.wait_active("llmgwd.service")
    node.wait(lambda: all(n["connected"] for n in node.llmgw("nodes", "--json")), "agent back")
    node.wait_ready(1)
    assert node.model()["replicas"] == 1
    assert node.llmgw("key", "list", "--json") == keys_before
    assert node.main_pid(unit) == pid  # the engine was kept, not started again
    assert client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=4
    ).choices


def test_a_restart_of_llmgwd_fails_no_request(node: Node) -> None:
    """`systemctl restart llmgwd` (what an upgrade does) under steady /v1 load, the official
    client's retries off: every request is answered, those sent in the gap by the new llmgwd
    (systemd held the client port's socket meanwhile)."""
    with Stream(node.key, [node.base_url]) as load:
        time.sleep(2)  # the load under way
        t_restart = time.time()
        node.ps.systemctl("restart", "llmgwd.service")
        node.ps.wait_active("llmgwd.service")
        time.sleep(3)  # and after
    load.report("llmgwd restarted", t_restart)
    during = [r for r in load.rows if r["t0"] <= t_restart + 1 and r["t1"] >= t_restart]
    assert load.rows and not load.failures(), load.failures()[:3]
    assert during, "no request was in flight across the restart"


def test_a_restart_of_the_agent_fails_no_request(node: Node) -> None:
    """`systemctl restart llmgw-agentd` (an upgrade does one) under steady /v1 load: the new
    agent says its engine ready in its first Register, so the router never lacks it."""
    [unit] = node.engine_units()
    pid = node.main_pid(unit)
    with Stream(node.key, [node.base_url]) as load:
        time.sleep(2)
        t_restart = time.time()
        node.ps.systemctl("restart", "llmgw-agentd.service")
        node.ps.wait_active("llmgw-agentd.service")
        node.wait(lambda: all(n["connected"] for n in node.llmgw("nodes", "--json")), "agent back")
        time.sleep(2)
    load.report("llmgw-agentd restarted", t_restart)
    assert load.rows and not load.failures(), load.failures()[:3]
    assert node.main_pid(unit) == pid


def test_bad_input_never_kills_a_daemon(node: Node, tmp_path: Path) -> None:
    pids = {u: node.main_pid(u) for u in ("llmgwd.service", "llmgw-agentd.service")}
    models_before = node.llmgw("models", "--json")
    one = b'[{"role": "user", "content": "x"}]'
    bad = (b"\xff\xfe", b"[]", b'{"model": "smollm2", "messages": "hi"}',
           b'{"model": "smollm2", "messages": ' + one + b', "stream": 3}')  # fmt: skip
    for body in bad:
        status, answer = post(node, "/v1/chat/completions", body, node.key)
        assert status == 400 and "error" in answer
    # A bad join token is refused by the cluster port, with a message and nothing issued.
    ctx = ssl.create_default_context()
    ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # the token is what is tested
    _, csr = pki.make_node_csr("intruder")  # a good request but for its token
    join = json.dumps({"token": "0" * 32 + ".wrong", "node": "intruder", "csr_pem": csr.decode()})
    req = urllib.request.Request(
        f"https://127.0.0.1:{node.cluster_port}/join", data=join.encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=30, context=ctx)
    assert refused.value.code == 403 and b"error" in refused.value.read()
    assert "intruder" not in [n["name"] for n in node.llmgw("nodes", "--json")]
    # A config with a typo is named by key and line, and does not start.
    node.ps.write_file("/tmp/typo.yaml", "client:\n  listen: 127.0.0.1:1\n  max_bodybytes: 5\n")
    r = node.ps.run([str(REPO / ".venv/bin/llmgwd"), "--config", "/tmp/typo.yaml", "--check"],
                    check=False)  # fmt: skip
    assert r.returncode == 78 and "typo.yaml:3" in r.stderr and "max_bodybytes" in r.stderr
    # Bad admin API bodies.
    r = node.llmgw("model", "add", "Bad Name!", "--from", "file:/x.gguf", "--engine", "llama.cpp",
                   check=False)  # fmt: skip
    assert r.returncode == 1 and "name" in r.stderr
    assert {u: node.main_pid(u) for u in pids} == pids  # nothing died, nothing restarted
    assert [m["name"] for m in node.llmgw("models", "--json")] == [m["name"] for m in models_before]


def test_usage_is_counted_limited_and_kept_over_a_restart(node: Node) -> None:
    secret = node.llmgw("key", "create", "metered", "--rpm", "1000", "--json")["key"]
    client = openai.OpenAI(base_url=node.base_url, api_key=secret, max_retries=0, timeout=120)
    msgs: list[ChatCompletionMessageParam] = [{"role": "user", "content": "Name a colour."}]
    raw = client.chat.completions.with_raw_response.create(model=MODEL, messages=msgs, max_tokens=8)
    assert (
        raw.headers["x-ratelimit-limit-requests"],
        raw.headers["x-ratelimit-remaining-requests"],
    ) == ("1000", "999")
    answer = raw.parse()
    assert answer.usage is not None
    # llama-server's usage chunk reaches a client that asks for it, and only such a client.
    asked = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                 stream=True, stream_options={"include_usage": True}))  # fmt: skip
    assert asked[-1].usage is not None and asked[-1].usage.completion_tokens > 0
    unasked = list(client.chat.completions.create(model=MODEL, messages=msgs, max_tokens=8,
                   stream=True))  # fmt: skip
    assert unasked and all(c.usage is None for c in unasked)

    def mine() -> dict[str, Any]:
        rows = node.llmgw("usage", "--by", "key", "--json")["rows"]
        return next(r for r in rows if r["name"] == "metered")

    used = mine()
    assert used["requests"] == 3
    assert used["prompt_tokens"] >= answer.usage.prompt_tokens + asked[-1].usage.prompt_tokens
    node.ps.systemctl("restart", "llmgwd.service")  # a clean stop writes what was counted
    node.ps.wait_active("llmgwd.service")
    assert mine() == used


def test_joining_again_where_it_is_is_harmless(node: Node) -> None:
    # The quickstart run twice does this: the agent says so and uses no token.
    r = node.llmgw("node", "join", f"https://127.0.0.1:{node.cluster_port}", "--token", "x.y")
    assert "Already joined" in r.stdout
    r = node.llmgw("node", "join", "https://127.0.0.1:1", "--token", "x.y", check=False)
    assert r.returncode == 1 and "already joined" in r.stderr


def test_slots_are_reported_and_a_model_with_embeddings_embeds(
    node: Node, client: openai.OpenAI
) -> None:
    # llama-server's /props (asked with the engine's key) reaches the router's caps.
    node.wait_ready(1)  # an earlier test restarted llmgwd: its agent may not be back yet
    assert [r["slots"] for r in node.model()["replica_status"]] == [4]  # the plan gave it 4
    embed = "smollm2-embed"
    node.llmgw("model", "add", embed, "--from", f"file:{gguf()}", "--engine", "llama.cpp",
               "--arg=--embeddings", "--arg=--pooling", "--arg=mean", "--arg=--parallel",
               "--arg=2")  # fmt: skip
    node.llmgw("model", "serve", embed, "--replicas", "1")
    try:
        node.wait(lambda: node.model(embed)["ready"] >= 1, f"{embed} ready", timeout=180)
        assert [r["slots"] for r in node.model(embed)["replica_status"]] == [2]
        answer = client.embeddings.create(model=embed, input=["A red apple.", "Blue sky."])
        assert len(answer.data) == 2 and len(answer.data[0].embedding) > 100
        assert answer.data[0].embedding != answer.data[1].embedding
        assert answer.usage.prompt_tokens > 0
        # A model started without --embeddings: a 400 that names the model and what it
        # lacks, never the engine's flag to start it with.
        with pytest.raises(openai.BadRequestError) as refused:
            client.embeddings.create(model=MODEL, input="A red apple.")
        assert refused.value.code == "model_not_supported"
        assert f"'{MODEL}' does not support embeddings" in refused.value.message
        assert "--" not in refused.value.message
    finally:
        node.llmgw("model", "stop", embed)
        node.wait(lambda: len(node.engine_units()) == 1, f"{embed} stopped")


def test_the_daemons_log_with_journal_fields(node: Node) -> None:
    for unit in ("llmgw-agentd", "llmgwd"):
        out = node.ps.run(
            ["journalctl", "--no-pager", "-u", unit, f"LLMGW_MODEL={MODEL}", "-o", "json"]
        ).stdout
        lines = [json.loads(line) for line in out.splitlines() if line.strip()]
        assert lines, f"no {unit} line carries LLMGW_MODEL"
        assert all(entry["LLMGW_REPLICA"].startswith(MODEL) for entry in lines)
        assert node.key not in out
    # Each /v1 request's line carries its id, as the x-request-id header gives it.
    out = node.ps.run(["journalctl", "--no-pager", "-u", "llmgwd", "-o", "json"]).stdout
    assert any("LLMGW_REQUEST" in json.loads(line) for line in out.splitlines() if line.strip())


def raw_exchange(node: Node, request: bytes) -> tuple[int, bytes]:
    """Bytes the http clients refuse to send; the status and the whole answer."""
    with socket.create_connection(("127.0.0.1", node.client_port), timeout=60) as s:
        s.sendall(request)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1]), answer


def test_a_bad_authorization_header_leaves_no_byte_of_the_key_in_the_journal(node: Node) -> None:
    secret = node.llmgw("key", "create", "leak-canary", "--json")["key"]
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
    for header, status in (
        (f"Authorization: Bearer {secret}".encode() + b"A" * 20_000, 431),
        (f"Authorization: Bearer {secret}\x01".encode(), 400),
    ):
        got, answer = raw_exchange(node, head + header + b"\r\n\r\n")
        assert got == status and b"application/json" in answer
        assert secret.encode()[9:17] not in answer  # not even the start of the key
    for _ in range(100):  # journald takes the lines in a moment
        out = node.ps.run(["journalctl", "--no-pager", "-u", "llmgwd", "-o", "json"]).stdout
        if out.count("refused a request from") >= 2:
            break
        time.sleep(0.2)
    assert out.count("refused a request from") >= 2
    # Not the key, and no 6 characters of it beyond its common prefix.
    tail = secret.removeprefix("sk-llmgw-")
    assert not [tail[i : i + 6] for i in range(len(tail) - 5) if tail[i : i + 6] in out]


def engine_unit(node: Node) -> str:
    out = node.ps.systemctl("list-units", "--plain", "--no-legend", "llmgw-engine-*").stdout
    return out.split()[0]


def test_the_engine_has_a_memory_limit_from_its_estimate(node: Node) -> None:
    unit = engine_unit(node)
    limit = node.ps.systemctl("show", "-P", "MemoryMax", unit).stdout.strip()
    assert limit != "infinity" and int(limit) < 2 << 30  # SmolLM2's estimate, not the node's
    cgroup = node.ps.systemctl("show", "-P", "ControlGroup", unit).stdout.strip()
    kernel = node.ps.run(  # cgroup v1's file, else v2's: the kernel holds the engine to it
        f"cat /sys/fs/cgroup/memory{cgroup}/memory.limit_in_bytes 2>/dev/null"
        f" || cat /sys/fs/cgroup{cgroup}/memory.max"
    ).stdout.strip()
    assert kernel == limit
    # No swap (enforced where the unified hierarchy is; systemd keeps it for v1 too).
    assert node.ps.systemctl("show", "-P", "MemorySwapMax", unit).stdout.strip() == "0"
    pid = node.ps.systemctl("show", "-P", "MainPID", unit).stdout.strip()
    rss_kib = node.ps.run(["ps", "-o", "rss=", "-p", pid]).stdout.strip()
    print(f"{unit}: MemoryMax={int(limit) >> 20} MiB, resident {int(rss_kib) >> 10} MiB")


def test_the_engine_listens_on_loopback_only(node: Node) -> None:
    # The agent joined over 127.0.0.1 with no address in agent.yaml: loopback, never 0.0.0.0.
    out = node.ps.run(["ss", "-H", "-ltnp"]).stdout
    engine = [line.split()[3] for line in out.splitlines() if "llama-server" in line]
    assert engine and all(a.startswith("127.0.0.1:") for a in engine), out


def test_a_model_without_a_catalog_context_is_bounded_by_its_replica(node: Node) -> None:
    """Issue 9, finding 10: the router bounds requests by the context the replica's engine
    reports when the catalog has none, before any engine sees them, and the model answers."""
    assert node.model()["context"] == 0  # SmolLM2 was added without --context

    def chat(content: str, **extra: object) -> tuple[int, Any]:
        body = {"model": MODEL, "messages": [{"role": "user", "content": content}], **extra}
        return post(node, "/v1/chat/completions", json.dumps(body).encode(), node.key)

    # Bounded: unbounded, SmolLM2 may ramble to its 8,192-token context (minutes on two cores).
    status, answer = chat("Say yes.", max_tokens=8)
    assert status == 200, answer
    # SmolLM2 was trained, and so placed, with 8,192 tokens: the engine says so in /props.
    status, answer = chat("Say yes.", max_tokens=9000)
    assert status == 400 and "at most 8192 completion tokens" in str(answer), answer
    status, answer = chat("word " * 9000)
    assert status == 400 and "maximum context length is 8192 tokens" in str(answer), answer


def test_a_removed_node_is_refused_until_it_joins_again_with_a_token(node: Node) -> None:
    # Last in this module: the node leaves the cluster, then comes back.
    [name] = node.connected()
    r = node.llmgw("node", "remove", name, "--yes")
    assert "removed" in r.stdout
    node.wait(lambda: node.connected() == [] and node.model()["ready"] == 0, "node removed")
    url = f"https://127.0.0.1:{node.cluster_port}"
    # The agent is refused, and says so once however often it dials again.
    node.wait(lambda: "was removed" in node.ps.journal("llmgw-agentd.service", 200), "refusal")
    time.sleep(25)  # a couple of its retries (10 s apart at most)
    said = node.ps.journal("llmgw-agentd.service", 500).count("refused this node")
    assert said == 1, node.ps.journal("llmgw-agentd.service", 40)
    assert name not in [n["name"] for n in node.llmgw("nodes", "--json")]
    # Joining again needs a real token now: no "Already joined" for a removed node.
    r = node.llmgw("node", "join", url, "--token", "0" * 32 + ".wrong", check=False)
    assert r.returncode == 1 and "Already joined" not in r.stdout
    node.join(node.token())
    node.wait_ready(1)
