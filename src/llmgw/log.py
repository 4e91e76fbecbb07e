"""Logging for the daemons: to the journal with fields when run by systemd, else to stderr.

Fields such as LLMGW_NODE, LLMGW_MODEL, LLMGW_REPLICA and LLMGW_REQUEST come from the
`extra=` of a log call (extra={"model": "x"}), so `journalctl LLMGW_MODEL=x` finds them.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import socket
import sys
import traceback

JOURNAL_SOCKET = "/run/systemd/journal/socket"
FIELDS = ("node", "model", "replica", "request", "key_id", "unit")
_JOURNAL_FIELDS = [(name, "LLMGW_" + name.upper()) for name in FIELDS]

# sendto's errors for a record too large for one datagram (over the socket's send buffer, about
# 208 KiB by default): such a record goes in a sealed memfd, as sd_journal_sendv does.
_TOO_LARGE = (errno.EMSGSIZE, errno.ENOBUFS, errno.EAGAIN)
_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL

_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


def _field(name: str, value: str) -> bytes:
    """One journal field; values with a newline use the protocol's length-prefixed form."""
    raw = value.encode("utf-8", "replace")
    if b"\n" not in raw:
        return name.encode() + b"=" + raw + b"\n"
    return name.encode() + b"\n" + len(raw).to_bytes(8, "little") + raw + b"\n"


class JournalHandler(logging.Handler):
    """Writes records to journald's native socket, with llmgw's fields. A daemon writes one
    at every /v1 request: what is the same for every record from one line of code is
    encoded once."""

    def __init__(self, identifier: str, path: str = JOURNAL_SOCKET) -> None:
        super().__init__()
        self._identifier = _field("SYSLOG_IDENTIFIER", identifier)
        self._path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._sites: dict[tuple[int, str, int, str], bytes] = {}

    def emit(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage() if self.formatter is None else self.format(record)
            if record.exc_info:
                msg += "\n" + "".join(traceback.format_exception(*record.exc_info))
            parts = [_field("MESSAGE", msg), self._site(record)]
            values = record.__dict__
            for name, journal_name in _JOURNAL_FIELDS:
                value = values.get(name)
                if value is not None:
                    parts.append(_field(journal_name, str(value)))
            datagram = b"".join(parts)
            try:
                self._sock.sendto(datagram, self._path)
            except OSError as e:
                if e.errno not in _TOO_LARGE:
                    raise
                self._send_memfd(datagram)
        except Exception:
            self.handleError(record)

    def _send_memfd(self, record: bytes) -> None:
        """A record too large for a datagram: written to a sealed memfd whose descriptor goes
        to journald on an empty datagram, which journald reads as the record."""
        fd = os.memfd_create("llmgw-journal", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            view = memoryview(record)
            while view:
                view = view[os.write(fd, view) :]
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SEALS)
            # sendmsg, not socket.send_fds: that drops its address argument (Python 3.11)
            rights = (socket.SOL_SOCKET, socket.SCM_RIGHTS, fd.to_bytes(4, sys.byteorder))
            self._sock.sendmsg([], [rights], 0, self._path)
        finally:
            os.close(fd)

    def _site(self, record: logging.LogRecord) -> bytes:
        """PRIORITY, SYSLOG_IDENTIFIER, CODE_FILE, CODE_LINE and LOGGER, encoded once for
        each line of code and level (a bounded set: the code's own log calls)."""
        site = (record.levelno, record.pathname, record.lineno, record.name)
        encoded = self._sites.get(site)
        if encoded is None:
            if len(self._sites) > 4096:
                self._sites.clear()
            encoded = self._sites[site] = b"".join(
                [
                    _field("PRIORITY", str(_PRIORITY.get(record.levelno, 6))),
                    self._identifier,
                    _field("CODE_FILE", record.pathname),
                    _field("CODE_LINE", str(record.lineno)),
                    _field("LOGGER", record.name),
                ]
            )
        return encoded

    def close(self) -> None:
        self._sock.close()
        super().close()


def setup(identifier: str, level: str = "info") -> None:
    """Log to the journal when systemd started us with the journal on stderr, else stderr."""
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(level.upper())
    handler: logging.Handler
    if os.environ.get("JOURNAL_STREAM") and os.path.exists(JOURNAL_SOCKET):
        handler = JournalHandler(identifier)  # no formatter: the message as it is
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root.addHandler(handler)
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
