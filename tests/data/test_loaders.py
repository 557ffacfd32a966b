"""Loaders for data researchers already have: Search-R1's parquet files and a prebuilt FAISS index with its
FlashRAG corpus, each tested on small files made here in the same shape."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from searchteam.config import RunConfig
from searchteam.data.benchmark import load_questions
from searchteam.errors import DataError, RetrievalError
from searchteam.factory import select_questions
from searchteam.retrieval import build_retriever
from searchteam.retrieval import prebuilt as prebuilt_module
from searchteam.retrieval.dense import Embedder, load_embedder
from searchteam.retrieval.prebuilt import PrebuiltDenseRetriever

TEMPLATE = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. ... For example, <answer> Beijing </answer>. Question: {question}\n"
)


def search_r1_row(
    source: str, index: int, question: str, target: list[str], flashrag_id: str | None = None
) -> dict:
    """One row as Search-R1's scripts/data_process/qa_search_*_merge.py write it; with `flashrag_id`, also
    the source dataset's `id`, `question` and `golden_answers` columns, which those scripts keep."""
    row = {
        "data_source": source,
        "prompt": [{"role": "user", "content": TEMPLATE.format(question=question)}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": target}},
        "extra_info": {"split": "test", "index": index},
    }
    if flashrag_id is not None:
        row |= {"id": flashrag_id, "question": question, "golden_answers": target}
    return row


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


# --- Search-R1 parquet ----------------------------------------------------------------------------------


def test_search_r1_merged_test_file(tmp_path: Path) -> None:
    # the merged file keeps FlashRAG's own columns; ids repeat across data sources ("test_0")
    rows = [
        search_r1_row("nq", 0, "who sang can't take my eyes off you?", ["Frankie Valli"], "test_0"),
        search_r1_row("nq", 1, "largest planet?", ["Jupiter"], "test_1"),
        search_r1_row("triviaqa", 0, "capital of France?", ["Paris", "Paris, France"], "test_0"),
    ]
    rows[2]["golden_answers"] = ["stale copy"]  # the reward model's target wins
    questions = load_questions(write_parquet(tmp_path / "test.parquet", rows))
    assert [q.id for q in questions] == ["nq-test_0", "nq-test_1", "triviaqa-test_0"]
    assert [q.dataset for q in questions] == ["nq", "nq", "triviaqa"]
    assert questions[0].question == "who sang can't take my eyes off you?"
    assert questions[2].golden_answers == ["Paris", "Paris, France"]  # what Search-R1 scores against
    assert questions[0].meta == {"ability": "fact-reasoning", "extra_info": {"split": "test", "index": 0}}


def test_search_r1_parquet_with_only_the_verl_columns(tmp_path: Path) -> None:
    rows = [
        search_r1_row(
            "hotpotqa", 7, "Which novelist was born first, Thomas Mann or David Guterson?", ["Mann"]
        ),
        search_r1_row("hotpotqa", 8, "Where is the Nile?", ["Egypt"]),
    ]
    path = write_parquet(tmp_path / "train.parquet", rows)
    questions = load_questions(path)
    assert [q.id for q in questions] == ["hotpotqa-7", "hotpotqa-8"]
    assert questions[0].question == "Which novelist was born first, Thomas Mann or David Guterson?"
    assert questions[1].golden_answers == ["Egypt"]
    # wherever a questions file is accepted: `--questions train.parquet --dataset hotpotqa --limit 1`
    picked = select_questions(RunConfig(questions=path, datasets=["hotpotqa"], limit=1))
    assert [q.id for q in picked] == ["hotpotqa-7"]


def test_training_picks_questions_as_eval_does_with_the_papers_sets_by_default(tmp_path: Path) -> None:
    from searchteam.train.config import DEFAULT_TRAIN_DATASETS, TrainRunConfig, training_questions

    rows = [search_r1_row("hotpotqa", 7, "Where?", ["x"]), search_r1_row("nq", 8, "When?", ["y"])]
    path = write_parquet(tmp_path / "train.parquet", rows)
    assert [q.id for q in training_questions(TrainRunConfig(questions=path))] == ["hotpotqa-7", "nq-8"]
    only_nq = TrainRunConfig(questions=path, datasets=["nq"])
    ids = [q.id for q in training_questions(only_nq)]
    assert ids == [q.id for q in select_questions(only_nq)] == ["nq-8"]
    embedded = training_questions(TrainRunConfig(limit=40))
    assert {q.dataset for q in embedded} == set(DEFAULT_TRAIN_DATASETS)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"data_source": "nq", "prompt": [{"role": "user", "content": "Question: q?"}]}], "golden_answers"),
        ([{"data_source": "nq", "reward_model": {"ground_truth": {"target": ["a"]}}}], "'prompt'"),
        ([search_r1_row("nq", 0, "q", ["a"]) | {"prompt": [{"role": "user", "content": "no marker"}]}],
         "row 1: the prompt has no 'Question: ...'"),
        ([search_r1_row("nq", 0, "q", ["a"]) | {"prompt": [{"role": "system", "content": "Question: q"}]}],
         "row 1: field 'prompt' must be"),
        ([search_r1_row("nq", 0, "q", ["a"]), search_r1_row("nq", 0, "q2", ["b"])],
         "rows 1 and 2 have the same id 'nq-0'"),
        ([search_r1_row("nq", 0, "q", ["a"]) | {"reward_model": {"ground_truth": {"target": [{"x": 1}]}}}],
         "row 1: field 'reward_model.ground_truth.target' must be a list of strings"),
    ],
)  # fmt: skip
def test_parquet_errors_name_file_row_and_field(tmp_path: Path, rows: list[dict], message: str) -> None:
    path = write_parquet(tmp_path / "bad.parquet", rows)
    with pytest.raises(DataError, match="bad.parquet") as err:
        load_questions(path)
    assert message in str(err.value)


