"""The mirror tests' cluster: mirror A filled by `llmgw mirror import`, llmgwd B with A as
its upstream, node mn1 joined to B, on a private lan of their own."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from integration.harness import Lan, MakeLan, MakeSystemd
from integration.llmgw_node import Node, gguf, llama_server

REPO_NAME = "smol/SmolLM2-135M-Instruct"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS_DIR = "/var/cache/llmgw-agent/models"
MIRROR_DIR = "/var/lib/llmgw/mirror"


@dataclass
class Mirrors:
    a: Node
    b: Node
    n1: Node
    a_key: str
    b_key: str
    files: dict[str, bytes]  # the imported directory: path -> bytes (the GGUF by its sha256)
    a_ip: str
    b_ip: str
    n1_ip: str


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def source_dir() -> dict[str, str]:
    """The directory imported into A besides the GGUF: a small text file and a nested JSON
    file."""
    return {
        "README.txt": "SmolLM2-135M-Instruct, imported for the mirror's test.\n",
        "notes/params.json": json.dumps({"temperature": 0.2, "top_p": 0.9}) + "\n",
    }


def boot(make_systemd: MakeSystemd, make_lan: MakeLan, label: str, prefix: str) -> Mirrors:
    """A (PREFIX.10), B (PREFIX.20) and mn1 (PREFIX.21), booted, joined and keyed."""
    binary = llama_server()
    a_ip, b_ip, n1_ip = f"{prefix}.10", f"{prefix}.20", f"{prefix}.21"
    lan: Lan = make_lan(label, prefix=prefix)
    a = Node(make_systemd("ma", net=True, hostname="ma"), 7700, 7710)
    lan.attach(a.ps, 10)
    a.install(binary, address=a_ip)
    a.init_server(host=a_ip, agent=False)
    # A staff key: B's upstream and the official client see every set A holds, the imported
    # one included, which no model of A's uses (a user key would see only its models' sets).
    a_key = a.llmgw("key", "create", "upstream", "--admin", "--json")["key"]
    small = source_dir()
    for path, text in small.items():
        a.ps.write_file(f"/srv/import/{path}", text)
    a.ps.run(["cp", str(gguf()), f"/srv/import/{GGUF_NAME}"])
    a.llmgw("mirror", "import", "/srv/import", "--as", REPO_NAME)

    b = Node(make_systemd("mb", net=True, hostname="mb"), 7700, 7710)
    lan.attach(b.ps, 20)
    b.install(binary, address=b_ip)
    b.ps.write_file("/etc/llmgw/upstream-token", a_key + "\n", mode=0o640)
    b.ps.run(["chgrp", "llmgw", "/etc/llmgw/upstream-token"])
    b.init_server(host=b_ip, agent=False,
                  extra=f"mirror:\n  upstream: http://{a_ip}:7700/hf\n"
                        "  token_file: /etc/llmgw/upstream-token\n")  # fmt: skip
    n1 = Node(make_systemd("mn1", net=True, hostname="mn1"), 7700, 7710)
    lan.attach(n1.ps, 21)
    n1.install(binary, address=n1_ip)
    n1.start_agent()
    n1.join(b.token(), server=b, url=f"https://{b_ip}:7710")
    b_key = b.llmgw("key", "create", "tests", "--json")["key"]
    files = {p: t.encode() for p, t in small.items()}
    files[GGUF_NAME] = gguf().read_bytes()
    return Mirrors(a, b, n1, a_key, b_key, files, a_ip, b_ip, n1_ip)
