"""API keys on searchteam's servers (`serve`, `serve-retriever`): 401 without the key, /health open, the
key sent by searchteam's HTTP retriever, and no server beyond the loopback interface without a key."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from searchteam.auth import API_KEY_ENV, check_bind
from searchteam.cli import app as cli_app
from searchteam.config import RunConfig
from searchteam.errors import OpenServerRefused, RetrievalError
from searchteam.factory import Components
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.retrieval.http import HTTPRetriever
from searchteam.retrieval.server import create_app as retriever_app
from searchteam.serve import build_service
from searchteam.serve import create_app as team_app
from tests.support.helpers import PASSAGES, TinyRetriever, serve_on_loopback


def test_the_retriever_server_answers_only_requests_with_its_key(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with serve_on_loopback(retriever_app(TinyRetriever(PASSAGES), api_key="s3cret")) as url:
        base = url.removesuffix("/v1")
        with pytest.raises(RetrievalError, match=f"wants an API key .*{API_KEY_ENV}"):
            HTTPRetriever(base, max_retries=0).search(["Paris"], 1)
        with pytest.raises(RetrievalError, match="HTTP 401"):
            HTTPRetriever(base, max_retries=0, api_key="wrong").search(["Paris"], 1)
        assert HTTPRetriever(base, api_key="s3cret").search(["Paris"], 1)[0]
        monkeypatch.setenv(API_KEY_ENV, "s3cret")  # what searchteam's runs use
        assert HTTPRetriever(base).search(["Paris"], 1)[0]
        assert TestClient(retriever_app(TinyRetriever(PASSAGES), api_key="s3cret")).get("/health").is_success


def test_the_team_server_answers_only_requests_with_its_key():
    llm = ScriptedLLM(lambda r: "<answer>x</answer>")
    parts = Components(get_team("naive_rag"), {"policy": llm}, TinyRetriever(PASSAGES))
    client = TestClient(team_app(build_service(RunConfig(), parts), api_key="s3cret"))
    ask = {"question": "What is the capital of France?"}
    refused = client.post("/ask", json=ask)
    assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    assert client.post("/ask", json=ask, headers={"Authorization": "Bearer nope"}).status_code == 401
    chat = {"model": "naive_rag", "messages": [{"role": "user", "content": "hi"}]}
    assert client.post("/v1/chat/completions", json=chat).status_code == 401
    assert client.post("/ask", json=ask, headers={"Authorization": "Bearer s3cret"}).status_code == 200
    assert client.get("/health").status_code == 200


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "127.0.0.2"])
def test_loopback_needs_no_key(host):
    check_bind(host, None, allow_open=False)


def test_another_interface_needs_a_key_or_an_explicit_allowance():
    with pytest.raises(OpenServerRefused, match="--api-key"):
        check_bind("0.0.0.0", None, allow_open=False)
    check_bind("0.0.0.0", "s3cret", allow_open=False)
    check_bind("0.0.0.0", None, allow_open=True)


@pytest.mark.parametrize("command", [["serve-retriever"], ["serve", "--method", "naive_rag"]])
def test_the_servers_refuse_an_open_bind_before_loading_anything(command, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    result = CliRunner().invoke(cli_app, [*command, "--host", "0.0.0.0", "--corpus", "/nonexistent.jsonl"])
    assert result.exit_code == 2 and "without an API key" in result.output, result.output
