"""hostio/answers.py against a real HTTP server on 127.0.0.1 (tests/kubernetes_api_server.py):
the byte caps at their boundaries, chunked answers, answers cut short, and the JSON value bound's exact
count. The deadline against dripping servers: tests/test_dra.py."""
import re
import time

import pytest

from hostio import answers
from hostio.answers import AnswerError, parse_json, values_at_most
from tests.kubernetes_api_server import FakeApiServer


@pytest.fixture()
def server():
    api = FakeApiServer().start()
    yield api
    api.stop()


def get(server, max_bytes: int, seconds: float = 30.0):
    host, port = "127.0.0.1", server.port
    return answers.get(host, port, "/x", time.monotonic() + seconds, max_bytes, {"Accept": "application/json"})


@pytest.mark.parametrize("drip", [None, ("chunks", 0.0), ("unframed", 0.0)])  # Content-Length, 1-byte chunks, neither
def test_an_answer_of_exactly_the_cap_is_read_one_byte_more_is_refused(server, drip):
    server.body, server.drip = b"x" * 100, drip
    framing = 100 * 5 + 5 if drip and drip[0] == "chunks" else 0  # "1\r\n" + byte + "\r\n" per chunk, "0\r\n\r\n"
    answer = get(server, 100 + framing)
    assert (answer.status, bytes(answer.body)) == (200, b"x" * 100)
    with pytest.raises(AnswerError, match=f"answer over {99 + framing} bytes"):
        get(server, 99 + framing)


def test_headers_over_their_cap_and_answers_cut_short_are_errors(server, monkeypatch):
    server.body, server.drip = b"{}", ("headers", 0.0)  # 4 KB of padding in the headers
    monkeypatch.setattr(answers, "MAX_HEAD_BYTES", 1024)
    with pytest.raises(AnswerError, match="headers over 1024 bytes"):
        get(server, 1000)
    monkeypatch.undo()
    assert bytes(get(server, 1000).body) == b"{}"


def test_json_values_are_counted_exactly_on_small_texts():
    text = b'{"a":[1,2],"b":{"c":3}}'  # dict, "a", list, 1, 2, "b", dict, "c", 3: 9 objects
    assert values_at_most(text) == 9
    assert parse_json(text, 9) == {"a": [1, 2], "b": {"c": 3}}
    with pytest.raises(AnswerError, match="JSON of more than 8 values"):
        parse_json(text, 8)
    assert values_at_most(b"[[],[]]") == 5 and values_at_most(b'"a,b"') == 2  # empty, in strings: looser
    with pytest.raises(AnswerError, match="JSON nested too deeply"):
        parse_json(b"[" * 50_000 + b"]" * 50_000, 10**6)
    with pytest.raises(AnswerError, match="not JSON"):
        parse_json(b"\xff{", 10)


def test_chunks_finer_than_their_floor_are_refused_past_the_free_ones(server):
    """Each chunk costs the decoder a step whatever its size: past the first FREE_CHUNKS, chunks must
    average MIN_MEAN_CHUNK_BYTES (a Prometheus answering 60 MiB in 1-byte chunks took `gpu-spatial
    report` to 1.8 GB). Exact at both bounds, over a real HTTP server."""
    from hostio.answers import FREE_CHUNKS, MIN_MEAN_CHUNK_BYTES

    server.drip = ("chunks", 0.0)
    server.body = b"x" * FREE_CHUNKS
    assert bytes(get(server, 10**6).body) == server.body  # the free ones, 1 byte each
    server.body = b"x" * (FREE_CHUNKS + 1)
    with pytest.raises(AnswerError, match=f"^{FREE_CHUNKS + 1} chunks of {FREE_CHUNKS + 1} bytes: chunked finer than "
                                          f"{MIN_MEAN_CHUNK_BYTES} bytes a chunk$"):
        get(server, 10**6)
    last = (FREE_CHUNKS + 1) * MIN_MEAN_CHUNK_BYTES - FREE_CHUNKS  # the mean exactly at the floor
    for size, refused in ((last, False), (last - 1, True)):
        server.body, server.chunk_sizes = b"y" * (FREE_CHUNKS + size), [1] * FREE_CHUNKS + [size]
        if refused:
            with pytest.raises(AnswerError, match="chunked finer than"):
                get(server, 10**6)
        else:
            assert bytes(get(server, 10**6).body) == server.body


