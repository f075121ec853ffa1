"""hostio/answers.py against a real HTTP server on 127.0.0.1 (tests/kubernetes_api_server.py):
the byte caps at their boundaries, chunked answers, answers cut short, and the JSON value bound's exact
count. The deadline against dripping servers: tests/test_dra.py."""
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


@pytest.mark.parametrize("drip", [None, ("chunks", 0.0)])  # Content-Length, then 1-byte chunks
def test_an_answer_of_exactly_the_cap_is_read_one_byte_more_is_refused(server, drip):
    server.body, server.drip = b"x" * 100, drip
    framing = 0 if drip is None else 100 * 5 + 5  # "1\r\n" + byte + "\r\n" per chunk, "0\r\n\r\n"
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
