"""POST /v1/audio/transcriptions (OpenAI's, multipart/form-data): the form read within its
bounds (its bytes, one part per known field, each text field's length), the request admitted as
soon as its model part is read (before any later part), the file spooled (a little in memory,
the rest in an unnamed file) with at most a few spooled at once, only the known fields passed on
in a form the router writes itself, and the answer as a client sees it, its usage."""

from __future__ import annotations

import asyncio
import contextlib
import mmap
import os
import re
import secrets
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import IO, Any

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from llmgwd.router import errors
from llmgwd.router.usage_events import Tally

Document = dict[str, Any]
# Told the model's name as soon as its part is read, before any later part: it refuses the
# request there (404, 429, 503) or admits it.
Admit = Callable[[str], Awaitable[None]]

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # the whole form; OpenAI's own limit for the file
MAX_FIELD_BYTES = 4096  # one text field (a prompt, a language)
SPOOL_MEMORY_BYTES = 1024 * 1024  # an upload's bytes kept in memory; more go to a file
MAX_UPLOADS = 16  # files spooled at once (client.max_uploads_in_flight)
UPLOAD_WAIT_S = 30.0  # how long one more upload waits for a free spool before a 503
# Spools' files: on disk (under llmgwd's unit, its private /var/tmp), where /tmp is often a
# tmpfs, whose pages would count against the unit's MemoryMax. Its files are unnamed (made
# by tempfile.TemporaryFile, mode 0600): nobody can open or replace them.
_VAR_TMP = "/var/tmp"  # noqa: S108
SPOOL_DIR = _VAR_TMP if os.path.isdir(_VAR_TMP) else None
_CHUNK = 65536
FORMATS = frozenset({"json", "text", "srt", "verbose_json", "vtt", "diarized_json"})
_TEXT_FIELDS = frozenset({"model", "language", "prompt", "response_format", "temperature"})
_EXTENSIONS = frozenset({"flac", "mp3", "mp4", "mpeg", "mpga", "m4a", "ogg", "wav", "webm"})
_AUDIO_TYPE = re.compile(r"^(audio|video)/[a-z0-9.+-]{1,40}$")
_ANSWER = frozenset({"text", "language", "duration", "segments", "words", "usage", "task"})
_USAGE = frozenset({"type", "input_tokens", "output_tokens", "total_tokens", "seconds"})


class Spool:
    """Bytes written in order: in memory up to memory_bytes, then all of them in an unnamed
    file under directory (gone with its descriptor, whatever happens to the daemon)."""

    def __init__(self, directory: str | None, memory_bytes: int = SPOOL_MEMORY_BYTES) -> None:
        self._directory = directory
        self._memory_bytes = memory_bytes
        self._memory = bytearray()
        self._file: IO[bytes] | None = None
        self._map: mmap.mmap | None = None
        self._view: memoryview | None = None

    def write(self, data: bytes | bytearray) -> None:
        """Add data; a disk that fails is the server's 503, never the client's fault."""
        try:
            if self._file is None and len(self._memory) + len(data) <= self._memory_bytes:
                self._memory += data
                return
            if self._file is None:
                self._file = tempfile.TemporaryFile(dir=self._directory)  # noqa: SIM115 (closed by close())
                self._file.write(self._memory)
                self._memory = bytearray()
            self._file.write(data)
        except OSError:
            raise errors.ApiError(
                503, "The server could not hold the upload; retry later.", "server_error",
                code="upload_failed", headers={"Retry-After": "5"},
            ) from None  # fmt: skip

    def contents(self) -> bytes | memoryview:
        """What was written: bytes when it stayed in memory, else a view of the file mapped
        (read by the kernel as it is sent, not copied into the daemon's memory)."""
        if self._file is None:
            return bytes(self._memory)
        self._file.flush()
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self._view = memoryview(self._map)
        return self._view

    def close(self) -> None:
        """Drop it all (a view a transport still holds keeps the mapping until it lets go)."""
        self._memory = bytearray()
        with contextlib.suppress(BufferError):
            if self._view is not None:
                self._view.release()
            if self._map is not None:
                self._map.close()
        if self._file is not None:
            self._file.close()
        self._view, self._map, self._file = None, None, None


