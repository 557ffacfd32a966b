"""The embedded benchmark is v2, file by file as published, with v1 as its prefix: v1's questions are the
first lines of each split, its corpus the first 23,831 passages, and a cache built on one version is never
served for the other."""

from __future__ import annotations

import gzip
import hashlib
from pathlib import Path

import pytest

from searchteam.config import RunConfig
from searchteam.data.benchmark import (
    BENCHMARK_DIR,
    CORPUS_PATH,
    V1_CORPUS_PASSAGES,
    V1_LINES,
    available_datasets,
    benchmark_corpus,
    load_benchmark,
)
from searchteam.errors import DataError
from searchteam.factory import build_run_retriever, select_questions
from searchteam.retrieval.corpus import load_corpus

# sha256 of ../shared/benchmark-v2/SHA256SUMS, the published list; README.md is ours, the rest is theirs
PUBLISHED_SUMS_SHA256 = "5a3f08cabc72523ee05d1c111c1d297bf3ba6757b36e4dff21c7d262eba44079"
OUR_FILES = {"README.md"}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def published_sums() -> dict[str, str]:
    lines = (BENCHMARK_DIR / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    return {name: digest for digest, name in (line.split(maxsplit=1) for line in lines if line.strip())}


def test_the_checksum_list_is_the_published_one() -> None:
    assert sha256(BENCHMARK_DIR / "SHA256SUMS") == PUBLISHED_SUMS_SHA256


@pytest.mark.parametrize("name", sorted(set(published_sums()) - OUR_FILES))
def test_every_published_file_is_shipped_unchanged(name: str) -> None:
    assert sha256(BENCHMARK_DIR / name) == published_sums()[name]


def test_no_shipped_file_is_missing_from_the_published_list() -> None:
    shipped = {p.relative_to(BENCHMARK_DIR).as_posix() for p in BENCHMARK_DIR.rglob("*") if p.is_file()}
    assert shipped - set(published_sums()) == {"SHA256SUMS"}


def test_v2_sizes() -> None:
    assert len(load_corpus(CORPUS_PATH)) == 53_118
    sizes = {
        (name, split): len(load_benchmark([name], split))
        for split in ("dev", "train")
        for name in available_datasets(split)
    }
    assert sizes[("hotpotqa", "dev")] == 500 and sizes[("hotpotqa", "train")] == 1038
    assert sizes[("2wikimultihopqa", "dev")] == 500 and sizes[("2wikimultihopqa", "train")] == 427
    assert sizes[("musique", "dev")] == 120 and sizes[("musique", "train")] == 46
    assert sizes[("nq", "dev")] == 200 and sizes[("bamboogle", "dev")] == 53
    assert len(select_questions(RunConfig(datasets=["hotpotqa"], split="dev"))) == 500  # eval's choice


def test_v1_is_the_first_lines_of_each_split() -> None:
    for (name, split), n in V1_LINES.items():
        v1 = [q.id for q in load_benchmark([name], split, version="v1")] if n else []
        assert v1 == [q.id for q in load_benchmark([name], split)][:n] and len(v1) == n
    assert "musique" not in available_datasets("train", "v1")
    with pytest.raises(DataError, match="no 'train' split for dataset 'musique' in benchmark v1"):
        load_benchmark(["musique"], "train", version="v1")
    assert len(load_benchmark(["nq"], "train", version="v1")) == 423  # whole in both


def test_supporting_titles_cover_the_multi_hop_training_questions() -> None:
    for name, at_least in (("hotpotqa", 1038), ("musique", 46), ("2wikimultihopqa", 419)):
        titled = [q for q in load_benchmark([name], "train") if q.meta.get("supporting_titles")]
        assert len(titled) >= at_least


def test_lines_select_the_same_lines_of_each_dataset() -> None:
    config = RunConfig(datasets=["hotpotqa", "2wikimultihopqa"], split="dev", lines="201-300")
    chosen = select_questions(config)
    for name in ("hotpotqa", "2wikimultihopqa"):
        whole = [q.id for q in load_benchmark([name], "dev")]
        assert [q.id for q in chosen if q.dataset == name] == whole[200:300]
    limited = select_questions(config.model_copy(update={"limit": 10}))
    assert [q.id for q in limited] == [q.id for q in chosen if q.dataset == "hotpotqa"][:10] + [
        q.id for q in chosen if q.dataset == "2wikimultihopqa"
    ][:10]
    with pytest.raises(DataError, match="no question at lines 501-600: the datasets hold hotpotqa 500"):
        select_questions(RunConfig(datasets=["hotpotqa"], split="dev", lines="501-600"))
    with pytest.raises(ValueError, match="FIRST must not be after LAST"):
        RunConfig(lines="300-201")


def test_v1_corpus_is_the_first_passages_checked_against_v1(cache: Path) -> None:
    path = benchmark_corpus("v1")
    with gzip.open(CORPUS_PATH, "rt", encoding="utf-8") as v2:
        first = [next(v2) for _ in range(V1_CORPUS_PASSAGES)]
    assert path.read_text(encoding="utf-8").splitlines(keepends=True) == first
    assert benchmark_corpus("v2") == CORPUS_PATH


def test_a_v1_index_left_in_place_is_never_served_for_v2(cache: Path) -> None:
    """Build the v1 BM25 index first, as a machine that ran v1 has it, then ask for v2's: a passage only v2
    holds is found, and each version keeps its own entry."""
    v1 = build_run_retriever(RunConfig(benchmark="v1"))
    v2 = build_run_retriever(RunConfig())
    assert (v1.num_passages, v2.num_passages) == (V1_CORPUS_PASSAGES, 53_118)
    assert v1.index_path != v2.index_path and v1.index_path.exists()
    new = load_corpus(CORPUS_PATH)[-1]
    assert v2.search([f"{new.title} {new.text}"], 1)[0][0].id == new.id
    assert all(p.id != new.id for p in v1.search([f"{new.title} {new.text}"], 5)[0])
