"""`searchteam export RUN...`: runs as one Hugging Face dataset folder in Parquet.

`turns-HASH.parquet` holds one row per turn (`integrations.turns`); `sft-`, `dpo-`, `kto-` and
`stepwise-HASH.parquet` are the views of `integrations.views` (a view without rows gets no file: `datasets`
cannot read an empty Parquet file); `README.md` is the dataset card, whose configs let
`datasets.load_dataset(FOLDER, "sft")` pick a view. Several runs of the same questions go into one
dataset (their groups are the question ids), which is where DPO pairs of eval runs come from.
"""

from __future__ import annotations

import hashlib
import shutil
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from searchteam.errors import ExportError
from searchteam.integrations.card import dataset_card
from searchteam.integrations.turns import TURN_SCHEMA, load_tokenizing, passages_by_id, read_run, turn_rows
from searchteam.integrations.views import SCHEMAS, build_views

VIEWS = tuple(SCHEMAS)


@dataclass
class ExportReport:
    out: Path
    counts: dict[str, int]  # rows per file, `turns` first
    notes: list[str] = field(default_factory=list)


def export_runs(
    run_dirs: list[Path],
    out: Path,
    *,
    views: tuple[str, ...] = VIEWS,
    min_f1: float = 0.8,
    passages: bool = True,
    tokens: bool = True,
    tokenizer: str | None = None,
    corpus: Path | None = None,
) -> ExportReport:
    """Write the runs' turns and `views` under `out` (a new or empty folder). `passages=False` leaves the
    passage texts out (ids and titles stay); `tokens=False` leaves token ids out (no tokenizer needed)."""
    unknown = sorted(set(views) - set(VIEWS))
    if unknown:
        raise ExportError(f"unknown view {', '.join(unknown)}: choose from {', '.join(VIEWS)}")
    if out.exists() and any(out.iterdir()):
        raise ExportError(f"{out} is not empty: choose another --out")
    found = [
        _run_rows(d, name, passages, tokens, tokenizer, corpus)
        for d, name in zip(run_dirs, run_names(run_dirs), strict=True)
    ]
    rows = [row for run in found for row in run.rows]
    tables = {"turns": rows, **build_views(rows, list(views), min_f1)}
    counts = {name: len(table) for name, table in tables.items()}
    notes = [note for run in found for note in run.notes]
    notes += [f"view {name}: no rows, so no file" for name, n in counts.items() if not n]
    written = {name: (tables[name], SCHEMAS.get(name, TURN_SCHEMA)) for name, n in counts.items() if n}
    datasets = Counter(dataset for run in found for dataset in run.datasets)
    _write_folder(
        out, written, lambda files: dataset_card(files, [r.identity for r in found], datasets, counts, notes)
    )
    return ExportReport(out, counts, notes)


@dataclass
class _ExportedRun:
    identity: dict[str, str]  # name, method, model, adapter
    rows: list[dict[str, Any]]
    datasets: list[str]  # one per episode
    notes: list[str]


def _run_rows(
    run_dir: Path, name: str, passages: bool, tokens: bool, tokenizer: str | None, corpus: Path | None
) -> _ExportedRun:
    info, records = read_run(run_dir)
    tokenizing = load_tokenizing(info.model, tokenizer) if tokens else None
    found, passage_note = passages_by_id(info, records, corpus)
    rows = list(turn_rows(info, records, tokenizing, found, with_texts=passages, run_name=name))
    notes = ([f"{name}: {passage_note}"] if passage_note else []) + _gaps(name, rows, tokens)
    identity = {"name": name, "method": info.method, "model": info.model, "adapter": info.adapter}
    return _ExportedRun(identity, rows, [r.episode.question.dataset for r in records], notes)


def _write_folder(
    out: Path,
    tables: dict[str, tuple[list[dict[str, Any]], pa.Schema]],
    card: Callable[[dict[str, str]], str],
) -> None:
    """One Parquet file per table, named NAME-HASH.parquet after its content (`datasets` caches a folder's
    configs by their file names, so a re-export under the same folder name must not reuse them), and the
    card; written beside `out` and moved into place whole."""
    staging = out.with_name(f".{out.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    files = {}
    for name, (rows, schema) in tables.items():
        path = staging / f"{name}.parquet"
        pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()[:12]
        files[name] = path.rename(path.with_name(f"{name}-{digest}.parquet")).name
    (staging / "README.md").write_text(card(files), encoding="utf-8")
    if out.exists():
        out.rmdir()
    staging.rename(out)


def run_names(run_dirs: list[Path]) -> list[str]:
    """Each run's folder name, with as many parent folders as it takes to tell the runs apart."""
    for depth in range(1, max(len(p.resolve().parts) for p in run_dirs) + 1):
        names = ["/".join(p.resolve().parts[-depth:]) for p in run_dirs]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in run_dirs]


def _gaps(run: str, rows: list[dict[str, Any]], tokens: bool) -> list[str]:
    """What the run did not record, so some rows lack prompts or tokens."""
    notes = []
    unprompted = sum(1 for r in rows if not r["prompt"])
    if unprompted:
        notes.append(
            f"{run}: {unprompted} turns have no prompt (rollouts.jsonl keeps traces unless the run set "
            "train.save_rollout_prompts: true); they are in no view"
        )
    untokenized = sum(1 for r in rows if tokens and r["prompt"] and r["trained"] and r["prompt_ids"] is None)
    if untokenized:
        notes.append(
            f"{run}: {untokenized} continued turns recorded neither their token ids nor the text they "
            "continued (results.jsonl of older versions kept only its length), so they have no tokens"
        )
    return notes
