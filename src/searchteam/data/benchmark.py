"""Question loading: the shipped benchmark splits, any JSONL with `question` and `golden_answers`, or
Search-R1's parquet files (`searchteam.data.parquet`)."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
from pathlib import Path

from searchteam.cache import cache_dir, ensure_cache, file_sha256, require_files, write_manifest
from searchteam.errors import DataError
from searchteam.files import atomic_dir
from searchteam.metrics import normalize_answer
from searchteam.types import Question

log = logging.getLogger(__name__)

BENCHMARK_DIR = Path(__file__).parent / "benchmark"
CORPUS_PATH = BENCHMARK_DIR / "corpus.jsonl.gz"
SINGLE_HOP = ("nq", "triviaqa", "popqa", "ambigqa", "webquestions")
MULTI_HOP = ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")

# The shipped files are benchmark v2. v1 is their prefix: its corpus is v2's first 23,831 passages and its
# questions the first lines of each split (the same ids, questions and answers; 384 v1 2WikiMultihopQA lines
# gained `supporting_titles` in v2). Splits not listed here are whole in both versions.
BENCHMARK_VERSIONS = ("v1", "v2")
LATEST_BENCHMARK = "v2"
V1_CORPUS_PASSAGES = 23_831
V1_CORPUS_FILE = "corpus.jsonl"
V1_CORPUS_SHA256 = "1bc5fca230557e1ff8516d27507f9992d20bd2af2427637698222c2c7cef05ba"  # uncompressed
V1_LINES = {
    ("hotpotqa", "dev"): 200,
    ("hotpotqa", "train"): 200,
    ("2wikimultihopqa", "dev"): 200,
    ("2wikimultihopqa", "train"): 49,
    ("musique", "dev"): 60,
    ("musique", "train"): 0,
}


def hop_group(dataset: str) -> str:
    return "multi-hop" if dataset in MULTI_HOP else "single-hop"


def answer_form(question: str, golden_answers: list[str]) -> str:
    """The shape of a question's answer space: "two-way" for two possible answers (a gold "yes"/"no", or
    "X or Y?" naming a gold answer: the comparison questions of HotpotQA and 2WikiMultihopQA, where a
    guess scores 0.5 EM), else "open". Small readers answer the two-way ones near chance, so they are a
    slice of their own."""
    golds = {normalize_answer(g) for g in golden_answers} - {""}
    if golds & {"yes", "no"}:
        return "two-way"
    words = f" {normalize_answer(question)} "
    return "two-way" if " or " in words and any(f" {g} " in words for g in golds) else "open"


def available_datasets(split: str, version: str = LATEST_BENCHMARK) -> list[str]:
    return sorted(
        p.parent.name
        for p in (BENCHMARK_DIR / "questions").glob(f"*/{split}.jsonl")
        if _lines_in(version, p.parent.name, split) != 0
    )


def _check_version(version: str) -> None:
    if version not in BENCHMARK_VERSIONS:
        raise DataError(f"unknown benchmark version '{version}'; choose {' or '.join(BENCHMARK_VERSIONS)}")


def _lines_in(version: str, dataset: str, split: str) -> int | None:
    """How many first lines of a split file belong to `version` (None: all)."""
    _check_version(version)
    return V1_LINES.get((dataset, split)) if version == "v1" else None


def benchmark_corpus(version: str = LATEST_BENCHMARK) -> Path:
    """The corpus file of a benchmark version: the shipped one for v2; for v1, its first 23,831 passages,
    written once into the cache and checked against v1's sha256."""
    _check_version(version)
    if version == LATEST_BENCHMARK:
        return CORPUS_PATH
    folder = cache_dir("benchmark") / f"corpus-v1-{V1_CORPUS_SHA256[:16]}"

    def build() -> None:
        with atomic_dir(folder) as tmp:
            with gzip.open(CORPUS_PATH, "rb") as src, (tmp / V1_CORPUS_FILE).open("wb") as out:
                out.writelines(itertools.islice(src, V1_CORPUS_PASSAGES))
            if file_sha256(tmp / V1_CORPUS_FILE) != V1_CORPUS_SHA256:
                raise DataError("the shipped corpus does not begin with benchmark v1's; reinstall searchteam")
            write_manifest(tmp)

    ensure_cache(folder, build, "benchmark v1 corpus", require_files(V1_CORPUS_FILE))
    return folder / V1_CORPUS_FILE


