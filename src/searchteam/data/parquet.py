"""Search-R1's parquet training and test files (the verl data format) as Questions.

A row holds `data_source` (the dataset), `prompt` (chat messages whose user turn ends with the Search-R1
template's `Question: ...`), `reward_model.ground_truth.target` (the golden answers) and `extra_info`
(`split`, `index`). Files made by Search-R1's own scripts also keep FlashRAG's `id`, `question` and
`golden_answers` columns; those are used where present, since they hold the question without the template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from searchteam.errors import DataError
from searchteam.types import Question

USED_COLUMNS = {"id", "question", "golden_answers", "data_source", "prompt", "reward_model"}
QUESTION_MARKER = "Question:"


def load_parquet_questions(path: Path, default_dataset: str | None = None) -> list[Question]:
    """Questions from a Search-R1 parquet file; ids are `<data_source>-<id or extra_info.index>`."""
    rows = _read_rows(path)
    if rows:
        _check_columns(path, set(rows[0]))
    dataset = default_dataset or path.stem
    questions = [_question(row, f"{path}: row {n}", dataset, n) for n, row in enumerate(rows, 1)]
    _check_unique_ids(path, questions)
    return questions


def _read_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{path}: not a readable parquet file ({exc})") from None


def _check_columns(path: Path, columns: set[str]) -> None:
    have = ", ".join(sorted(columns))
    if not columns & {"question", "prompt"}:
        raise DataError(f"{path}: needs a 'prompt' (Search-R1) or 'question' column; it has {have}")
    if not columns & {"reward_model", "golden_answers"}:
        raise DataError(f"{path}: needs 'reward_model.ground_truth.target' or 'golden_answers'; has {have}")


def _question(row: dict[str, Any], where: str, default_dataset: str, n: int) -> Question:
    dataset = str(row.get("data_source") or default_dataset)
    extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
    raw_id = row.get("id") if row.get("id") is not None else extra.get("index", n)
    meta = {k: v for k, v in row.items() if k not in USED_COLUMNS}
    return Question(
        id=f"{dataset}-{raw_id}",
        question=_question_text(row, where),
        golden_answers=_golds(row, where),
        dataset=dataset,
        meta=meta,
    )


def _question_text(row: dict[str, Any], where: str) -> str:
    """The `question` column, else the text after the last `Question:` of the prompt's user turn."""
    if isinstance(row.get("question"), str) and row["question"].strip():
        return row["question"].strip()
    content = _user_content(row.get("prompt"), where)
    head, marker, question = content.rpartition(QUESTION_MARKER)
    if not marker or not question.strip():
        raise DataError(
            f"{where}: the prompt has no '{QUESTION_MARKER} ...' line and the file has no 'question' column; "
            "add a 'question' column with the bare question"
        )
    return question.strip()


def _user_content(prompt: Any, where: str) -> str:
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        users = [m.get("content") for m in prompt if isinstance(m, dict) and m.get("role") == "user"]
        if users and isinstance(users[-1], str):
            return users[-1]
    raise DataError(f"{where}: field 'prompt' must be a list of chat messages with a 'user' message")


def _golds(row: dict[str, Any], where: str) -> list[str]:
    """`reward_model.ground_truth.target` (what Search-R1 scores against), else `golden_answers`.

    A `ground_truth` that is itself the answer (a string or list, as other verl datasets have) works too."""
    reward_model = row.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
    if isinstance(ground_truth, dict) and ground_truth.get("target") is not None:
        golds, field = ground_truth["target"], "reward_model.ground_truth.target"
    elif isinstance(ground_truth, str | list):
        golds, field = ground_truth, "reward_model.ground_truth"
    elif row.get("golden_answers") is not None:
        golds, field = row["golden_answers"], "golden_answers"
    else:
        raise DataError(f"{where}: no golden answers (field 'reward_model.ground_truth.target' is missing)")
    if isinstance(golds, str | int | float):
        golds = [golds]
    if not isinstance(golds, list) or not all(isinstance(g, str | int | float) for g in golds):
        raise DataError(f"{where}: field '{field}' must be a list of strings")
    return [str(g) for g in golds]


def _check_unique_ids(path: Path, questions: list[Question]) -> None:
    first: dict[str, int] = {}
    for n, q in enumerate(questions, 1):
        if q.id in first:
            raise DataError(
                f"{path}: rows {first[q.id]} and {n} have the same id '{q.id}' "
                "(data_source and id, or extra_info.index, must identify a row)"
            )
        first[q.id] = n
