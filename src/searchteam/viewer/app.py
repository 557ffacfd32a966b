"""The viewer's read-only HTTP API and its one static page.

GET /                                   the page (static/index.html: plain HTML, CSS and JS, no build)
GET /api/runs                           the runs being viewed (A, and B when comparing)
GET /api/runs/{run}/questions           one page of the filtered question list of run 0 (A) or 1 (B)
GET /api/runs/{run}/episodes/{key}      one episode, turn by turn, with passage texts where known
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from typing import Annotated, Any

from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse

from searchteam.retrieval.corpus import corpus_of_run
from searchteam.viewer.passages import PassageStore
from searchteam.viewer.runs import CORRECTNESS_METRICS, Filters, Run, open_run

MAX_PAGE = 500


def create_app(run_dirs: list[Path], corpus: Path | None = None) -> FastAPI:
    """The viewer over one run, or two side by side; `corpus` overrides the corpus the runs name."""
    if not 1 <= len(run_dirs) <= 2:
        raise ValueError("the viewer shows one run or two side by side")
    runs = [open_run(Path(p)) for p in run_dirs]
    stores = _passage_stores(runs, corpus)
    page = files("searchteam.viewer").joinpath("static/index.html").read_text(encoding="utf-8")
    app = FastAPI(title="searchteam viewer", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_exception_handler(RequestValidationError, _validation_error)

    def run_at(index: int) -> Run:
        if not 0 <= index < len(runs):
            raise HTTPException(404, f"no run {index}: this viewer shows runs 0..{len(runs) - 1}")
        return runs[index]

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/runs")
    def list_runs() -> list[dict[str, Any]]:
        return [run.info() | {"passages": stores[i].status} for i, run in enumerate(runs)]

    @app.get("/api/runs/{run}/questions")
    def questions(
        run: int,
        dataset: str = "",
        outcome: Annotated[str, Query(pattern="^(|correct|incorrect)$")] = "",
        metric: str = "cover_em",
        format_errors: bool = False,
        role: str = "",
        text: str = "",
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 100,
    ) -> dict[str, Any]:
        if metric not in CORRECTNESS_METRICS:
            raise HTTPException(
                422, f"metric must be one of {', '.join(CORRECTNESS_METRICS)}, got '{metric}'"
            )
        chosen = run_at(run)
        rows = chosen.filtered(Filters(dataset, outcome, metric, format_errors, role, text))
        others = [r for i, r in enumerate(runs) if i != run]
        return {
            "total": len(rows),
            "offset": offset,
            "rows": [_with_other(row.public(), others) for row in rows[offset : offset + limit]],
        }

    @app.get("/api/runs/{run}/episodes/{key:path}")
    def episode(run: int, key: str) -> dict[str, Any]:
        chosen = run_at(run)
        row = chosen.find(key)
        if row is None:
            raise HTTPException(404, f"no question '{key}' in run {run} ({chosen.path})")
        data = chosen.episode(row)
        ids = list(
            dict.fromkeys(i for item in data["timeline"] if item["kind"] == "search" for i in item["ids"])
        )
        data["passages"], data["passages_status"] = stores[run].lookup(ids)
        return data

    return app


def _passage_stores(runs: list[Run], override: Path | None) -> list[PassageStore]:
    """One store per run, shared between runs that searched the same corpus."""
    by_corpus: dict[tuple[Path | None, str], set[str]] = {}
    located = [corpus_of_run(run.config, override) for run in runs]
    for run, where in zip(runs, located, strict=True):
        by_corpus.setdefault(where, set()).update(run.passage_ids)
    shared = {where: PassageStore(where[0], ids, where[1]) for where, ids in by_corpus.items()}
    return [shared[where] for where in located]


def _with_other(row: dict[str, Any], others: list[Run]) -> dict[str, Any]:
    """A list row with the other run's prediction and scores for the same question, when comparing."""
    for other in others:
        match = other.find(row["key"]) or other.find(row["id"])
        row["other"] = {"prediction": match.prediction, "scores": match.scores} if match else None
    return row


async def _validation_error(_: Request, exc: Exception) -> JSONResponse:
    """A bad query parameter as one readable 422 message."""
    errors = exc.errors() if isinstance(exc, RequestValidationError) else []
    parts = [f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg', '')}" for e in errors]
    return JSONResponse({"detail": "invalid request: " + "; ".join(parts)}, status_code=422)