def test_a_file_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "x.parquet"
    path.write_text('{"question": "q"}\n')
    with pytest.raises(DataError, match="x.parquet: not a readable parquet file"):
        load_questions(path)


# --- a prebuilt FAISS index with a FlashRAG corpus ------------------------------------------------------

DIM = 8
TITLES = ["Paris", "Jupiter", "Frankie Valli", "Nile", "Photosynthesis", "Thomas Mann"]


class FakeModel:
    """Embeds "row N" as the index's vector N, anything else as a fixed random vector; records its inputs."""

    def __init__(self, vectors: np.ndarray, dim: int = DIM) -> None:
        self.vectors, self.dim, self.seen = vectors, dim, []

    def encode(self, texts: list[str], **_: object) -> np.ndarray:
        self.seen.extend(texts)
        out = []
        for text in texts:
            tail = text.rsplit("row ", 1)[-1]
            out.append(self.vectors[int(tail)] if tail.isdigit() else np.ones(self.dim) / np.sqrt(self.dim))
        return np.array(out, dtype=np.float32)[:, : self.dim]


@pytest.fixture
def vectors() -> np.ndarray:
    rng = np.random.default_rng(0)
    v = rng.normal(size=(len(TITLES), DIM)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def write_index(path: Path, vectors: np.ndarray) -> Path:
    index = faiss.IndexFlatIP(vectors.shape[1])
    index.add(vectors)
    faiss.write_index(index, str(path))
    return path


def write_flashrag_corpus(path: Path, titles: list[str] = TITLES, blank_line: bool = False) -> Path:
    lines = [
        json.dumps({"id": str(i), "contents": f'"{t}"\n{t} is passage {i}.'}) for i, t in enumerate(titles)
    ]
    if blank_line:
        lines.insert(2, "")
    data = ("\n".join(lines) + "\n").encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


@pytest.mark.parametrize("corpus_name", ["wiki.jsonl", "wiki.jsonl.gz"])
def test_prebuilt_index_rows_are_corpus_lines(tmp_path: Path, cache: Path, vectors, corpus_name) -> None:
    index = write_index(tmp_path / "e5_Flat.index", vectors)
    corpus = write_flashrag_corpus(tmp_path / corpus_name, blank_line=True)
    model = FakeModel(vectors)
    retriever = PrebuiltDenseRetriever(index, corpus, "intfloat/e5-base-v2", embedder=Embedder(model))
    hits = retriever.search(["row 3", "row 0"], k=2)
    assert [[p.id for p in row][0] for row in hits] == ["3", "0"]
    best = hits[0][0]
    assert (best.title, best.text) == ("Nile", "Nile is passage 3.") and best.score == pytest.approx(1.0)
    assert hits[0][0].score >= hits[0][1].score
    assert "query: row 3" in model.seen  # E5's query prefix, as FlashRAG and Search-R1 add it
    assert retriever.search([], 3) == [] and len(retriever.search(["row 1"], 50)[0]) == len(TITLES)


def test_prebuilt_corpus_line_offsets_are_cached(
    tmp_path: Path, cache: Path, vectors, monkeypatch: pytest.MonkeyPatch
) -> None:
    index = write_index(tmp_path / "idx", vectors)
    corpus = write_flashrag_corpus(tmp_path / "wiki.jsonl")
    scans = []
    real = prebuilt_module.line_offsets
    monkeypatch.setattr(prebuilt_module, "line_offsets", lambda path: scans.append(path) or real(path))
    for _ in range(2):
        retriever = PrebuiltDenseRetriever(index, corpus, "plain", embedder=Embedder(FakeModel(vectors)))
        assert retriever.query_prefix == "" and retriever.search(["row 5"], 1)[0][0].title == "Thomas Mann"
    assert len(scans) == 1


def test_prebuilt_index_mismatches_say_what_to_pass(tmp_path: Path, cache: Path, vectors) -> None:
    index = write_index(tmp_path / "e5_Flat.index", vectors)
    short = write_flashrag_corpus(tmp_path / "short.jsonl", TITLES[:4])
    with pytest.raises(RetrievalError, match="holds 6 vectors but .*short.jsonl has 4 passages"):
        PrebuiltDenseRetriever(index, short, "m", embedder=Embedder(FakeModel(vectors)))
    corpus = write_flashrag_corpus(tmp_path / "wiki.jsonl")
    with pytest.raises(RetrievalError, match="8-dimensional vectors but embedder 'm' makes 4-dimensional"):
        PrebuiltDenseRetriever(index, corpus, "m", embedder=Embedder(FakeModel(vectors, dim=4)))
    (tmp_path / "junk.index").write_bytes(b"not an index")
    with pytest.raises(RetrievalError, match="junk.index: not a FAISS index"):
        PrebuiltDenseRetriever(tmp_path / "junk.index", corpus, "m", embedder=Embedder(FakeModel(vectors)))


def test_build_retriever_prebuilt_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(RetrievalError, match="needs the corpus it was built from: pass --corpus"):
        build_retriever("dense:e5_Flat.index")
    with pytest.raises(RetrievalError, match="needs a FAISS index file after the colon"):
        build_retriever("dense:", corpus=tmp_path / "c.jsonl")
    with pytest.raises(RetrievalError, match="FAISS index file not found"):
        build_retriever(f"dense:{tmp_path / 'missing.index'}", corpus=tmp_path / "c.jsonl")


@pytest.mark.model
def test_prebuilt_index_with_the_shipped_minilm(tmp_path: Path, cache: Path) -> None:
    """End to end: an index built outside searchteam with the shipped MiniLM, loaded by spec."""
    rows = [
        ("Paris", "Paris is the capital and most populous city of France."),
        ("Jupiter", "Jupiter is the largest planet in the Solar System."),
        ("Nile", "The Nile is a major river flowing north through Egypt."),
    ]
    corpus = tmp_path / "wiki.jsonl"
    corpus.write_text("".join(json.dumps({"id": t, "contents": f'"{t}"\n{x}'}) + "\n" for t, x in rows))
    model = load_embedder(None, None).model
    vectors = model.encode([f"{t}\n{x}" for t, x in rows], normalize_embeddings=True)
    index = write_index(tmp_path / "minilm_Flat.index", np.asarray(vectors, dtype=np.float32))
    retriever = build_retriever(f"dense:{index}", corpus=corpus)
    hits = retriever.search(["biggest planet", "river in Egypt"], k=1)
    assert [row[0].id for row in hits] == ["Jupiter", "Nile"]
