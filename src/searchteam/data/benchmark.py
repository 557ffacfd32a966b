"""Question loading: the shipped benchmark splits, any JSONL with `question` and `golden_answers`, or
Search-R1's parquet files (`searchteam.data.parquet`)."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from searchteam.errors import DataError
from searchteam.metrics import normalize_answer
from searchteam.types import Question

log = logging.getLogger(__name__)

BENCHMARK_DIR = Path(__file__).parent / "benchmark"
CORPUS_PATH = BENCHMARK_DIR / "corpus.jsonl.gz"
SINGLE_HOP = ("nq", "triviaqa", "popqa", "ambigqa", "webquestions")
MULTI_HOP = ("hotpotqa", "2wikimultihopqa", "musique", "bamboogle")


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


def available_datasets(split: str) -> list[str]:
    return sorted(p.parent.name for p in (BENCHMARK_DIR / "questions").glob(f"*/{split}.jsonl"))


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


def load_benchmark(datasets: list[str] | None, split: str, limit: int | None = None) -> list[Question]:
    """Questions of the shipped benchmark; `limit` applies per dataset. Split `smoke` is one mixed file."""
    if split == "smoke":
        questions = load_questions(BENCHMARK_DIR / "questions" / "smoke.jsonl")
        if datasets:
            questions = [q for q in questions if q.dataset in datasets]
        return _limit_per_dataset(questions, limit)
    names = datasets or available_datasets(split)
    questions: list[Question] = []
    for name in names:
        path = BENCHMARK_DIR / "questions" / name / f"{split}.jsonl"
        if not path.exists():
            have = ", ".join(available_datasets(split)) or "none"
            raise DataError(f"no '{split}' split for dataset '{name}' (datasets with that split: {have})")
        questions.extend(load_questions(path, default_dataset=name)[:limit])
    return questions


def _limit_per_dataset(questions: list[Question], limit: int | None) -> list[Question]:
    if limit is None:
        return questions
    counts: dict[str, int] = {}
    kept = []
    for q in questions:
        counts[q.dataset] = counts.get(q.dataset, 0) + 1
        if counts[q.dataset] <= limit:
            kept.append(q)
    return kept
