"""The reranking stage: the order it produces with a fake scorer, how it asks its retriever and scorer, how a
model name is classified (cross- vs bi-encoder, from its files), and the real paths: the shipped MiniLM as
a bi-encoder over BM25, and a tiny cross-encoder built here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from searchteam.config import RunConfig
from searchteam.errors import RetrievalError
from searchteam.retrieval import build_retriever
from searchteam.retrieval.dense import default_model_path
from searchteam.retrieval.rerank import (
    BiEncoderScorer,
    CrossEncoderScorer,
    RerankingRetriever,
    build_scorer,
    is_cross_encoder,
    rerank,
)
from searchteam.types import Passage
from tests.support.helpers import TinyRetriever

PASSAGES = [Passage(id=str(i), title=f"T{i}", text=f"passage {i}", score=10.0 - i) for i in range(6)]


class FakeScorer:
    """Scores each pair by a table of passage numbers; records every call."""

    name = "fake/scorer"

    def __init__(self, by_passage: dict[str, float]) -> None:
        self.by_passage = by_passage
        self.calls: list[list[tuple[str, str]]] = []

    def score(self, pairs: list[tuple[str, str]]) -> list[float]:
        self.calls.append(pairs)
        return [self.by_passage[text.split()[-1]] for _, text in pairs]


class Ranked:
    """A retriever that returns PASSAGES in order, whatever the query."""

    name = "ranked"

    def __init__(self) -> None:
        self.ks: list[int] = []

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        self.ks.append(k)
        return [PASSAGES[:k] for _ in queries]


def test_rerank_orders_by_score_keeps_ties_in_retriever_order_and_cuts_to_k():
    out = rerank(PASSAGES[:5], [0.1, 0.9, 0.5, 0.9, -1.0], k=3)
    assert [p.id for p in out] == ["1", "3", "2"]
    assert [p.score for p in out] == [0.9, 0.9, 0.5]
    assert PASSAGES[1].score == 9.0  # the retriever's passages are not modified
    with pytest.raises(RetrievalError, match="2 scores for 5 passages"):
        rerank(PASSAGES[:5], [0.1, 0.2], k=3)


def test_reranking_retriever_fetches_depth_candidates_and_scores_all_queries_in_one_call():
    base = Ranked()
    scorer = FakeScorer({"0": 0.0, "1": 1.0, "2": 5.0, "3": 3.0, "4": 4.0, "5": 2.0})
    retriever = RerankingRetriever(base, scorer, depth=4)
    hits = retriever.search(["q1", "q2"], k=2)
    assert base.ks == [4]  # the top 4 candidates, not k
    assert [[p.id for p in h] for h in hits] == [["2", "3"], ["2", "3"]]  # passage 4 and 5 were never seen
    assert len(scorer.calls) == 1 and len(scorer.calls[0]) == 8
    assert scorer.calls[0][0] == ("q1", "T0\npassage 0")  # title and text, as the retrievers index them
    assert retriever.name == "ranked+rerank:scorer"
    retriever.search(["q"], k=6)
    assert base.ks[-1] == 6  # k above the depth: k candidates


def test_reranking_wraps_any_retriever_and_handles_empty_results():
    retriever = RerankingRetriever(TinyRetriever([]), FakeScorer({}), depth=3)
    assert retriever.search(["anything", "else"], k=2) == [[], []]
    with pytest.raises(RetrievalError, match="at least 1"):
        RerankingRetriever(TinyRetriever([]), FakeScorer({}), depth=0)


def test_model_kind_is_read_from_its_files(tmp_path: Path):
    st_cross = tmp_path / "st-cross"
    st_cross.mkdir()
    (st_cross / "config_sentence_transformers.json").write_text(json.dumps({"model_type": "CrossEncoder"}))
    (st_cross / "modules.json").write_text("[]")
    old_cross = tmp_path / "old-cross"
    old_cross.mkdir()
    (old_cross / "config.json").write_text(json.dumps({"architectures": ["BertForSequenceClassification"]}))
    assert is_cross_encoder(str(st_cross)) and is_cross_encoder(str(old_cross))
    assert not is_cross_encoder(str(default_model_path()))  # the shipped MiniLM is a bi-encoder
    assert not is_cross_encoder("no-such-org/no-such-model")  # not at hand: treated as a bi-encoder
    with pytest.raises(RetrievalError, match="names no model"):
        build_scorer("cross:")


def test_the_shipped_minilm_reranks_bm25_candidates(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SEARCHTEAM_CACHE", str(tmp_path / "cache"))
    rows = [
        {"id": "paris", "title": "Paris", "text": "Paris is the capital and most populous city of France."},
        {"id": "photo", "title": "Photosynthesis", "text": "Plants turn sunlight and water into sugar."},
        {"id": "jupiter", "title": "Jupiter", "text": "Jupiter is the largest planet in the Solar System."},
        {"id": "food", "title": "Food", "text": "Food is made in kitchens; people make food from recipes."},
    ]
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(r) + "\n" for r in rows))
    query = "how do plants make food from light"
    assert build_retriever("bm25", corpus=corpus).search([query], 1)[0][0].id == "food"
    reranked = build_retriever("bm25", corpus=corpus, reranker="all-MiniLM-L6-v2", rerank_depth=4)
    assert isinstance(reranked, RerankingRetriever) and isinstance(reranked.scorer, BiEncoderScorer)
    hits = reranked.search([query, "biggest planet"], 2)
    assert [h[0].id for h in hits] == ["photo", "jupiter"]
    assert hits[0][0].score > hits[0][1].score and -1.0 <= hits[0][1].score <= 1.0 + 1e-5


def test_a_cross_encoder_scores_pairs_together(tmp_path: Path):
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=1,
    )
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    scorer = build_scorer(str(tmp_path))
    assert isinstance(scorer, CrossEncoderScorer)
    scores = scorer.score([("q", "a passage"), ("q", "another passage"), ("r", "a passage")])
    assert len(scores) == 3 and all(isinstance(s, float) for s in scores)
    assert isinstance(build_scorer(f"bi:{default_model_path()}"), BiEncoderScorer)


def test_a_run_config_passes_its_reranker_to_the_retriever(monkeypatch: pytest.MonkeyPatch):
    import searchteam.factory as factory
    import searchteam.retrieval as retrieval
    from searchteam.llm.scripted import ScriptedLLM

    seen: dict = {}
    monkeypatch.setattr(factory, "policy_llm", lambda config: ScriptedLLM([]))
    monkeypatch.setattr(retrieval, "build_retriever", lambda spec, **kw: seen.update(kw) or TinyRetriever([]))
    cfg = RunConfig(method="naive_rag", reranker="cross:BAAI/bge-reranker-base", rerank_depth=50)
    factory.build_components(cfg)
    assert (seen["reranker"], seen["rerank_depth"]) == ("cross:BAAI/bge-reranker-base", 50)
