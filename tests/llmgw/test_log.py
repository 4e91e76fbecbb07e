"""llmgw.log's JournalHandler: the datagrams journald gets, read back from a socket of ours
and decoded by the native protocol's rules."""

from __future__ import annotations

import fcntl
import inspect
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from llmgw.log import JournalHandler


def decode(datagram: bytes) -> dict[str, str]:
    """journald's native protocol: NAME=value lines, or NAME, a 64-bit length and the value."""
    fields: dict[str, str] = {}
    rest = datagram
    while rest:
        line, sep, after = rest.partition(b"\n")
        if b"=" in line:
            name, _, value = line.partition(b"=")
            rest = after
        else:
            size = int.from_bytes(after[:8], "little")
            name, value = line, after[8 : 8 + size]
            assert after[8 + size : 9 + size] == b"\n"
            rest = after[9 + size :]
        assert sep
        fields[name.decode()] = value.decode()
    return fields


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[tuple[logging.Logger, socket.socket]]:
    path = str(tmp_path / "journal")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(2)
    handler = JournalHandler("llmgwd", path)
    logger = logging.getLogger("llmgw.test_log")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield logger, sock
    finally:
        logger.removeHandler(handler)
        handler.close()
        sock.close()


def test_a_record_carries_its_fields_and_llmgws(
    journal: tuple[logging.Logger, socket.socket],
) -> None:
    logger, sock = journal
    logger.warning("replica %s failed", "r1", extra={"model": "tiny", "request": "ab12"})
    frame = inspect.currentframe()
    assert frame is not None
    line = frame.f_lineno - 3  # the warning's
    fields = decode(sock.recv(65536))
    assert fields["MESSAGE"] == "replica r1 failed"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "llmgwd"
    assert fields["LOGGER"] == "llmgw.test_log"
    assert fields["CODE_FILE"] == __file__
    assert fields["CODE_LINE"] == str(line)
    assert (fields["LLMGW_MODEL"], fields["LLMGW_REQUEST"]) == ("tiny", "ab12")
    assert "LLMGW_NODE" not in fields


def test_each_line_of_code_and_level_keeps_its_own_fields(
    journal: tuple[logging.Logger, socket.socket],
) -> None:
    logger, sock = journal
    seen = []
    for level in (logging.INFO, logging.ERROR, logging.INFO):
        logger.log(level, "one")
        logger.log(level, "two", extra={"node": "n1"})
    for _ in range(6):
        fields = decode(sock.recv(65536))
        seen.append((fields["MESSAGE"], fields["PRIORITY"], fields["CODE_LINE"]))
        assert ("LLMGW_NODE" in fields) == (fields["MESSAGE"] == "two")
    assert [s[1] for s in seen] == ["6", "6", "3", "3", "6", "6"]
    assert seen[0][2] != seen[1][2]
    assert seen[0] == seen[4]


def test_a_message_of_several_lines_and_a_traceback_arrive_whole(
    journal: tuple[logging.Logger, socket.socket],
) -> None:
    logger, sock = journal
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        logger.exception("first\nsecond")
    fields = decode(sock.recv(65536))
    message = fields["MESSAGE"]
    assert message.startswith("first\nsecond\nTraceback (most recent call last):")
    assert "RuntimeError: boom" in message
    assert fields["PRIORITY"] == "3"


@pytest.mark.parametrize("size", [300_000, 2_000_000])
def test_a_record_too_large_for_a_datagram_arrives_whole_in_a_sealed_memfd(
    journal: tuple[logging.Logger, socket.socket], size: int
) -> None:
    """journald takes a record over the datagram limit (~208 KiB) as an empty datagram that
    passes a sealed memfd holding it, as sd_journal_sendv sends it."""
    logger, sock = journal
    body = ("0123456789abcdef" * (size // 16 + 1))[:size]
    logger.error("a body: %s\nend", body, extra={"request": "ab12"})
    datagram, fds, _, _ = socket.recv_fds(sock, 65536, 1)
    assert datagram == b""
    assert len(fds) == 1
    with open(fds[0], "rb") as memfd:
        seals = fcntl.fcntl(memfd.fileno(), fcntl.F_GET_SEALS)
        want = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE
        assert seals & want == want
        memfd.seek(0)  # the sender wrote through the same open file: journald maps it
        fields = decode(memfd.read())
    assert fields["MESSAGE"] == f"a body: {body}\nend"
    assert fields["PRIORITY"] == "3"
    assert fields["LLMGW_REQUEST"] == "ab12"
    assert fields["SYSLOG_IDENTIFIER"] == "llmgwd"


def test_a_small_record_after_a_large_one_is_still_a_plain_datagram(
    journal: tuple[logging.Logger, socket.socket],
) -> None:
    logger, sock = journal
    logger.info("x" * 400_000)
    logger.info("small")
    datagram, fds, _, _ = socket.recv_fds(sock, 65536, 1)
    for fd in fds:
        os.close(fd)
    assert (datagram, len(fds)) == (b"", 1)
    datagram, fds, _, _ = socket.recv_fds(sock, 65536, 1)
    assert fds == []
    assert decode(datagram)["MESSAGE"] == "small"
