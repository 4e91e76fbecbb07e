"""Debian's real Prometheus scrapes llmgwd's /metrics with the scrape token (`llmgw metrics
token`, in its credentials_file as llmgwd(8) shows) while /v1 traffic runs: its HTTP API then
says the requests the test sent, the tokens the engine reported and the replicas ready;
`promtool check metrics` accepts what llmgwd serves, which a loopback peer without the token
is not given."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from integration.harness import PrivateSystemd
from integration.llmgw_node import MODEL, Node, llama_server, serving

CLIENT_PORT, CLUSTER_PORT = 17800, 17810  # apart from the other integration tests' ports
PROMETHEUS = "127.0.0.1:17890"
REQUESTS = 3


@pytest.fixture(scope="module")
def node(systemd: PrivateSystemd) -> Iterator[Node]:
    yield serving(systemd, llama_server(), CLIENT_PORT, CLUSTER_PORT)


@pytest.fixture(scope="module")
def scrape_token(node: Node) -> str:
    """The scrape token, made as an operator would (`llmgw metrics token`)."""
    r = node.llmgw("metrics", "token")
    assert r.returncode == 0, r.stderr
    return str(r.stdout.strip())


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory, scrape_token: str) -> Iterator[str]:
    """Prometheus on this host (the private systemd shares its network), scraping llmgwd's
    client port from the loopback every second with the token in its credentials_file."""
    if shutil.which("prometheus") is None:
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus)")
    d = tmp_path_factory.mktemp("prometheus")
    token = d / "llmgw.token"
    token.write_text(scrape_token + "\n")  # as `llmgw metrics token > FILE` writes it
    auth = f"    authorization: {{credentials_file: {token}}}\n"
    config = d / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        "scrape_configs:\n"
        f"  - job_name: llmgw\n    static_configs: [{{targets: ['127.0.0.1:{CLIENT_PORT}']}}]\n"
        f"{auth}"
        f"  - job_name: engines\n    metrics_path: /metrics/engines\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{CLIENT_PORT}']}}]\n"
        f"{auth}"
    )
    log = (d / "prometheus.log").open("w")
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={d / 'data'}",
         f"--web.listen-address={PROMETHEUS}"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        yield f"http://{PROMETHEUS}"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def metrics(node: Node, token: str, path: str = "/metrics") -> str:
    url = f"http://127.0.0.1:{node.client_port}{path}"
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        assert r.headers["Content-Type"].startswith("text/plain")
        return str(r.read().decode())


def query(base: str, expr: str) -> float | None:
    """The single value of expr through Prometheus' HTTP API (None: no sample, or no answer)."""
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            result = json.loads(r.read())["data"]["result"]
    except OSError:
        return None
    return float(result[0]["value"][1]) if result else None


def until(base: str, expr: str, want: float, timeout_s: float = 60.0) -> None:
    """Wait (bounded) until Prometheus says want for expr."""
    deadline = time.monotonic() + timeout_s
    got = None
    while time.monotonic() < deadline:
        if (got := query(base, expr)) == want:
            return
        time.sleep(0.5)
    raise AssertionError(f"Prometheus says {got} for {expr}, not {want}")


def test_prometheus_reads_the_requests_tokens_and_replicas_sent(
    node: Node, prometheus: str
) -> None:
    node.wait_ready(1)
    client = openai.OpenAI(base_url=node.base_url, api_key=node.key, max_retries=0, timeout=120)
    until(prometheus, "up", 1)  # scraped before the traffic: the counters then start at 0
    prompt = completion = 0
    for i in range(REQUESTS):
        r = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Count to {i + 2}."}],
            max_tokens=8,
        )  # fmt: skip
        assert r.usage is not None
        prompt += r.usage.prompt_tokens
        completion += r.usage.completion_tokens
    ok = f'llmgw_requests_total{{model="{MODEL}",route="/v1/chat/completions",status_class="2xx"}}'
    until(prometheus, f"sum({ok})", REQUESTS)
    tokens = f'llmgw_tokens_total{{model="{MODEL}",direction="%s"}}'
    until(prometheus, f"sum({tokens % 'in'})", prompt)
    until(prometheus, f"sum({tokens % 'out'})", completion)
    until(prometheus, f'llmgw_replicas_ready{{model="{MODEL}"}}', 1)
    until(prometheus, 'llmgw_nodes{state="connected"}', 1)
    until(prometheus, f'llmgw_request_duration_seconds_count{{model="{MODEL}"}}', REQUESTS)
    # The engine's own count, relayed through llmgwd with the replica's model and node.
    name = node.connected()[0]
    engine = f'sum(llamacpp_tokens_predicted_total{{model="{MODEL}",node="{name}"}})'
    until(prometheus, f"{engine} >= bool {completion}", 1)


def test_promtool_accepts_every_endpoint(node: Node, scrape_token: str, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("Debian's prometheus is not installed (apt-get install prometheus)")
    node.wait_ready(1)
    for path, family in (("/metrics", "llmgw_replicas_ready"), ("/metrics/engines", "llamacpp_")):
        with pytest.raises(urllib.error.HTTPError) as refused:  # the loopback without the token
            urllib.request.urlopen(f"http://127.0.0.1:{node.client_port}{path}", timeout=10)
        assert refused.value.code == 401, path
        text = metrics(node, scrape_token, path)
        assert family in text, path
        r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                           text=True, timeout=30)  # fmt: skip
        assert r.returncode == 0, (path, r.stdout + r.stderr)
