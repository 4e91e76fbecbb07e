"""POST /v1/audio/transcriptions (OpenAI's, multipart/form-data): the form read within its
bounds (its bytes, one part per known field, each text field's length), only its known fields
passed on in a form the router writes itself, and the answer as a client sees it, its usage."""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass, field
from typing import Any

from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from llmgwd.router import errors
from llmgwd.router.usage_events import Tally

Document = dict[str, Any]

MAX_AUDIO_BYTES = 25 * 1024 * 1024  # the whole form; OpenAI's own limit for the file
MAX_FIELD_BYTES = 4096  # one text field (a prompt, a language)
FORMATS = frozenset({"json", "text", "srt", "verbose_json", "vtt", "diarized_json"})
_TEXT_FIELDS = frozenset({"model", "language", "prompt", "response_format", "temperature"})
_EXTENSIONS = frozenset({"flac", "mp3", "mp4", "mpeg", "mpga", "m4a", "ogg", "wav", "webm"})
_AUDIO_TYPE = re.compile(r"^(audio|video)/[a-z0-9.+-]{1,40}$")
_ANSWER = frozenset({"text", "language", "duration", "segments", "words", "usage", "task"})
_USAGE = frozenset({"type", "input_tokens", "output_tokens", "total_tokens", "seconds"})


@dataclass
class Form:
    """What the client sent that passes on: its known text fields and its file."""

    fields: dict[str, str] = field(default_factory=dict)
    audio: bytes = b""
    extension: str = "wav"
    audio_type: str = "application/octet-stream"

    def body(self, model: str) -> tuple[bytes, str]:
        """The form the engine gets (the catalog's model named in it) and its content type."""
        boundary = secrets.token_hex(16)
        out = bytearray()
        for name, value in {**self.fields, "model": model}.items():
            out += _part(boundary, f'name="{name}"', "text/plain; charset=utf-8")
            out += value.encode() + b"\r\n"
        disposition = f'name="file"; filename="audio.{self.extension}"'
        out += _part(boundary, disposition, self.audio_type) + self.audio + b"\r\n"
        out += f"--{boundary}--\r\n".encode()
        return bytes(out), f"multipart/form-data; boundary={boundary}"


def _part(boundary: str, disposition: str, content_type: str) -> bytes:
    return (
        f"--{boundary}\r\nContent-Disposition: form-data; {disposition}\r\n"
        f"Content-Type: {content_type}\r\n\r\n"
    ).encode()


async def read(request: web.Request, limit: int) -> Form:
    """The form, checked: multipart, at most limit bytes, each part a known field given once
    (so at most six parts), valid, a model and a file."""
    if request.content_type != "multipart/form-data":
        raise errors.invalid_value(
            "file", "The request body must be multipart/form-data, with the audio as 'file'."
        )
    if request.content_length is not None and request.content_length > limit:
        raise errors.request_too_large(limit)
    form, budget = Form(), _Budget(limit)
    try:
        reader = await request.multipart()
        while (part := await reader.next()) is not None:
            if not isinstance(part, BodyPartReader):
                raise errors.invalid_value("file", "A form part may not hold parts of its own.")
            await _take(form, part, budget)
    except HttpProcessingError as e:  # too slow (408, the client port's gate), or broken
        if e.code == 408:
            raise errors.request_timeout(e.message) from None
        raise errors.invalid_value("file", "The form could not be read.") from None
    except (ValueError, AssertionError):  # a broken form
        raise errors.invalid_value("file", "The form could not be read.") from None
    except ConnectionError:  # the client left during its upload
        raise errors.client_closed() from None
    if "model" not in form.fields:
        raise errors.missing_parameter("model")
    if not form.audio:
        raise errors.missing_parameter("file")
    _check(form.fields)
    return form


class _Budget:
    """Bytes left to a form."""

    def __init__(self, limit: int) -> None:
        self.limit, self.left = limit, limit

    def spend(self, size: int) -> None:
        self.left -= size
        if self.left < 0:
            raise errors.request_too_large(self.limit)


async def _take(form: Form, part: BodyPartReader, budget: _Budget) -> None:
    """One part into form, read no further than its bounds."""
    name = part.name or ""
    if name != "file" and name not in _TEXT_FIELDS:
        raise errors.unknown_parameter(name)
    if name in form.fields or (name == "file" and form.audio):
        raise errors.invalid_value(name, f"The field '{name}' is given more than once.")
    most = MAX_FIELD_BYTES if name != "file" else budget.limit
    data = bytearray()
    while chunk := await part.read_chunk(65536):
        budget.spend(len(chunk))
        data += chunk
        if len(data) > most:
            raise errors.invalid_value(name, f"The field '{name}' is over {most} bytes.")
    if name == "file":
        _take_file(form, part, bytes(data))
        return
    try:
        form.fields[name] = data.decode()
    except UnicodeDecodeError:
        raise errors.invalid_value(name, f"The field '{name}' is not UTF-8 text.") from None


def _take_file(form: Form, part: BodyPartReader, data: bytes) -> None:
    """The audio, with its extension and type when they are plain ones (never the client's
    own filename: it is not passed on)."""
    form.audio = data
    extension = (part.filename or "").rpartition(".")[2].lower()
    if extension in _EXTENSIONS:
        form.extension = extension
    kind = part.headers.get("Content-Type", "").lower()
    if _AUDIO_TYPE.match(kind):
        form.audio_type = kind


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
