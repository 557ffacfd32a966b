"""experiments/evidence_headroom.py: the selections in front of naive RAG's reader, on made-up passages."""

import asyncio
import importlib.util
import json
from pathlib import Path

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.types import Passage, Question
from tests.support.helpers import PASSAGES, TinyRetriever

SCRIPT = Path(__file__).resolve().parent.parent / "evidence_headroom.py"
spec = importlib.util.spec_from_file_location("evidence_headroom", SCRIPT)
headroom = importlib.util.module_from_spec(spec)
spec.loader.exec_module(headroom)

DOCS = [
    Passage(id="a", title="Paris", text="Paris is the capital of France."),
    Passage(id="b", title="Thomas Mann", text="Thomas Mann was a German novelist."),
    Passage(id="c", title="Lübeck", text="Lübeck is where Thomas Mann was born."),
]


def ids(passages: list[Passage]) -> list[str]:
    return [p.id for p in passages]


def question(golds: list[str], **meta) -> Question:
    return Question(id="q", question="Which novelist was German?", golden_answers=golds, meta=meta)


def test_oracle_selections_read_the_gold_answer_and_fall_back_to_the_top_k():
    select = headroom.SELECTIONS
    assert ids(select["top_k"](DOCS, question(["Thomas Mann"]))) == ["a", "b", "c"]
    assert ids(select["first"](DOCS, question(["Thomas Mann"]))) == ["a"]
    assert ids(select["oracle_first"](DOCS, question(["thomas mann"]))) == ["b"]
    assert ids(select["oracle_all"](DOCS, question(["Thomas Mann"]))) == ["b", "c"]
    assert ids(select["oracle_first"](DOCS, question(["Berlin"]))) == ["a", "b", "c"]


def test_gold_support_reads_the_first_passage_of_each_supporting_title(monkeypatch):
    corpus = {"Lübeck": [DOCS[2]], "Thomas Mann": [DOCS[1], DOCS[0]]}
    monkeypatch.setattr(headroom, "passages_by_title", lambda: corpus)
    supported = question(["Thomas Mann"], supporting_titles=["Thomas Mann", "Lübeck", "Nowhere"])
    assert ids(headroom.gold_support(DOCS[:1], supported)) == ["b", "c"]
    assert ids(headroom.gold_support(DOCS[:1], question(["Thomas Mann"]))) == ["a"]


def test_the_reader_sees_only_the_selected_passages():
    prompts: list[str] = []

    def reader(req: GenerationRequest) -> str:
        prompts.append(req.messages[-1]["content"])
        return "Thomas Mann</answer>"

    team = headroom.SelectedRAG(headroom.SELECTIONS["oracle_first"], TeamSettings(top_k=3))
    backends = make_backends({"policy": ScriptedLLM(reader)}, TinyRetriever(PASSAGES))
    asked = [question(["Thomas Mann"])]
    run = run_episodes(team.run, "naive_rag", asked, backends, Sampling(), progress=False)
    (episode,), _ = asyncio.run(run)
    assert episode.answer == "Thomas Mann" and len(episode.retrievals[0].passages) == 3
    assert prompts[0].count("Doc ") == 1 and "Thomas Mann was a German novelist" in prompts[0]


def test_support_found_counts_what_a_run_searches_retrieved(monkeypatch, tmp_path):
    monkeypatch.setattr(headroom, "passages_by_title", lambda: {p.title: [p] for p in DOCS})
    asked = [question([], supporting_titles=["Paris", "Lübeck"]), question([])]
    asked[1].id = "no-titles"
    monkeypatch.setattr(headroom, "load_benchmark", lambda datasets, split: asked)
    rows = [
        {"id": "q", "searches": [{"ids": ["a"]}, {"ids": ["b", "c"]}]},
        {"id": "no-titles", "searches": [{"ids": ["a"]}]},
    ]
    (tmp_path / "results.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert headroom.support_found(tmp_path) == (1, 1, 1)
    rows[0]["searches"] = [{"ids": ["a", "b"]}]
    (tmp_path / "results.jsonl").write_text(json.dumps(rows[0]) + "\n")
    assert headroom.support_found(tmp_path) == (1, 0, 1)