@pytest.mark.parametrize("chunks, why", [
    (b"-5\r\nabc", "chunk size b'-5' is no number"), (b"0x5\r\nabcde\r\n0\r\n\r\n", "chunk size b'0x5' is no number"),
    (b"3\r\nabcdef\r\n0\r\n\r\n", "a chunk longer than its size"), (b"3\r\nabc\r\n" + b"1" * 2000, "a chunk size line over"),
    (b"fffffff\r\nab", "answer over 100000 bytes (a chunk of 268435455)"), (b"3\r\nab", "the connection closed inside"),
], ids=["signed", "0x", "longer", "endless-line", "over-the-cap", "cut"])
def test_chunk_framing_that_is_no_chunk_is_refused(server, chunks, why):
    """A sign or 0x that int(, 16) takes, a chunk longer than its size, an endless size line, a chunk
    larger than the cap, a cut: each an AnswerError, before the body it claims is read."""
    server.body, server.drip, server.raw_chunks = b"", ("chunks", 0.0), chunks
    with pytest.raises(AnswerError, match=re.escape(why)):
        get(server, 100_000)


def test_a_chunked_answer_costs_its_body_not_an_object_per_chunk(server):
    """4 MiB in chunks of 64 bytes (at the floor): the old decoder kept the framed answer, an object per
    chunk and their join (traced 3x the body and more); now the body and one read (traced Python memory)."""
    import tracemalloc

    body = bytes(range(256)) * (4 * 2**20 // 256)
    framed = b"".join(b"40\r\n" + body[at:at + 64] + b"\r\n" for at in range(0, len(body), 64)) + b"0\r\n\r\n"
    server.body, server.drip, server.raw_chunks = b"", ("chunks", 0.0), framed  # built before it is traced
    tracemalloc.start()
    try:
        answer = get(server, len(framed))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert bytes(answer.body) == body
    assert peak < len(body) * 1.3 + 2**20, peak


def decoded_in_two_reads(framed: bytes, split: int, max_bytes: int = 10**6) -> bytes:
    """What Unchunked makes of `framed` arriving as two reads cut at `split`."""
    from hostio.answers import Unchunked

    body = Unchunked(max_bytes)
    done = body.feed(framed[:split]) or body.feed(framed[split:])
    assert done, split
    return bytes(body.body)


def test_a_chunked_answer_reads_the_same_wherever_the_reads_cut_it():
    """TCP hands the bytes over cut anywhere: in a size line, between a CR and its LF, inside the data.
    Every cut of a small answer decodes to its body, extensions and all; a size line of exactly
    MAX_CHUNK_LINE_BYTES is read wherever it is cut, one byte more is refused wherever it is cut."""
    from hostio.answers import MAX_CHUNK_LINE_BYTES

    framed = b"3\r\nabc\r\n1;ext=1\r\n\n\r\n10\r\n" + b"0123456789abcdef" + b"\r\n0\r\n\r\n"
    for split in range(len(framed) + 1):
        assert decoded_in_two_reads(framed, split) == b"abc\n0123456789abcdef"
    for size, refused in ((MAX_CHUNK_LINE_BYTES, False), (MAX_CHUNK_LINE_BYTES + 1, True)):
        line = b"2;" + b"x" * (size - 2)
        framed = b"1\r\na\r\n" + line + b"\r\nbc\r\n0\r\n\r\n"
        for split in range(len(framed) + 1):
            if refused:
                with pytest.raises(AnswerError, match=f"a chunk size line over {MAX_CHUNK_LINE_BYTES} bytes"):
                    decoded_in_two_reads(framed, split)
            else:
                assert decoded_in_two_reads(framed, split) == b"abc", split


def test_headers_of_exactly_their_cap_are_read(server, monkeypatch):
    """The head (status line and headers, without the blank line) may be MAX_HEAD_BYTES long; one byte
    more is refused, whether it came in one read or several."""
    server.body, server.drip = b"{}", ("headers", 0.0)  # one write: tests/kubernetes_api_server.py's head
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\nX-Padding: "
            + b"x" * 4096)
    monkeypatch.setattr(answers, "MAX_HEAD_BYTES", len(head))
    assert bytes(get(server, 1000).body) == b"{}"
    monkeypatch.setattr(answers, "MAX_HEAD_BYTES", len(head) - 1)
    with pytest.raises(AnswerError, match=f"headers over {len(head) - 1} bytes"):
        get(server, 1000)
