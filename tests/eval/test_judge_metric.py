"""The LLM-judge accuracy metric (`judge_acc`) with a scripted judge: verdicts per row and per slice of the
summary, the on-disk cache (a rerun asks nothing and builds no judge), and a malformed reply (flagged,
cover-EM fallback)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchteam.config import RunConfig
from searchteam.eval.judge_metric import VerdictCache, judge_rows, prompt_hash, verdict_key
from searchteam.eval.runner import evaluate, read_results
from searchteam.factory import Components
from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from tests.support.helpers import PASSAGES, TinyRetriever


def row(qid: str, prediction: str, golds: list[str], question: str = "who?") -> dict:
    return {"id": qid, "question": question, "prediction": prediction, "golden_answers": golds}


def verdicts(replies: dict[str, str]):
    """A judge that answers by the prediction in its prompt (the reply follows the prefilled <verdict>)."""

    def respond(request: GenerationRequest) -> str:
        prompt = request.messages[-1]["content"]
        return next(reply for prediction, reply in replies.items() if f"Prediction: {prediction}\n" in prompt)

    return ScriptedLLM(respond, name="judge")


def no_judge():
    raise AssertionError("every verdict should have come from the cache")


def test_verdicts_become_judge_acc_and_a_malformed_reply_falls_back_to_cover_em(tmp_path: Path):
    judge = verdicts({"Paris": "YES</verdict>", "Lyon": "NO</verdict>", "France's capital Paris": "maybe"})
    rows = [
        row("a", "Paris", ["Paris"]),
        row("b", "Lyon", ["Paris"]),
        row("c", "France's capital Paris", ["Paris"]),  # unparseable: cover-EM says 1
    ]
    judged = judge_rows(rows, "judge-m", lambda: judge, VerdictCache(tmp_path / "v.sqlite"), batch_size=2)
    assert [(r["judge_acc"], r["judge_unparsed"]) for r in judged] == [
        (1.0, False),
        (0.0, False),
        (1.0, True),
    ]
    assert judge.batch_sizes == [2, 1]
    first = judge.requests[0]
    assert first.continuation == "<verdict>" and first.sampling.temperature == 0.0
    assert (
        "Question: who?" in first.messages[-1]["content"]
        and "Reference Answer(s):\nParis" in (first.messages[-1]["content"])
    )


def test_cached_verdicts_are_reused_and_any_change_of_key_asks_again(tmp_path: Path):
    cache = VerdictCache(tmp_path / "v.sqlite")
    rows = [row("a", "Paris", ["Paris"]), row("b", "Lyon", ["Paris"])]
    judge_rows(rows, "judge-m", lambda: verdicts({"Paris": "YES", "Lyon": "NO"}), cache)
    again = judge_rows(rows, "judge-m", no_judge, VerdictCache(tmp_path / "v.sqlite"))
    assert [r["judge_acc"] for r in again] == [1.0, 0.0]

    judge = verdicts({"Paris": "NO", "Lyon": "YES"})
    changed = [row("a", "Paris", ["Paris", "City of Light"]), row("b", "Lyon", ["Paris"], question="where?")]
    judge_rows(changed + rows, "judge-m", lambda: judge, cache)
    judge_rows(rows, "other-judge", lambda: judge, cache)
    assert len(judge.requests) == 4  # new golds, new question, then a new judge model for both rows
    key = verdict_key("judge-m", prompt_hash(), "who?", "Paris", ["Paris"])
    assert key != verdict_key("judge-m", "another prompt", "who?", "Paris", ["Paris"])


def test_eval_adds_judge_acc_to_rows_and_every_slice_of_the_summary(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SEARCHTEAM_CACHE", str(tmp_path / "cache"))
    policy = ScriptedLLM(lambda req: "<answer>Frankie Valli</answer>")
    parts = Components(team=get_team("naive_rag"), llms={"policy": policy}, retriever=TinyRetriever(PASSAGES))
    cfg = RunConfig(
        method="naive_rag",
        split="smoke",
        datasets=["nq", "hotpotqa"],
        limit=2,
        out=tmp_path / "run",
        judge_model="judge-m",
    )
    judge = ScriptedLLM(lambda req: "YES")
    summary = evaluate(cfg, parts, progress=False, judge=judge)
    rows = read_results(tmp_path / "run" / "results.jsonl")
    assert all(r["judge_acc"] == 1.0 and not r["judge_unparsed"] for r in rows)
    assert summary["judge_acc"] == 1.0 and summary["judge_model"] == "judge-m"
    assert summary["per_dataset"]["nq"]["judge_acc"] == summary["per_group"]["multi-hop"]["judge_acc"] == 1.0
    assert summary["judge_unparsed"] == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["judge_acc"] == 1.0

    rerun = evaluate(cfg.model_copy(update={"resume": True}), parts, progress=False, judge=ScriptedLLM([]))
    assert rerun["judge_acc"] == 1.0  # every verdict cached: the judge was not asked


def test_a_run_without_a_judge_reports_no_judge_acc(tmp_path: Path):
    policy = ScriptedLLM(lambda req: "<answer>Paris</answer>")
    parts = Components(team=get_team("naive_rag"), llms={"policy": policy}, retriever=TinyRetriever(PASSAGES))
    cfg = RunConfig(method="naive_rag", split="smoke", datasets=["nq"], limit=1, out=tmp_path)
    summary = evaluate(cfg, parts, progress=False)
    assert "judge_acc" not in summary and "judge_unparsed" not in summary


@pytest.mark.parametrize("reply", ["", "I think so", "<verdict>MAYBE</verdict>"])
def test_unparseable_replies_are_flagged(tmp_path: Path, reply: str):
    rows = [row("a", "Lyon", ["Paris"])]
    judged = judge_rows(rows, "j", lambda: ScriptedLLM([reply]), VerdictCache(tmp_path / "v.sqlite"))
    assert judged[0]["judge_unparsed"] is True and judged[0]["judge_acc"] == 0.0
