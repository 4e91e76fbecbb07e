"""llmgw provider add|remove and llmgw providers against a real /api/v1 (over the socket and
over HTTPS, test_cli's daemon): the credential is read from a file or stdin, sealed in the
store, and in no answer, listing or log; a provider's model has no replicas to serve."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from llmgwd.catalog import MODELS
from llmgwd.providers.credentials import Credentials
from llmgwd.store import prefix_end
from tests.llmgw.test_cli import CLUSTER_SECRET, Daemon, daemon, rows  # noqa: F401 (a fixture)

CREDENTIAL = "sk-upstream-SEKRIT-0123456789abcdef"
URL = "https://api.example.com/v1"


def add(d: Daemon, tmp_path: Path, name: str = "gpt", *more: str) -> None:
    (tmp_path / "cred").write_text(CREDENTIAL + "\n")
    cred = str(tmp_path / "cred")
    r = d.cli("provider", "add", name, "--protocol", "openai", "--url", URL,
              "--model", "gpt-4o-mini", "--credential-file", cred, *more)  # fmt: skip
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == f"Model {name} added: openai API at {URL}, model gpt-4o-mini."


def test_a_provider_added_listed_and_removed(
    daemon: Daemon,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    add(daemon, tmp_path, "gpt", "--context", "128000", "--max-tokens", "4096")
    assert rows(daemon.cli("providers").stdout) == [
        ["NAME", "API", "URL", "MODEL"], ["gpt", "openai", URL, "gpt-4o-mini"],
    ]  # fmt: skip
    listed = daemon.cli("providers", "-o", "json").stdout
    [view] = json.loads(listed)
    assert (view["context"], view["max_tokens"]) == (128000, 4096) and "credential" not in view
    [_, shown] = rows(daemon.cli("models").stdout)
    assert (shown[1], shown[2], shown[4], shown[5]) == ("openai", "0/0", "external", "-")
    models = daemon.cli("models", "--json").stdout
    [model] = json.loads(models)
    assert (model["name"], model["source"], model["replicas"]) == ("gpt", f"upstream:{URL}", 0)
    r = daemon.cli("model", "serve", "gpt", "--replicas", "1")
    assert r.exit_code == 1 and "served by its external provider" in r.output
    for said in (listed, models, caplog.text):
        assert CREDENTIAL not in said
    r = daemon.cli("provider", "remove", "gpt")
    assert (r.exit_code, r.stdout.strip()) == (0, "Model gpt removed.")
    assert daemon.cli("provider", "remove", "gpt").exit_code == 4
    assert daemon.catalog.get("gpt") is None


def test_the_credential_is_sealed_in_the_store(daemon: Daemon, tmp_path: Path) -> None:  # noqa: F811
    add(daemon, tmp_path)
    store = daemon.catalog.store
    kvs, _ = daemon.run(store.range("/", prefix_end("/")))
    assert kvs and all(CREDENTIAL.encode() not in kv.value for kv in kvs)
    [record] = [kv for kv in kvs if kv.key == MODELS + "gpt"]
    sealed = json.loads(record.value)["upstream"]["credential"]
    assert Credentials(CLUSTER_SECRET).open("gpt", sealed) == CREDENTIAL


def test_the_credential_from_stdin_and_refusals(daemon: Daemon, tmp_path: Path) -> None:  # noqa: F811
    base = ["provider", "add", "c", "--protocol", "anthropic", "--model", "claude-sonnet-4-5"]
    r = daemon.cli(*base, "--url", "https://api.anthropic.com/v1", "--credential-file", "-")
    assert r.exit_code == 1 and "first line is empty" in r.output
    (tmp_path / "cred").write_text(CREDENTIAL)
    r = daemon.cli(*base, "--url", "ftp://x/v1", "--credential-file", str(tmp_path / "cred"))
    assert r.exit_code == 1 and "url" in r.output and CREDENTIAL not in r.output
    r = daemon.cli(*base, "--url", "https://user:pw@api.anthropic.com/v1",
                   "--credential-file", str(tmp_path / "cred"))  # fmt: skip
    assert r.exit_code == 1
    add(daemon, tmp_path, "c2")
    r = daemon.cli(
        *base[:2], "c2", *base[3:], "--url", URL, "--credential-file", str(tmp_path / "cred")
    )
    assert r.exit_code == 1 and "already exists" in r.output
