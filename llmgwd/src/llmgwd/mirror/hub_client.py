"""The mirror's client of its upstream (the hub, or another llmgw's mirror): a revision pinned to
a commit, and every file of the repository at that commit with its size and checksum.

The hub's own routes, as huggingface_hub calls them: GET {endpoint}/api/models/{repo}/revision/
{revision} (model info: "sha", "gated", "lastModified"; the revision quoted whole, "refs/pr/1" as
"refs%2Fpr%2F1"), then GET {endpoint}/api/models/{repo}/tree/{commit}?recursive=true&expand=false,
a page at a time (Link: <URL>; rel="next", as utils/_pagination.py follows it), entries
{"type": "file"|"directory", "oid", "size", "path", "lfs": {"oid", "size", "pointerSize"}}.

An LFS file's checksum is its "lfs" "oid" (a sha256); its entry's "oid" is the git blob id of the
pointer file, not of the bytes, so it is not kept (ModelFile.git_oid is "" for an LFS file). Any
other file keeps its git blob id. An llmgw mirror adds "llmgw_sha256" (EXTENSION_KEY) to a file's
entry when it knows its sha256; it is recorded as the file's sha256.

Nothing the upstream answers chooses where the gateway connects: a redirect or a next page on
another origin is refused. Answers are checked (a 40-hex commit, relative paths without "..",
sizes, checksums); a malformed one is a HubError (status 502). No message carries the token.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, TypeVar
from urllib.parse import quote

import aiohttp
import msgspec
from multidict import CIMultiDictProxy
from yarl import URL

from llmgw import proxy
from llmgw.sources import COMMIT_RE, REPO_RE, REV_RE, SHA256_RE
from llmgw.wire import ModelFile
from llmgwd.mirror.snapshot import Snapshot

EXTENSION_KEY = "llmgw_sha256"  # an llmgw mirror's sha256 of a file the hub gives none for
TRIES = 4  # each request, when the upstream fails (5xx, 429) or cannot be reached
BACKOFF_S = 1.0  # the wait before the second try; doubled each time, at most 8 s
MAX_BODY = 64 << 20  # one answer (a page of the tree: 1000 entries on the hub)
MAX_PAGES = 10_000
MAX_REDIRECTS = 5
MALFORMED = 502  # HubError.status of an answer that is malformed or unsafe
_RETRY = frozenset({429, 500, 502, 503, 504})
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=30, sock_read=60)
_MAX_PATH = 4096

_T = TypeVar("_T")
_Size = Annotated[int, msgspec.Meta(ge=0)]


class HubError(Exception):
    """The upstream could not answer, or answered wrongly; the message is safe to show.

    status: the upstream's HTTP status; 0 when it could not be reached; 400 for a request the
    gateway refused to send; MALFORMED (502) for an answer that is malformed or unsafe."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class _Info(msgspec.Struct):
    sha: str
    last_modified: str | None = msgspec.field(default=None, name="lastModified")
    gated: bool | str | None = False  # false, "auto" or "manual"


class _Lfs(msgspec.Struct):
    oid: str
    size: _Size


class _Entry(msgspec.Struct):
    type: Literal["file", "directory"]
    path: str
    oid: str = ""
    size: _Size = 0
    lfs: _Lfs | None = None
    llmgw_sha256: str = ""  # EXTENSION_KEY


@dataclass(frozen=True, slots=True)
class _Answer:
    body: bytes
    next: URL | None  # the Link rel="next", resolved against the answer's URL


async def resolve(
    session: aiohttp.ClientSession,
    endpoint: str,
    repo: str,
    revision: str,
    *,
    token: str | None = None,
    tries: int = TRIES,
    backoff_s: float = BACKOFF_S,
    route: proxy.Route = proxy.DIRECT,
) -> Snapshot:
    """The commit a revision (branch, tag or commit) names, with every file of the repository at
    that commit (all directories), asked through route's proxy; HubError when the upstream
    cannot say or says it wrongly."""
    if not REPO_RE.fullmatch(repo) or ".." in repo or "--" in repo:
        raise HubError(400, f"{repo[:200]!r} is not a repository name (ORG/REPO)")
    if not REV_RE.fullmatch(revision):
        raise HubError(400, f"hf:{repo}: {revision[:200]!r} is not a branch, tag or commit")
    client = _Client(session, _base(endpoint), repo, token, max(tries, 1), backoff_s)
    client.route = route
    answer = await client.get(client.api(f"revision/{quote(revision, safe='')}"))
    info = client.decode(answer.body, _Info, "model info")
    if not COMMIT_RE.fullmatch(info.sha):
        raise client.malformed(f"its commit {info.sha[:64]!r} is not 40 hex digits")
    if COMMIT_RE.fullmatch(revision) and info.sha != revision:
        raise client.malformed(f"it named commit {info.sha} for commit {revision}")
    entries = await client.tree(info.sha)
    return Snapshot(
        repo=repo,
        commit=info.sha,
        files=client.files(entries),
        last_modified=info.last_modified or "",
        gated=info.gated not in (False, None, ""),
    )


