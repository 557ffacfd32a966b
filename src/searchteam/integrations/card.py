"""The dataset card (`README.md`) of an exported dataset: its configs for `datasets.load_dataset(FOLDER,
NAME)`, what was exported, and the licences of what it contains."""

from __future__ import annotations

from collections import Counter
from typing import Any

import yaml

from searchteam.data.licenses import CORPUS_LICENSE, dataset_license


def model_license(model: str) -> str:
    from searchteam.llm.models import PRESETS

    preset = PRESETS.get(model)
    return preset.license if preset else "unknown: see the model's own card"


def dataset_card(
    files: dict[str, str],
    runs: list[dict[str, Any]],
    datasets: Counter[str],
    counts: dict[str, int],
    notes: list[str],
) -> str:
    """`files`: config name → Parquet file; `runs`: name, method, model, adapter of each exported run;
    `datasets`: episodes per question dataset; `counts`: rows per config."""
    header = {
        "license": "other",
        "configs": [
            {
                "config_name": name,
                "data_files": [{"split": "train", "path": path}],
                **({"default": True} if name == "turns" else {}),
            }
            for name, path in files.items()
        ],
        "tags": ["searchteam", "multi-agent", "retrieval-augmented-generation"],
    }
    lines = ["---", yaml.safe_dump(header, sort_keys=False).rstrip(), "---", "", "# searchteam export", ""]
    lines += ["One row per LLM call (turn) of these searchteam runs (`turns`), and views for trainers:", ""]
    lines += [f"- `{name}`: {n} rows" + ("" if name in files else " (no file)") for name, n in counts.items()]
    lines += ["", "| run | method | model | adapter |", "|---|---|---|---|"]
    lines += [f"| {r['name']} | {r['method']} | {r['model']} | {r['adapter'] or '—'} |" for r in runs]
    lines += ["", "## Licences", ""]
    lines += [
        "The rows carry the questions and gold answers of the datasets below and passages of Wikipedia; "
        "each keeps its own licence, and share-alike material (CC BY-SA) makes derived data share-alike "
        "too. The completions are the output of the models below, under their licences.",
        "",
    ]
    lines += ["| material | rows' episodes | licence |", "|---|---|---|"]
    lines += [f"| {name} | {n} | {dataset_license(name)} |" for name, n in sorted(datasets.items())]
    lines += [f"| retrieved passages (Wikipedia) | | {CORPUS_LICENSE} |"]
    for model in sorted({r["model"] for r in runs}):
        lines += [f"| model {model} | | {model_license(model)} |"]
    if notes:
        lines += ["", "## Notes", "", *[f"- {note}" for note in notes]]
    lines += [
        "",
        'Load: `datasets.load_dataset(FOLDER, "sft")`, or '
        '`datasets.load_dataset("parquet", data_files="FOLDER/turns-*.parquet")`.',
        "",
    ]
    return "\n".join(lines)
