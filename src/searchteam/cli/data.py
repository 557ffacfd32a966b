"""Commands over data and finished runs: `export`, `export-questions`, `plot`, `index`, `view`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from searchteam.cli.app import app, console, err_console, quiet_libraries, user_errors
from searchteam.cli.flags import EXPORT_QUESTION_FLAGS, RunFlags, shared_flags


@app.command()
def export(
    runs: Annotated[list[Path], typer.Argument(help="Eval or training run folders (several: one dataset).")],
    out: Annotated[Path, typer.Option(help="A new folder for the dataset (Parquet files and README.md).")],
    views: Annotated[str, typer.Option(help="Views besides turns, comma-separated (none: no views).")] = (
        "sft,dpo,kto,stepwise"
    ),
    min_f1: Annotated[
        float,
        typer.Option(help="sft keeps, and kto labels good, the turns of episodes with F1 at least this."),
    ] = 0.8,
    passages: Annotated[
        bool, typer.Option(help="Passage texts in the rows (ids and titles are always there).")
    ] = True,
    tokens: Annotated[bool, typer.Option(help="Token ids in the rows (needs the model's tokenizer).")] = True,
    tokenizer: Annotated[
        str | None, typer.Option(help="Tokenizer to use instead of the run's model's (a preset or path).")
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(help="Corpus for passage titles and texts (default: the one the run names)."),
    ] = None,
) -> None:
    """Write runs as a Hugging Face dataset: one row per turn, and SFT, DPO, KTO and step-wise views."""
    from searchteam.integrations.export import export_runs

    chosen = tuple(v.strip() for v in views.split(",") if v.strip() and v.strip() != "none")
    with user_errors():
        quiet_libraries()
        report = export_runs(
            runs, out, views=chosen, min_f1=min_f1, passages=passages, tokens=tokens, tokenizer=tokenizer,
            corpus=corpus,
        )  # fmt: skip
    for note in report.notes:
        err_console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    counts = ", ".join(f"{name} {n}" for name, n in report.counts.items())
    console.print(f"[green]wrote[/] {report.out}: {counts} rows")


@app.command("export-questions")
@shared_flags(EXPORT_QUESTION_FLAGS)
def export_questions(
    flags: RunFlags,
    to: Annotated[str, typer.Option("--format", help="verl | skyrl")],
    out: Annotated[Path, typer.Option(help="Folder for SPLIT.parquet.")],
) -> None:
    """Write a question set as the prompt dataset verl or SkyRL trains from, naming the method to run."""
    from searchteam.factory import select_questions
    from searchteam.integrations.questions import write_questions

    with user_errors():
        config = flags.load()
        path = write_questions(select_questions(config), config.method, to, config.split, out)
    console.print(f"[green]wrote[/] {path}")


@app.command()
def plot(run_dir: Annotated[Path, typer.Argument(help="A `searchteam train` run directory.")]) -> None:
    """Write PNG training curves for a run."""
    from searchteam.train.plot import plot_run

    with user_errors():
        console.print(f"wrote {plot_run(run_dir)}")


@app.command()
def index(
    retriever: Annotated[str, typer.Option(help="bm25 | dense")] = "bm25",
    corpus: Annotated[Path | None, typer.Option(help="Corpus JSONL(.gz) with id, title, text.")] = None,
    embedder: Annotated[str | None, typer.Option(help="sentence-transformers model for dense.")] = None,
) -> None:
    """Build (or load from cache) a retrieval index."""
    from searchteam.retrieval import build_retriever

    with user_errors():
        built = build_retriever(retriever, corpus=corpus, embedder=embedder)
    console.print(f"[green]ready:[/] {built.name}")


@app.command()
def view(
    run_a: Annotated[Path, typer.Argument(help="An eval or training run directory.")],
    run_b: Annotated[Path | None, typer.Argument(help="A second run, shown side by side.")] = None,
    corpus: Annotated[
        Path | None, typer.Option(help="Corpus for passage texts (default: the one the run names).")
    ] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8765,
) -> None:
    """Browse a run's episodes turn by turn in the browser (read-only)."""
    import uvicorn

    from searchteam.viewer import create_app

    with user_errors():
        viewer = create_app([run_a, *([run_b] if run_b else [])], corpus)
    console.print(f"viewer on http://{host}:{port}/ (Ctrl-C stops it)")
    uvicorn.run(viewer, host=host, port=port, log_level="warning")
