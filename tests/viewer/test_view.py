"""`searchteam view`: run indexing, the episode timeline, the HTTP API and its 4xx cases, and the page
itself in a real headless Chromium."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from typer.testing import CliRunner

from searchteam.cli import app as cli_app
from searchteam.errors import ViewerError
from searchteam.viewer import create_app
from searchteam.viewer.runs import Filters, open_run, timeline
from tests.support.helpers import serve_on_loopback

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
CORPUS = [
    {"id": "d1", "title": "Thomas Mann", "text": "Thomas Mann was a German novelist."},
    {"id": "d2", "title": "David Guterson", "text": "David Guterson is an American novelist."},
    {"id": "d3", "title": "Paris", "text": "Paris is the capital of France."},
]


def turn(role: str, step: int, completion: str, ok: bool = True, **extra) -> dict:
    return {
        "role": role,
        "step": step,
        "messages": [{"role": "system", "content": "You plan."}, {"role": "user", "content": "Q?"}],
        "completion": completion,
        "parsed_ok": ok,
        "parse_error": None if ok else "missing <search> tag",
        "prompt_tokens": 10,
        "completion_tokens": 5,
        "model": "policy",
        "meta": {},
        **extra,
    }


def eval_row(qid: str, dataset: str, prediction: str, golds: list[str], **extra) -> dict:
    correct = float(prediction in golds)
    return {
        "id": qid,
        "dataset": dataset,
        "question": f"question {qid}",
        "golden_answers": golds,
        "prediction": prediction,
        "em": correct,
        "cover_em": correct,
        "acc": correct,
        "f1": correct,
        "gold_rank": 1,
        "llm_calls": 2,
        "turns": [],
        "searches": [],
        "states": [],
        "error": None,
        **extra,
    }


def write_eval_run(run_dir: Path, corpus: Path | None, retriever: str = "bm25", b_side: bool = False) -> Path:
    """Three questions: a correct two-role M-ASK-like episode, a planner format error, a plain miss."""
    run_dir.mkdir(parents=True)
    config = {"method": "mask" if not b_side else "naive_rag", "model": "scripted", "retriever": retriever}
    (run_dir / "config.yaml").write_text(yaml.safe_dump(config | {"corpus": str(corpus) if corpus else None}))
    first = eval_row(
        "q1",
        "hotpotqa",
        "Thomas Mann" if not b_side else "Guterson",
        ["Thomas Mann"],
        turns=[
            turn("planner", 0, "<search>German novelist</search>"),
            turn("answer", 0, "<answer>Thomas Mann</answer>"),
        ],
        searches=[{"step": 0, "query": "German novelist", "ids": ["d1", "d2", "missing-id"]}],
        states=[{"step": 0, "memory": [{"query": "German novelist", "evidence": "Mann was German"}]}],
    )
    rows = [
        first,
        eval_row("q2", "nq", "Lyon", ["Paris"], turns=[turn("planner", 0, "no tags", ok=False)]),
        eval_row(
            "q3", "nq", "Paris", ["London"], turns=[turn("answer", 0, "<answer>Paris</answer>")], judge_acc=1
        ),
    ]
    text = "".join(json.dumps(r) + "\n" for r in (rows if not b_side else rows[:1]))
    (run_dir / "results.jsonl").write_text(text + '{"id": "torn', encoding="utf-8")
    return run_dir


def write_train_run(run_dir: Path) -> Path:
    """Two steps of GRPO-style rollouts: the same question sampled twice per step, rewards per turn."""
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump({"method": "search_r1", "model": "scripted"}))
    records = []
    for step in (1, 2):
        for replica, answer in enumerate(["Paris", "Lyon"]):
            records.append(
                {
                    "step": step,
                    "question": {
                        "id": "t1",
                        "question": "capital of France?",
                        "golden_answers": ["Paris"],
                        "dataset": "nq",
                        "meta": {"replica": replica},
                    },
                    "answer": answer,
                    "error": None,
                    "meta": {"reward": float(answer == "Paris"), "group_id": "t1"},
                    "turns": [
                        {
                            "role": "agent",
                            "step": 0,
                            "completion": f"<answer>{answer}</answer>",
                            "parsed_ok": True,
                            "parse_error": None,
                            "reward": float(answer == "Paris"),
                            "meta": {},
                        }
                    ],
                }
            )
    (run_dir / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run_dir


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in CORPUS))
    return path


@pytest.fixture
def runs(tmp_path: Path, corpus: Path) -> tuple[Path, Path]:
    return write_eval_run(tmp_path / "a", corpus), write_eval_run(tmp_path / "b", corpus, b_side=True)


def test_run_index_summarizes_rows_and_skips_a_torn_line(runs):
    run = open_run(runs[0])
    info = run.info()
    assert (info["kind"], info["method"], info["n"], info["skipped_lines"]) == ("eval", "mask", 3, 1)
    assert info["datasets"] == ["hotpotqa", "nq"] and info["roles"] == ["answer", "planner"]
    assert info["metrics"] == ["em", "cover_em", "acc", "f1", "judge_acc"]
    assert run.rows["q2"].error_roles == ("planner",) and run.passage_ids == {"d1", "d2", "missing-id"}


@pytest.mark.parametrize(
    ("filters", "keys"),
    [
        (Filters(), ["q1", "q2", "q3"]),
        (Filters(dataset="nq"), ["q2", "q3"]),
        (Filters(outcome="correct"), ["q1"]),
        (Filters(outcome="incorrect", dataset="nq"), ["q2", "q3"]),
        (Filters(format_errors=True), ["q2"]),
        (Filters(format_errors=True, role="answer"), []),
        (Filters(role="answer"), ["q1", "q3"]),
        (Filters(text="Q3"), ["q3"]),
        (Filters(outcome="correct", metric="judge_acc"), ["q3"]),  # the LLM judge's verdict
    ],
)
def test_filters(runs, filters, keys):
    assert [r.key for r in open_run(runs[0]).filtered(filters)] == keys


def test_timeline_reads_like_a_case_study():
    turns = [turn("search", 1, "<search>who wrote Q</search>"), turn("summary", 1, "evidence")]
    searches = [{"step": 0, "query": "Q", "ids": ["a"]}, {"step": 1, "query": "who  wrote Q", "ids": ["b"]}]
    states = [{"step": 1, "memory": []}]
    items = timeline(turns, searches, states)
    assert [(i["kind"], i.get("role") or i.get("query")) for i in items] == [
        ("search", "Q"),  # retrieve-then-read: no turn wrote the step-0 query
        ("turn", "search"),
        ("search", "who  wrote Q"),  # right after the turn that wrote it
        ("turn", "summary"),
        ("state", None),
    ]
    assert items[-1]["state"] == {"memory": []}


def test_timeline_follows_the_recorded_order_of_searches():
    """A search saved with `after_turns` goes where it ran, even where no turn wrote its query verbatim."""
    turns = [turn("plan", 0, '{"subquestions": ["Who wrote Q?"]}'), turn("answer", 0, "A")]
    searches = [{"step": 0, "after_turns": 1, "query": "who wrote q", "ids": ["a"]}]
    items = timeline(turns, searches, [])
    assert [(i["kind"], i.get("role") or i.get("query")) for i in items] == [
        ("turn", "plan"),
        ("search", "who wrote q"),
        ("turn", "answer"),
    ]
    retrieve_then_read = [{"step": 0, "after_turns": 0, "query": "A", "ids": ["a"]}]  # "A" is also an output
    assert [i["kind"] for i in timeline(turns, retrieve_then_read, [])] == ["search", "turn", "turn"]


def test_api_lists_pages_and_pairs_the_other_run(runs):
    client = TestClient(create_app(list(runs)))
    infos = client.get("/api/runs").json()
    assert [i["name"] for i in infos] == ["a", "b"] and infos[0]["scores"]["em"] == 0.3333
    page = client.get("/api/runs/0/questions", params={"limit": 2}).json()
    assert page["total"] == 3 and [r["key"] for r in page["rows"]] == ["q1", "q2"]
    assert page["rows"][0]["other"]["prediction"] == "Guterson" and page["rows"][1]["other"] is None
    rest = client.get("/api/runs/0/questions", params={"limit": 2, "offset": 2}).json()
    assert [r["key"] for r in rest["rows"]] == ["q3"]
    errors = client.get("/api/runs/0/questions", params={"format_errors": "true"}).json()
    assert [r["key"] for r in errors["rows"]] == ["q2"]


def test_episode_resolves_passages_from_the_runs_corpus(runs):
    client = TestClient(create_app(list(runs)))
    data = client.get("/api/runs/0/episodes/q1").json()
    assert [i["kind"] for i in data["timeline"]] == ["turn", "search", "turn", "state"]
    assert data["passages"]["d1"] == {"title": "Thomas Mann", "text": "Thomas Mann was a German novelist."}
    assert "missing-id" not in data["passages"] and data["passages_status"].startswith("ready (1 ids not in")
    assert data["facts"]["gold_rank"] == 1 and data["scores"]["em"] == 1.0
    assert client.get("/api/runs/1/episodes/q1").json()["prediction"] == "Guterson"


def test_passages_degrade_to_ids_when_the_corpus_is_unknown(tmp_path):
    run_dir = write_eval_run(tmp_path / "remote", None, retriever="http://127.0.0.1:9/")
    data = TestClient(create_app([run_dir])).get("/api/runs/0/episodes/q1").json()
    assert data["passages"] == {} and data["passages_status"].startswith("unavailable: the run searched")
    search = next(i for i in data["timeline"] if i["kind"] == "search")
    assert search["ids"] == ["d1", "d2", "missing-id"]


def test_training_rollouts_show_turn_rewards(tmp_path):
    client = TestClient(create_app([write_train_run(tmp_path / "train")]))
    info = client.get("/api/runs").json()[0]
    assert info["kind"] == "train" and info["n"] == 4 and info["scores"]["reward"] == 0.5
    keys = [r["key"] for r in client.get("/api/runs/0/questions").json()["rows"]]
    assert keys == ["t1@step1.1", "t1@step1.2", "t1@step2.1", "t1@step2.2"]
    data = client.get("/api/runs/0/episodes/t1@step2.2").json()
    assert data["prediction"] == "Lyon" and data["scores"]["reward"] == 0.0 and data["facts"]["step"] == 2
    assert data["timeline"][0]["reward"] == 0.0 and data["passages_status"] == "none"


@pytest.mark.parametrize(
    ("url", "status", "message"),
    [
        ("/api/runs/0/episodes/nope", 404, "no question 'nope' in run 0"),
        ("/api/runs/2/episodes/q1", 404, "no run 2"),
        ("/api/runs/1/episodes/q2", 404, "no question 'q2' in run 1"),
        ("/api/runs/0/questions?outcome=maybe", 422, "outcome"),
        ("/api/runs/0/questions?metric=f1", 422, "metric must be one of em, cover_em, acc"),
        ("/api/runs/0/questions?limit=0", 422, "limit"),
        ("/api/runs/x/questions", 422, "run"),
    ],
)
def test_bad_requests_get_a_message(runs, url, status, message):
    response = TestClient(create_app(list(runs))).get(url)
    assert response.status_code == status and message in response.json()["detail"]


def test_the_viewer_is_read_only(runs):
    client = TestClient(create_app(list(runs)))
    assert client.post("/api/runs/0/questions").status_code == 405
    assert client.delete("/api/runs/0/episodes/q1").status_code == 405


def test_view_refuses_a_directory_that_is_not_a_run(tmp_path):
    with pytest.raises(ViewerError, match="not a run directory"):
        create_app([tmp_path])
    result = CliRunner().invoke(cli_app, ["view", str(tmp_path)])
    assert result.exit_code == 2 and "not a run directory" in " ".join(result.output.split())


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get)")
def test_page_in_headless_chromium(runs, tmp_path):
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    shutil.copy(runs[0] / "results.jsonl", tmp_path / "a-results.jsonl")  # the viewer must not write
    with serve_on_loopback(create_app(list(runs))) as api, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto(api.removesuffix("/v1") + "/")
        page.wait_for_selector("#tbody tr")
        assert page.locator("#tbody tr").count() == 3 and "3 questions" in page.inner_text("#count")
        page.select_option("#f-dataset", "nq")
        page.wait_for_function("document.querySelectorAll('#tbody tr').length === 2")
        page.select_option("#f-dataset", "")
        page.wait_for_function("document.querySelectorAll('#tbody tr').length === 3")
        page.locator("#tbody tr", has_text="question q1").click()
        page.wait_for_selector(".col table.case tbody tr")
        columns = page.locator("#episode .col")
        assert columns.count() == 2  # A and B side by side
        a_rows = columns.nth(0).locator("table.case tbody tr")
        assert a_rows.count() == 4
        assert a_rows.nth(0).locator("td").nth(1).inner_text().startswith("planner")
        assert "German novelist" in a_rows.nth(1).inner_text() and "Thomas Mann" in a_rows.nth(1).inner_text()
        assert "Mann was German" in a_rows.nth(3).inner_text()  # the state snapshot (DECOR-style memory)
        assert "Guterson" in columns.nth(1).inner_text()
        page.locator("#tbody tr", has_text="question q2").click()
        # q1's columns also carry bad tags, so wait for q2's own content: B's 404 message
        columns.nth(1).get_by_text("no question 'q2' in run 1").wait_for(timeout=10_000)
        assert "not in B" in page.inner_text("#tbody") and "Guterson" not in columns.nth(1).inner_text()
        assert "✗ format" in columns.nth(0).inner_text()  # q2's planner turn failed to parse
        shot = tmp_path / "viewer.png"
        page.screenshot(path=str(shot), full_page=True)
        browser.close()
    assert shot.stat().st_size > 10_000
    assert (runs[0] / "results.jsonl").read_bytes() == (tmp_path / "a-results.jsonl").read_bytes()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get)")
def test_page_shows_what_the_trainer_reads_of_a_turn(tmp_path):
    """A DAC-like rollout: a frozen turn, a hard-positive subgroup, a continued trajectory with a masked
    environment span and an SFT target appear on the turn, not only in its raw record."""
    run_dir = write_train_run(tmp_path / "train")
    record = json.loads((run_dir / "rollouts.jsonl").read_text().splitlines()[0])
    record["turns"] = [
        turn("searcher", 0, "<search>Thomas Mann</search>", continuation_chars=42, env_spans=[[10, 30]]),
        turn("generator", 1, "<answer>Paris</answer>", subgroup="hard_positive", sft_target="Lübeck"),
        turn("reader", 2, "Paris", frozen=True),
    ]
    (run_dir / "rollouts.jsonl").write_text(json.dumps(record) + "\n")
    sync_playwright = pytest.importorskip("playwright.sync_api").sync_playwright
    with serve_on_loopback(create_app([run_dir])) as api, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page()
        page.goto(api.removesuffix("/v1") + "/")
        page.locator("#tbody tr").first.click()
        page.wait_for_selector(".col table.case tbody tr")
        rows = page.locator(".col table.case tbody tr.turn")
        assert "continues 42 chars" in rows.nth(0).inner_text()
        assert rows.nth(0).get_by_text("continues 42 chars").get_attribute("title") == (
            "1 environment span(s) masked out of the loss"
        )
        assert "group hard_positive" in rows.nth(1).inner_text() and "SFT target" in rows.nth(1).inner_text()
        assert "frozen" in rows.nth(2).inner_text() and "frozen" not in rows.nth(1).inner_text()
        browser.close()