def load_questions(
    path: str | Path, default_dataset: str | None = None, skip_bad_lines: bool = False
) -> list[Question]:
    """Load a QA JSONL file (every line needs `question` and `golden_answers`, a list or a string), or a
    Search-R1 `.parquet` file (`data_source`, `prompt`, `reward_model.ground_truth.target`, `extra_info`).

    A bad JSONL line (not UTF-8 or JSON, no question, bad answers, an id used before) is a DataError naming
    `file:line`; with `skip_bad_lines` it is left out, and one warning says how many were and the first."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"question file not found: {path}")
    if path.suffix == ".parquet":
        from searchteam.data.parquet import load_parquet_questions

        return load_parquet_questions(path, default_dataset)
    dataset = default_dataset or path.stem
    questions: list[Question] = []
    first_line: dict[str, int] = {}
    skipped: list[str] = []
    with path.open("rb") as fh:
        for lineno, raw in enumerate(fh, 1):
            try:
                line = _decode(raw, path, lineno)
                if not line.strip():
                    continue
                question = _parse_question(line, path, lineno, dataset)
                _check_unique(question.id, first_line, path, lineno)
            except DataError as exc:
                if not skip_bad_lines:
                    raise DataError(f"{exc}; fix or delete that line (or pass --skip-bad-lines)") from None
                skipped.append(str(exc))
                continue
            questions.append(question)
    if skipped:
        log.warning("skipped %d bad line(s) of %s; the first: %s", len(skipped), path, skipped[0])
    return questions


def _decode(raw: bytes, path: Path, lineno: int) -> str:
    """One line as text (a UTF-8 byte-order mark on the first line is dropped)."""
    try:
        return raw.decode("utf-8-sig" if lineno == 1 else "utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}:{lineno}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def _check_unique(qid: str, first_line: dict[str, int], path: Path, lineno: int) -> None:
    if qid in first_line:
        raise DataError(f"{path}:{lineno}: id '{qid}' was already used on line {first_line[qid]}")
    first_line[qid] = lineno


def _parse_question(line: str, path: Path, lineno: int, dataset: str) -> Question:
    where = f"{path}:{lineno}"
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DataError(f"{where}: not valid JSON ({exc.msg})") from None
    if not isinstance(row, dict) or not isinstance(row.get("question"), str) or not row["question"].strip():
        raise DataError(f"{where}: each line needs a non-empty string field 'question'")
    golds = row.get("golden_answers", row.get("answers", []))
    if isinstance(golds, str):
        golds = [golds]
    if not isinstance(golds, list) or not all(isinstance(g, str | int | float) for g in golds):
        raise DataError(f"{where}: 'golden_answers' must be a list of strings")
    meta = {
        k: v for k, v in row.items() if k not in {"id", "question", "golden_answers", "answers", "dataset"}
    }
    return Question(
        id=str(row.get("id", f"{dataset}-{lineno}")),
        question=row["question"].strip(),
        golden_answers=[str(g) for g in golds],
        dataset=str(row.get("dataset", dataset)),
        meta=meta,
    )


def load_benchmark(
    datasets: list[str] | None, split: str, limit: int | None = None, version: str = LATEST_BENCHMARK
) -> list[Question]:
    """Questions of the shipped benchmark (`version` v1: its first lines); `limit` applies per dataset.
    Split `smoke` is one mixed file, the same in both versions."""
    _check_version(version)
    if split == "smoke":
        questions = load_questions(BENCHMARK_DIR / "questions" / "smoke.jsonl")
        if datasets:
            questions = [q for q in questions if q.dataset in datasets]
        return per_dataset_lines(questions, None, limit)
    names = datasets or available_datasets(split, version)
    questions: list[Question] = []
    for name in names:
        path = BENCHMARK_DIR / "questions" / name / f"{split}.jsonl"
        in_version = _lines_in(version, name, split)
        if not path.exists() or in_version == 0:
            have = ", ".join(available_datasets(split, version)) or "none"
            raise DataError(
                f"no '{split}' split for dataset '{name}' in benchmark {version} "
                f"(datasets with that split: {have})"
            )
        kept = load_questions(path, default_dataset=name)[:in_version]
        questions.extend(kept[:limit])
    return questions


def per_dataset_lines(
    questions: list[Question], lines: tuple[int, int] | None, limit: int | None
) -> list[Question]:
    """Of each dataset's questions, in order, those at positions `lines` (first, last; 1-based, inclusive),
    then the first `limit` of those. A range past every dataset's end is a DataError naming the sizes."""
    first, last = lines or (1, len(questions))
    seen: dict[str, int] = {}
    taken: dict[str, int] = {}
    kept = []
    for q in questions:
        seen[q.dataset] = position = seen.get(q.dataset, 0) + 1
        if first <= position <= last and (limit is None or taken.get(q.dataset, 0) < limit):
            taken[q.dataset] = taken.get(q.dataset, 0) + 1
            kept.append(q)
    if lines and questions and not kept:
        sizes = ", ".join(f"{name} {n}" for name, n in seen.items())
        raise DataError(f"no question at lines {first}-{last}: the datasets hold {sizes}")
    return kept
