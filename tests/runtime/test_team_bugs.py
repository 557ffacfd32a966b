"""A team bug stops the run that meets it twice (eval, serve, the runtime under training); a refused request
or a malformed question fails its episode only; every failure is counted by kind."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from searchteam.config import RunConfig
from searchteam.errors import DataError, RequestRejected, TeamBug
from searchteam.eval.runner import evaluate
from searchteam.factory import Components
from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods.naive_rag.team import NaiveRAG
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.runtime.failures import TeamBugs, describe_failure, failure_kind
from searchteam.serve import build_service, create_app
from searchteam.types import Episode, Question
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTIONS = [Question(id=f"q{i}", question=f"What is the capital of France {i}?") for i in range(3)]


def paris(request: GenerationRequest) -> str:
    return "<answer>Paris</answer>"


class Faulty(NaiveRAG):
    """Naive RAG whose own code raises `fault(question)` first, unless that is None."""

    def __init__(self, fault) -> None:
        super().__init__()
        self.fault = fault

    async def run(self, q, ctx):
        exc = self.fault(q)
        if exc is not None:
            raise exc
        return await super().run(q, ctx)


def run(team: NaiveRAG, questions=QUESTIONS, bugs: TeamBugs | None = None, seen: list | None = None):
    backends = make_backends({"policy": ScriptedLLM(paris)}, TinyRetriever(PASSAGES))
    on_episode = seen.append if seen is not None else None
    return asyncio.run(
        run_episodes(
            team.solve, "naive_rag", questions, backends, Sampling(), concurrency=1, progress=False,
            on_episode=on_episode, bugs=bugs,
        )
    )  # fmt: skip


def test_a_bug_that_repeats_stops_the_run_with_its_traceback_and_count():
    seen: list[Episode] = []
    with pytest.raises(TeamBug) as stopped:
        run(Faulty(lambda q: TypeError("run() takes 3 positional arguments")), seen=seen)
    message = str(stopped.value)
    assert stopped.value.headline.startswith("the naive_rag team has a bug, in 2 of the 2 episodes so far")
    assert "TypeError: run() takes 3 positional arguments (at " in message and "test_team_bugs.py:" in message
    assert "Traceback (most recent call last)" in message and "raise exc" in message
    assert [e.error_kind for e in seen] == ["bug", "bug"]  # both handed over before the run stopped


def test_a_bug_seen_once_fails_its_episode_and_the_run_goes_on():
    episodes, _ = run(Faulty(lambda q: KeyError("meta") if q.id == "q1" else None))
    assert [e.answer for e in episodes] == ["Paris", "", "Paris"]
    assert episodes[1].error_kind == "bug" and episodes[1].error.startswith("KeyError: 'meta' (at ")


@pytest.mark.parametrize(
    ("exc", "kind"),
    [(RequestRejected("prompt past the context"), "rejected"), (DataError("bad subquestions"), "input")],
)
def test_expected_failures_fail_their_episodes_and_never_stop_the_run(exc: Exception, kind: str):
    episodes, _ = run(Faulty(lambda q: exc))
    assert [e.error_kind for e in episodes] == [kind] * 3
    assert episodes[0].error == f"{type(exc).__name__}: {exc}" == describe_failure(exc)
    assert failure_kind(exc) == kind


def test_the_count_of_a_run_spans_its_calls():
    """A training run keeps one count over its steps: a bug once per step stops it in the second step."""
    bugs = TeamBugs("naive_rag")
    once = lambda q: ZeroDivisionError("division by zero") if q.id == "q0" else None  # noqa: E731
    run(Faulty(once), bugs=bugs)
    with pytest.raises(TeamBug, match="in 2 of the 4 episodes so far: ZeroDivisionError"):
        run(Faulty(once), bugs=bugs)


def eval_config(out: Path, resume: bool = False) -> RunConfig:
    questions = out.parent / "questions.jsonl"
    lines = [json.dumps({"id": q.id, "question": q.question, "golden_answers": ["Paris"]}) for q in QUESTIONS]
    questions.write_text("\n".join(lines) + "\n")
    return RunConfig(method="naive_rag", questions=questions, out=out, resume=resume, concurrency=1)


def test_eval_stops_on_a_repeated_bug_with_its_summary_and_resume_asks_those_questions_again(tmp_path: Path):
    out = tmp_path / "run"
    bug = Faulty(lambda q: AttributeError("'Node' object has no attribute 'answer'"))
    parts = Components(bug, {"policy": ScriptedLLM(paris)}, TinyRetriever(PASSAGES))
    with pytest.raises(TeamBug, match="AttributeError"):
        evaluate(eval_config(out), parts, progress=False)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["n"] == 2 and summary["episode_errors_by_kind"] == {"bug": 2}
    assert summary["stopped"].startswith("the naive_rag team has a bug, in 2 of the 2 episodes")

    fixed = Components(NaiveRAG(), {"policy": ScriptedLLM(paris)}, TinyRetriever(PASSAGES))
    summary = evaluate(eval_config(out, resume=True), fixed, progress=False)
    assert summary["n"] == 3 and summary["em"] == 1.0 and summary["episode_errors"] == 0
    assert "stopped" not in summary and len((out / "results.jsonl").read_text().splitlines()) == 3


def test_a_server_stops_on_a_repeated_bug_and_says_so():
    bug = Faulty(lambda q: IndexError("list index out of range"))
    parts = Components(bug, {"policy": ScriptedLLM(paris)}, TinyRetriever(PASSAGES))
    service = build_service(RunConfig(method="naive_rag"), parts)
    told: list[TeamBug] = []
    service.on_broken = told.append
    client = TestClient(create_app(service))
    chat = {"model": "naive_rag", "messages": [{"role": "user", "content": "Capital of France?"}]}

    first = client.post("/v1/chat/completions", json=chat)  # one failure: that request only
    assert first.status_code == 500
    assert "failed on this question: IndexError" in first.json()["error"]["message"]
    assert client.get("/health").json()["status"] == "ok"
    second = client.post("/ask", json={"question": "Capital of France?"})
    assert second.status_code == 500 and "has a bug, in 2 of the 2 episodes" in second.json()["detail"]
    assert second.json()["detail"].endswith("The server stops.") and len(told) == 1
    health = client.get("/health")
    assert health.status_code == 503 and health.json()["status"] == "broken"
    third = client.post("/v1/chat/completions", json=chat)  # refused without running the team
    assert third.status_code == 500 and service.served == 2


def test_searchteam_serve_exits_with_the_bug_once_it_repeats():
    """`serve.serve`, as `searchteam serve` runs it (uvicorn on a port): the second failure of the same bug
    stops the server and `serve` raises it, so the command exits with the traceback."""
    import socket
    import threading
    import time

    import httpx

    from searchteam.serve import serve

    bug = Faulty(lambda q: IndexError("list index out of range"))
    parts = Components(bug, {"policy": ScriptedLLM(paris)}, TinyRetriever(PASSAGES))
    service = build_service(RunConfig(method="naive_rag"), parts)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    raised: list[BaseException] = []

    def run_server() -> None:
        try:
            serve(service, port=port)
        except TeamBug as stopped:
            raised.append(stopped)

    thread = threading.Thread(target=run_server, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            httpx.get(f"{url}/health", timeout=1)
            break
        except httpx.TransportError:
            time.sleep(0.05)
    asked = [httpx.post(f"{url}/ask", json={"question": "Where?"}, timeout=10) for _ in range(2)]
    thread.join(10)
    assert [reply.status_code for reply in asked] == [200, 500] and not thread.is_alive()
    (stopped,) = raised
    assert "IndexError" in stopped.headline and "Traceback" in str(stopped)
