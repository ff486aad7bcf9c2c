"""The cluster side's small pieces (no SSH): output pumping, the request line, progress."""

from __future__ import annotations

import io
import os

from elastic_ray.remote import server, wire


class Chunks:
    """A stream that hands out the given byte chunks one read at a time."""

    def __init__(self, *chunks: bytes):
        self.chunks = list(chunks)

    def read1(self, n: int) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


def events(out: io.BytesIO) -> list[dict]:
    return [wire.decode(line) for line in out.getvalue().splitlines(keepends=True)]


def test_a_character_split_between_two_reads_arrives_whole():
    out = io.BytesIO()
    text = "Überall 10 µs\n".encode()
    server._pump(Chunks(text[:1], text[1:9], text[9:11], text[11:]), 1, server.Reply(out))
    got = "".join(e["data"] for e in events(out))
    assert got == "Überall 10 µs\n" and "\ufffd" not in got
    assert {e["fd"] for e in events(out)} == {1}


def test_the_request_line_is_read_without_swallowing_what_follows():
    r, w = os.pipe()
    os.write(w, b'{"op": "x"}\nREST')
    os.close(w)
    try:
        assert server.read_request_line(r) == b'{"op": "x"}'
        assert os.read(r, 10) == b"REST"
    finally:
        os.close(r)


def test_a_repeated_progress_message_is_sent_once():
    out = io.BytesIO()
    reply = server.Reply(out)
    for message in ["head 5: PENDING", "head 5: PENDING", "head 5: RUNNING", "head 5: RUNNING"]:
        reply.progress(message)
    assert [e["message"] for e in events(out)] == ["head 5: PENDING", "head 5: RUNNING"]


def test_a_bad_request_line_is_answered_with_an_error_event():
    for line, kind in [(b"not json\n", "ProtocolError"), (b"\n", "ProtocolError"), (b"[1]\n", "ProtocolError"),
                       (b'{"schema": "other"}\n', "RemoteVersionMismatch")]:
        r, w = os.pipe()
        os.write(w, line)
        os.close(w)
        out = io.BytesIO()
        try:
            assert server.serve(r, out) == 1
        finally:
            os.close(r)
        (event,) = events(out)
        assert event["ev"] == "error" and event["type"] == kind, event
