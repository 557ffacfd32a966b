import asyncio
import json

import pytest
import yaml

from searchteam.config import RunConfig, load_config
from searchteam.errors import ConfigError, LLMError
from searchteam.eval.runner import evaluate, read_results
from searchteam.factory import Components, build_sampling, build_team
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.runtime import Batcher, Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.types import Question
from tests.support.helpers import PASSAGES, TinyRetriever


def questions(n: int) -> list[Question]:
    return [Question(id=f"q{i}", question=f"question {i} France", golden_answers=["Paris"]) for i in range(n)]


async def test_batcher_gathers_concurrent_calls():
    seen: list[int] = []

    def double(items: list[int]) -> list[int]:
        seen.append(len(items))
        return [2 * x for x in items]

    batcher = Batcher(double, max_batch=8)
    results = await asyncio.gather(*(batcher.submit(i) for i in range(20)))
    await batcher.aclose()
    assert results == [2 * i for i in range(20)]
    assert seen == [8, 8, 4]


async def test_batcher_propagates_backend_errors():
    def broken(items):
        raise LLMError("server down")

    batcher = Batcher(broken)
    with pytest.raises(LLMError, match="server down"):
        await batcher.submit(1)
    await batcher.aclose()


async def test_episodes_record_turns_and_retrievals_in_batches():
    llm = ScriptedLLM(lambda req: "<answer>Paris</answer>")
    retriever = TinyRetriever(PASSAGES)
    backends = make_backends({"policy": llm}, retriever, max_batch=16)
    team = get_team("naive_rag")
    episodes, stats = await run_episodes(
        team.run, "naive_rag", questions(40), backends, Sampling(), progress=False
    )
    assert len(episodes) == 40 and all(e.answer == "Paris" for e in episodes)
    assert max(llm.batch_sizes) == 16 and len(llm.batch_sizes) < 40
    ep = episodes[0]
    assert [t.role for t in ep.turns] == ["answer"]
    assert ep.retrievals[0].query == ep.question.question and len(ep.retrievals[0].passages) == 3
    assert "Paris is the capital" in ep.turns[0].messages[-1]["content"]
    assert stats.episodes == 40 and 0.0 <= stats.orchestration_share <= 1.0


async def test_team_bug_is_recorded_but_backend_failure_stops_the_run():
    def flaky(req):
        if "question 3" in req.messages[-1]["content"]:
            raise ValueError("boom")
        return "<answer>x</answer>"

    class PerRequest(ScriptedLLM):
        def generate(self, requests):
            return [super(PerRequest, self).generate([r])[0] for r in requests]

    # a ValueError inside the backend propagates to the one episode and is recorded there
    backends = make_backends({"policy": PerRequest(flaky)}, None, max_batch=1)
    team = get_team("direct")
    episodes, _ = await run_episodes(team.run, "direct", questions(5), backends, Sampling(), progress=False)
    errors = [e for e in episodes if e.error]
    assert len(errors) == 1 and "boom" in errors[0].error

    def dead(req):
        raise LLMError("connection refused")

    backends = make_backends({"policy": ScriptedLLM(dead)}, None)
    with pytest.raises(LLMError):
        await run_episodes(team.run, "direct", questions(3), backends, Sampling(), progress=False)


async def test_episodes_come_back_in_the_order_of_the_questions():
    async def later_ones_finish_first(q: Question, ctx) -> str:
        await asyncio.sleep(0.01 * (5 - int(q.id[1:])))
        return q.id

    finished: list[str] = []
    backends = make_backends({}, None)
    episodes, _ = await run_episodes(
        later_ones_finish_first,
        "direct",
        questions(5),
        backends,
        Sampling(),
        progress=False,
        on_episode=lambda e: finished.append(e.answer),
    )
    assert finished == ["q4", "q3", "q2", "q1", "q0"]
    assert [e.answer for e in episodes] == ["q0", "q1", "q2", "q3", "q4"]


def test_unclosed_answer_tag_is_flagged_and_falls_back():
    # direct prefills "<answer>", so a reply that never closes it is an unclosed tag
    llm = ScriptedLLM(lambda req: "The answer is Paris. It is big.")
    backends = make_backends({"policy": llm}, None)
    team = get_team("direct")
    episodes, _ = asyncio.run(
        run_episodes(team.run, "direct", questions(1), backends, Sampling(), progress=False)
    )
    turn = episodes[0].turns[0]
    assert not turn.parsed_ok and "unclosed <answer>" in turn.parse_error
    assert episodes[0].answer == "The answer is Paris"