def resolve_url(endpoint: str, repo: str, commit: str, path: str) -> str:
    """Where a file of a commit is downloaded from: {endpoint}/{repo}/resolve/{commit}/{path}."""
    quoted = "/".join(quote(part, safe="") for part in path.split("/"))
    return f"{endpoint.rstrip('/')}/{repo}/resolve/{commit}/{quoted}"


def read_token(path: str) -> str | None:
    """The token in a credential file (its first line, stripped); None if missing or empty."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "it is not text"
        raise HubError(400, f"the token file {path}: cannot read it ({why})") from None
    lines = text.splitlines()
    return (lines[0].strip() if lines else "") or None


def _base(endpoint: str) -> URL:
    url = URL(endpoint.rstrip("/"), encoded=True)
    if url.scheme not in ("http", "https") or not url.host or url.user or url.query_string:
        raise HubError(400, f"the upstream {endpoint[:200]!r} is not an http(s) URL")
    return url


def _same_origin(a: URL, b: URL) -> bool:
    return (a.scheme, a.host, a.port) == (b.scheme, b.host, b.port) and b.user is None


class _Client:
    """Requests to one upstream for one repository: the token, retries, errors, checks."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        base: URL,
        repo: str,
        token: str | None,
        tries: int,
        backoff_s: float,
    ) -> None:
        self.session, self.base, self.repo, self.token = session, base, repo, token
        self.tries, self.backoff_s = tries, backoff_s
        self.name = f"hf:{repo}"
        self.route = proxy.DIRECT
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    def api(self, route: str) -> URL:
        return URL(f"{self.base}/api/models/{self.repo}/{route}", encoded=True)

    async def tree(self, commit: str) -> list[_Entry]:
        """Every entry of the commit's recursive listing, following its pages."""
        url: URL | None = self.api(f"tree/{commit}?recursive=true&expand=false")
        seen: set[str] = set()
        entries: list[_Entry] = []
        while url is not None:
            if len(seen) >= MAX_PAGES:
                raise self.malformed(f"its file list ran past {MAX_PAGES} pages")
            seen.add(str(url))
            answer = await self.get(url)
            entries += self.decode(answer.body, list[_Entry], "file list")
            url = answer.next
            if url is not None and not _same_origin(self.base, url):
                raise self.malformed(f"its next page is on another host ({url.origin()})")
            if url is not None and str(url) in seen:
                raise self.malformed("its next page is a page it already gave")
        return entries

    async def get(self, url: URL) -> _Answer:
        """A 200 answer, after a few tries when the upstream fails or cannot be reached."""
        error = HubError(0, f"{self.name}: the upstream was not asked")
        for attempt in range(self.tries):
            if attempt:
                await asyncio.sleep(min(self.backoff_s * 2 ** (attempt - 1), 8.0))
            try:
                status, headers, answer = await self._follow(url)
            except (aiohttp.ClientError, TimeoutError) as e:
                error = self._unreachable(e, url)
                continue
            if answer is not None:
                return answer
            error = self._error(status, headers, url)
            if status not in _RETRY:
                raise error
        raise error

    async def _follow(self, url: URL) -> tuple[int, CIMultiDictProxy[str], _Answer | None]:
        """One GET, following redirects on the same origin (a renamed repository)."""
        for _ in range(MAX_REDIRECTS + 1):
            kw = self.route.request_kw(url)
            async with self.session.get(
                url, headers=self.headers, allow_redirects=False, timeout=_TIMEOUT, **kw
            ) as r:
                if r.status in _REDIRECTS and "Location" in r.headers:
                    url = url.join(URL(r.headers["Location"], encoded=True))
                    if not _same_origin(self.base, url):
                        raise self.malformed(f"it redirected to another host ({url.origin()})")
                    continue
                if r.status != 200:
                    return r.status, r.headers, None
                nxt = r.links.get("next")
                link = nxt.get("url") if nxt is not None else None
                answer = _Answer(await self._read(r), link if isinstance(link, URL) else None)
                return r.status, r.headers, answer
        raise self.malformed(f"it redirected more than {MAX_REDIRECTS} times")

    async def _read(self, r: aiohttp.ClientResponse) -> bytes:
        if (r.content_length or 0) > MAX_BODY:
            raise self.malformed(f"its answer is over {MAX_BODY >> 20} MiB")
        body = bytearray()
        async for chunk in r.content.iter_chunked(1 << 16):
            body += chunk
            if len(body) > MAX_BODY:
                raise self.malformed(f"its answer is over {MAX_BODY >> 20} MiB")
        return bytes(body)

    def _unreachable(self, e: BaseException, url: URL) -> HubError:
        """A request that got no answer: the proxy's refusal said as the proxy's."""
        by_proxy = proxy.explain(e, self.route, url)
        if by_proxy:
            return HubError(0, f"{self.name}: {self._scrub(by_proxy)}")
        why = proxy.redact(self._scrub(str(e) or type(e).__name__))
        return HubError(0, f"{self.name}: cannot reach the upstream ({why})")

    def _error(self, status: int, headers: CIMultiDictProxy[str], url: URL) -> HubError:
        code = headers.get("X-Error-Code", "")
        said = self._scrub(headers.get("X-Error-Message", ""))
        said = "".join(c for c in said if c.isprintable())[:300]
        why = _why(status, code, self.token is not None)
        if said:
            why += f' (it says: "{said}")'
        via = proxy.answered_by_proxy(self.route, url, status)
        if via and status == 401:  # tinyproxy answers a wrong password so, not with a 407
            why += "; or the proxy refused network.proxy's user and password"
        why += via
        return HubError(status, f"{self.name}: the upstream answered {status}: {why}")

    def _scrub(self, text: str) -> str:
        return text.replace(self.token, "***") if self.token else text

    def decode(self, body: bytes, kind: type[_T], what: str) -> _T:
        try:
            return msgspec.json.decode(body, type=kind, strict=True)
        except msgspec.ValidationError as e:
            raise self.malformed(f"its {what} is malformed: {e}") from None
        except msgspec.DecodeError:
            raise self.malformed(f"its {what} is not JSON") from None

    def malformed(self, why: str) -> HubError:
        return HubError(MALFORMED, f"{self.name}: the upstream's answer is refused: {why}")

    def files(self, entries: list[_Entry]) -> list[ModelFile]:
        """The files of a listing (directories left out), each checked, by path."""
        seen: set[str] = set()
        files: list[ModelFile] = []
        for e in entries:
            problem = _path_problem(e.path)
            if problem:
                raise self.malformed(f"the path {e.path[:200]!r} {problem}")
            if e.path in seen:
                raise self.malformed(f"it lists {e.path[:200]!r} twice")
            seen.add(e.path)
            if e.type == "file":
                files.append(self._file(e))
        return sorted(files, key=lambda f: f.path)

    def _file(self, e: _Entry) -> ModelFile:
        extra = e.llmgw_sha256
        if extra and not SHA256_RE.fullmatch(extra):
            raise self.malformed(f"the {EXTENSION_KEY} of {e.path!r} is not 64 hex digits")
        if e.lfs is None:
            if not COMMIT_RE.fullmatch(e.oid):
                raise self.malformed(f"the git blob id of {e.path!r} is not 40 hex digits")
            return ModelFile(e.path, e.size, sha256=extra, git_oid=e.oid)
        sha = e.lfs.oid
        if sha and set(sha) == {"*"}:
            raise self._hidden()
        if not SHA256_RE.fullmatch(sha):
            raise self.malformed(f"the sha256 of {e.path!r} is not 64 hex digits")
        if extra and extra != sha:
            raise self.malformed(f"it gives {e.path!r} two different sha256")
        return ModelFile(e.path, e.lfs.size, sha256=sha)

    def _hidden(self) -> HubError:
        # The hub lists a gated repository's files to anyone, with the LFS sha256 masked ("*")
        # for whoever has no access (recorded: tests/llmgwd/mirror/recorded/).
        if self.token is None:
            why = "a token is needed (gated repository); put one in mirror.token_file"
            return HubError(401, f"{self.name}: the upstream hides its checksums: {why}")
        why = "the token has no access to this gated repository (ask for it on the hub)"
        return HubError(403, f"{self.name}: the upstream hides its checksums: {why}")


