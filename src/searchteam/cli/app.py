"""The `searchteam` application: its Typer app, the console, one-line user errors and listings."""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from searchteam.errors import SearchTeamError

app = typer.Typer(add_completion=False, no_args_is_help=True, help="The `searchteam` command line.")
console = Console()
err_console = Console(stderr=True)


def _show_version(show: bool) -> None:
    if show:
        from importlib.metadata import version

        typer.echo(f"searchteam {version('searchteam')}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_show_version, is_eager=True, help="Print the version and exit."),
    ] = False,
) -> None:
    pass  # the options of `searchteam` itself, before any command


@contextmanager
def user_errors() -> Iterator[None]:
    """Show problems a user can fix as one clear line instead of a traceback: bad input, an unreachable
    model or retriever, a full disk or a folder that cannot be written."""
    from searchteam.files import filesystem_fault

    try:
        yield
    except (SearchTeamError, OSError) as exc:
        if isinstance(exc, OSError):
            message = filesystem_fault(exc)
            if message is None:
                raise
        else:
            message = str(exc.args[0]) if exc.args else str(exc)
        err_console.print(f"[bold red]error:[/] {escape(message)}", soft_wrap=True)
        raise typer.Exit(2) from None


def quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    # peft still reads the deprecated property when it wraps a transformers 5 model; nothing for a user to fix
    warnings.filterwarnings(
        "ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning
    )
    transformers.utils.logging.disable_progress_bar()


JSON_LISTING = typer.Option(False, "--json", help="one JSON object per entry, as a list")


def print_listing(columns: tuple[str, ...], rows: list[tuple[str, ...]], as_json: bool) -> None:
    """A listing that never cuts what a user types (the first column, a name): a table in a terminal whose
    name column does not wrap, tab-separated lines when piped, or JSON."""
    if as_json:
        print(json.dumps([dict(zip(columns, row, strict=True)) for row in rows], indent=2))
        return
    if not console.is_terminal:
        for row in rows:
            print("\t".join(row))
        return
    table = Table()
    table.add_column(columns[0], no_wrap=True, min_width=max(len(row[0]) for row in rows))
    for column in columns[1:]:
        table.add_column(column, overflow="fold")
    for row in rows:
        table.add_row(*(escape(cell) for cell in row))
    console.print(table)