def test_eval_writes_incrementally_and_resumes(tmp_path):
    cfg = RunConfig(method="naive_rag", split="smoke", datasets=["nq", "hotpotqa"], limit=3, out=tmp_path)
    llm = ScriptedLLM(lambda req: "<answer>Frankie Valli</answer>")
    parts = Components(team=get_team("naive_rag"), llms={"policy": llm}, retriever=TinyRetriever(PASSAGES))
    summary = evaluate(cfg, parts, progress=False)
    assert summary["n"] == 6 and set(summary["per_dataset"]) == {"nq", "hotpotqa"}
    assert summary["benchmark"] == "v2"
    assert summary["per_dataset"]["nq"]["em"] == pytest.approx(1 / 3, abs=1e-4)
    rows = read_results(tmp_path / "results.jsonl")
    assert {"id", "prediction", "em", "cover_em", "f1", "llm_calls", "turns", "seconds"} <= set(rows[0])

    with pytest.raises(ConfigError, match="--resume"):
        evaluate(cfg, parts, progress=False)

    # simulate a crash: drop two finished rows and tear the last line, then resume
    lines = (tmp_path / "results.jsonl").read_text().splitlines()
    (tmp_path / "results.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][:20])
    calls_before = len(llm.requests)
    summary = evaluate(cfg.model_copy(update={"resume": True}), parts, progress=False)
    assert summary["n"] == 6 and len(llm.requests) - calls_before == 2
    assert len(read_results(tmp_path / "results.jsonl")) == 6
    assert json.loads((tmp_path / "summary.json").read_text())["n"] == 6

    # more questions may join a run; a setting that decides the answers may not change
    more = evaluate(cfg.model_copy(update={"resume": True, "limit": 4}), parts, progress=False)
    assert more["n"] == 8
    for change in (
        {"model": "qwen2.5-coder-0.5b"},
        {"max_new_tokens": 16},
        {"temperature": 0.7},
        {"benchmark": "v1"},  # a run is never continued on another benchmark version
    ):
        with pytest.raises(ConfigError, match=f"cannot resume.*{next(iter(change))}"):
            evaluate(cfg.model_copy(update={"resume": True, **change}), parts, progress=False)
    assert len(read_results(tmp_path / "results.jsonl")) == 8


def test_config_file_errors_name_the_field(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("method: direct\ntop_k: 0\n")
    with pytest.raises(ConfigError, match="field 'top_k'"):
        load_config(path, {})
    path.write_text("methd: direct\n")
    with pytest.raises(ConfigError, match="field 'methd'"):
        load_config(path, {})
    path.write_text("method: direct\ntop_k: 3\n")
    cfg = load_config(path, {"top_k": 7, "model": None})
    assert cfg.method == "direct" and cfg.top_k == 7
    assert build_sampling(cfg).for_role("answer").max_new_tokens == 128


def test_teams_keep_their_paper_top_k_and_turns_unless_the_config_sets_them():
    methods = ("dac", "qagent", "search_r1", "decor", "mask", "naive_rag")
    effective = {m: build_team(RunConfig(method=m)).settings for m in methods}
    assert {m: (s.top_k, s.max_turns) for m, s in effective.items()} == {
        "dac": (3, 4),
        "qagent": (1, 4),
        "search_r1": (3, 4),
        "decor": (5, 4),
        "mask": (5, 4),
        "naive_rag": (5, 4),
    }
    chosen = build_team(RunConfig(method="dac", top_k=7, max_turns=2)).settings
    assert (chosen.top_k, chosen.max_turns) == (7, 2)
    assert get_team("qagent", TeamSettings(max_turns=2)).settings.top_k == 1


def test_eval_config_records_the_effective_top_k_and_max_turns(tmp_path):
    cfg = RunConfig(method="search_r1", split="smoke", datasets=["nq"], limit=1, out=tmp_path)
    llm = ScriptedLLM(lambda req: "<answer>Paris</answer>")
    parts = Components(team=build_team(cfg), llms={"policy": llm}, retriever=TinyRetriever(PASSAGES))
    evaluate(cfg, parts, progress=False)
    written = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert (written["top_k"], written["max_turns"], written["method"]) == (3, 4, "search_r1")