def _why(status: int, code: str, has_token: bool) -> str:
    """What an error answer means, from its status and the hub's X-Error-Code."""
    if code == "GatedRepo":
        if has_token:
            return "the token has no access to this gated repository (ask for it on the hub)"
        return "a token is needed (gated repository); put one in mirror.token_file"
    if code == "RepoNotFound":
        return "no such repository (or a private one the token cannot see)"
    if code == "RevisionNotFound":
        return "no such revision (branch, tag or commit) in the repository"
    if code == "EntryNotFound":
        return "no such file or directory at that revision"
    if status == 401 and has_token:
        return "it refused the token in mirror.token_file (expired or revoked?)"
    if status == 401:
        return (
            "a token is needed (gated or private repository, or no such repository); "
            "put one in mirror.token_file"
        )
    if status == 403:
        return "access refused (the token lacks a permission)"
    if status == 404:
        return "no such repository or revision"
    if status == 407:  # only a proxy asks this
        return "the proxy wants other credentials (network.proxy's user and password)"
    if status == 429:
        return "too many requests; try again later"
    if status >= 500:
        return "the upstream failed; try again later"
    return "an answer the gateway does not expect"


def _path_problem(path: str) -> str:
    """Why a path from the upstream cannot name a file in the mirror; "" when it can."""
    if not path or len(path) > _MAX_PATH:
        return "is empty or too long"
    if path.startswith("/"):
        return "is absolute"
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        return "holds a control character"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, '.' or '..' part"
    return ""
