"""Where a model comes from: `file:/PATH` on the nodes, or `hf:ORG/REPO[@REV][:PATTERN]`."""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

# The hub's repository names: an owner and a name, each of letters, digits and - _ . (no
# leading or trailing separator, no "--" or ".."), at most 96 characters.
_PART = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO_RE = re.compile(rf"{_PART}/{_PART}")
# A branch, tag or commit: what git allows in a ref, kept to the plain characters.
REV_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/+-]{0,199}")
COMMIT_RE = re.compile(r"[0-9a-f]{40}")
SHA256_RE = re.compile(r"[0-9a-f]{64}")


class SourceError(ValueError):
    """A source that cannot be parsed (the message is safe to show)."""


@dataclass(frozen=True, slots=True)
class HfSource:
    """hf:ORG/REPO[@REV][:PATTERN]: a repository on the hub (or the mirror's upstream)."""

    repo: str
    revision: str = "main"
    pattern: str = ""  # a glob on the files' paths; "": the whole set (see select)

    def __str__(self) -> str:
        text = f"hf:{self.repo}@{self.revision}"
        return f"{text}:{self.pattern}" if self.pattern else text

    def pinned(self, commit: str) -> HfSource:
        """The same source at a commit."""
        return HfSource(self.repo, commit, self.pattern)

    @property
    def is_pinned(self) -> bool:
        return COMMIT_RE.fullmatch(self.revision) is not None


def parse_hf(source: str) -> HfSource:
    """Parse hf:ORG/REPO[@REV][:PATTERN]; raise SourceError naming what is wrong."""
    if not source.startswith("hf:"):
        raise SourceError("must start with hf:")
    rest = source.removeprefix("hf:")
    rest, _, pattern = rest.partition(":")
    repo, at, revision = rest.partition("@")
    if not REPO_RE.fullmatch(repo) or ".." in repo or "--" in repo:
        raise SourceError(f"{repo!r} is not a repository name (ORG/REPO)")
    if at and not REV_RE.fullmatch(revision):
        raise SourceError(f"{revision!r} is not a branch, tag or commit")
    if ".." in revision or revision.endswith("/"):
        raise SourceError(f"{revision!r} is not a branch, tag or commit")
    if any(c in pattern for c in "\0\n\r") or len(pattern) > 200:
        raise SourceError("the pattern holds a control character or is too long")
    return HfSource(repo, revision or "main", pattern)


def is_hf(source: str) -> bool:
    """Whether a source names the hub (else it is file:)."""
    return source.startswith("hf:")


# Files a model's set never needs on a node: the repository's own papers and other formats.
_NOT_WEIGHTS = ("*.md", ".gitattributes", "*.png", "*.jpg", "*.jpeg", "*.gif", "*.pdf")
_OTHER_FORMATS = ("*.bin", "*.pt", "*.pth", "*.h5", "*.msgpack", "*.onnx", "*.ot", "*.tflite")


def select(paths: list[str], pattern: str) -> list[str]:
    """The paths a source's set is made of, sorted.

    With a pattern: the paths it matches (fnmatch, `*` crossing directories), and, for a
    GGUF pattern, nothing else. Without one: a safetensors set if there is one (its weights
    with every config, tokenizer and template file, and no other format's weights), else
    every GGUF file, else everything but the repository's pictures and papers.
    """
    if pattern:
        return sorted(p for p in paths if fnmatch.fnmatchcase(p, pattern))
    kept = [p for p in paths if not _matches(p, _NOT_WEIGHTS)]
    if any(p.endswith(".safetensors") for p in kept):
        other = (*_OTHER_FORMATS, "*.gguf")
        return sorted(p for p in kept if not _matches(p, other))
    gguf = [p for p in kept if p.endswith(".gguf")]
    return sorted(gguf or kept)


def _matches(path: str, globs: tuple[str, ...]) -> bool:
    name = path.rsplit("/", 1)[-1]
    return any(fnmatch.fnmatchcase(name, g) for g in globs)


_SHARD = re.compile(r"(.*)-\d{5}-of-\d{5}\.gguf")


def several_ggufs(paths: list[str]) -> list[str]:
    """The GGUF models among a set's paths when there are several (a split model's shards
    count as one): a repository of quantizations needs a PATTERN to pick one."""
    models = sorted(
        {
            m.group(1) + ".gguf" if (m := _SHARD.fullmatch(p)) else p
            for p in paths
            if p.endswith(".gguf")
        }
    )
    return models if len(models) > 1 else []