class Uploads:
    """At most `most` forms' files spooled at once: one more waits up to wait_s for a free
    spool (its client's sending paused meanwhile), then is refused with a 503."""

    def __init__(
        self,
        most: int = MAX_UPLOADS,
        wait_s: float = UPLOAD_WAIT_S,
        directory: str | None = SPOOL_DIR,
    ) -> None:
        self.most, self.directory = most, directory
        self._wait_s = wait_s
        self._free = asyncio.Semaphore(most)

    async def take(self) -> None:
        """A spool, waited for; the caller gives it back."""
        try:
            await asyncio.wait_for(self._free.acquire(), self._wait_s)
        except TimeoutError:
            raise errors.ApiError(
                503,
                f"Too many uploads in flight (the limit is {self.most}); retry later.",
                "server_error",
                code="uploads_busy",
                headers={"Retry-After": "5"},
            ) from None

    def give(self) -> None:
        """A spool taken is free again."""
        self._free.release()


class Form:
    """What the client sent that passes on: its known text fields, and its file in the spool
    as the file part of the engine's form (the text parts and the end follow in body())."""

    def __init__(self, uploads: Uploads) -> None:
        self.fields: dict[str, str] = {}
        self.has_file = False
        self._uploads = uploads
        self._boundary = secrets.token_hex(16)
        self._spool: Spool | None = None

    async def open_file(self, part: BodyPartReader) -> Spool:
        """A spool for the file, with the engine's file part head in it: its extension and
        type when they are plain ones (never the client's own filename: it is not passed on)."""
        await self._uploads.take()
        self._spool = Spool(self._uploads.directory)
        self.has_file = True
        extension = (part.filename or "").rpartition(".")[2].lower()
        extension = extension if extension in _EXTENSIONS else "wav"
        kind = part.headers.get("Content-Type", "").lower()
        kind = kind if _AUDIO_TYPE.match(kind) else "application/octet-stream"
        disposition = f'name="file"; filename="audio.{extension}"'
        self._spool.write(_part(self._boundary, disposition, kind))
        return self._spool

    def body(self, model: str) -> tuple[bytes | memoryview, str]:
        """The form the engine gets (the catalog's model named in it) and its content type:
        its file part first, then the text fields."""
        assert self._spool is not None
        out = bytearray(b"\r\n")
        for name, value in {**self.fields, "model": model}.items():
            out += _part(self._boundary, f'name="{name}"', "text/plain; charset=utf-8")
            out += value.encode() + b"\r\n"
        out += f"--{self._boundary}--\r\n".encode()
        self._spool.write(out)
        return self._spool.contents(), f"multipart/form-data; boundary={self._boundary}"

    def close(self) -> None:
        """Its spool dropped and given back."""
        if self._spool is not None:
            self._spool.close()
            self._spool = None
            self._uploads.give()


