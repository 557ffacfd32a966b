"""The licences of the shipped benchmark's material, as its README's "Licences and attribution" table states
them, for the cards of datasets made from it (`searchteam export`). A dataset not listed has an unknown
licence; say so rather than guess."""

from __future__ import annotations

CORPUS_LICENSE = "CC BY-SA (Wikipedia text; 3.0 for the older dumps the passages come from, 4.0 today)"

DATASET_LICENSES: dict[str, str] = {
    "nq": "CC BY-SA 3.0",
    "triviaqa": "unknown (its dataset card says 'unknown')",
    "popqa": "unknown (no licence declared on its dataset card)",
    "ambigqa": "CC BY-SA 3.0",
    "webquestions": "unknown (its dataset card says 'unknown')",
    "hotpotqa": "CC BY-SA 4.0",
    "2wikimultihopqa": "Apache-2.0",
    "musique": "CC BY 4.0",
    "bamboogle": "MIT",
}


def dataset_license(name: str) -> str:
    return DATASET_LICENSES.get(name, "unknown (not a dataset of the shipped benchmark)")