def _part(boundary: str, disposition: str, content_type: str) -> bytes:
    return (
        f"--{boundary}\r\nContent-Disposition: form-data; {disposition}\r\n"
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()


@contextlib.asynccontextmanager
async def read(
    request: web.Request, limit: int, uploads: Uploads, admit: Admit
) -> AsyncIterator[Form]:
    """The form, checked: multipart, at most limit bytes, each part a known field given once
    (so at most six parts), valid, a model (admitted as soon as it is read) and a file."""
    if request.content_type != "multipart/form-data":
        raise errors.invalid_value(
            "file", "The request body must be multipart/form-data, with the audio as 'file'."
        )
    if request.content_length is not None and request.content_length > limit:
        raise errors.request_too_large(limit)
    form = Form(uploads)
    try:
        await _read_parts(request, form, _Budget(limit), admit)
        if "model" not in form.fields:
            raise errors.missing_parameter("model")
        if not form.has_file:
            raise errors.missing_parameter("file")
        _check(form.fields)
        yield form
    finally:
        form.close()


async def _read_parts(request: web.Request, form: Form, budget: _Budget, admit: Admit) -> None:
    """Each part in turn, the model admitted as soon as it is read."""
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise errors.invalid_value("file", "A form part may not hold parts of its own.")
            name = part.name or ""
            if name != "file" and name not in _TEXT_FIELDS:
                raise errors.unknown_parameter(name)
            if name in form.fields or (name == "file" and form.has_file):
                raise errors.invalid_value(name, f"The field '{name}' is given more than once.")
            if name == "file":
                await _take_file(form, part, budget)
                continue
            form.fields[name] = await _text(name, part, budget)
            if request.content.at_eof():  # no boundary after it: a form cut short
                raise errors.invalid_value("file", "The form could not be read.")
            if name == "model":
                if not form.fields["model"].strip():
                    raise errors.missing_parameter("model")
                await admit(form.fields["model"])
    except HttpProcessingError as e:  # too slow (408, the client port's gate), or broken
        if e.code == 408:
            raise errors.request_timeout(e.message) from None
        raise errors.invalid_value("file", "The form could not be read.") from None
    except (ValueError, AssertionError):  # a broken form
        raise errors.invalid_value("file", "The form could not be read.") from None
    except ConnectionError:  # the client left during its upload
        raise errors.client_closed() from None


class _Budget:
    """Bytes left to a form."""

    def __init__(self, limit: int) -> None:
        self.limit, self.left = limit, limit

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise errors.request_too_large(self.limit)


async def _text(name: str, part: BodyPartReader, budget: _Budget) -> str:
    """A text field, read no further than its bound."""
    data = bytearray()
    while chunk := await part.read_chunk(_CHUNK):
        budget.spend(len(chunk))
        data += chunk
        if len(data) > MAX_FIELD_BYTES:
            raise errors.invalid_value(name, f"The field '{name}' is over {MAX_FIELD_BYTES} bytes.")
    try:
        return data.decode()
    except UnicodeDecodeError:
        raise errors.invalid_value(name, f"The field '{name}' is not UTF-8 text.") from None


async def _take_file(form: Form, part: BodyPartReader, budget: _Budget) -> None:
    """The file into its spool, read no further than the form's bound."""
    spool = await form.open_file(part)
    while chunk := await part.read_chunk(_CHUNK):
        budget.spend(len(chunk))
        spool.write(chunk)


def _check(fields: dict[str, str]) -> None:
    """The text fields' values."""
    if not fields["model"].strip():
        raise errors.missing_parameter("model")
    response_format = fields.get("response_format", "json")
    if response_format not in FORMATS:
        formats = ", ".join(sorted(FORMATS))
        raise errors.invalid_value("response_format", f"'response_format' is one of {formats}.")
    if "temperature" in fields:
        try:
            temperature = float(fields["temperature"])
        except ValueError:
            temperature = -1.0
        if not 0.0 <= temperature <= 1.0:
            raise errors.invalid_value("temperature", "'temperature' is a number from 0 to 1.")


def clean(doc: Document, model: str, tally: Tally) -> Document | None:
    """A JSON answer with its own fields only; usage in tokens told to tally (an answer in
    seconds, or without usage, counts as one request and no token)."""
    out = {k: v for k, v in doc.items() if k in _ANSWER}
    usage = out.get("usage")
    if isinstance(usage, dict):
        out["usage"] = {k: v for k, v in usage.items() if k in _USAGE}
        prompt, completion = usage.get("input_tokens"), usage.get("output_tokens")
        if isinstance(prompt, int) and isinstance(completion, int):
            tally.took(prompt, completion)
            return out
    tally.took(0, 0)
    return out
