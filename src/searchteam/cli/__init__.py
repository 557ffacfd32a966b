"""The `searchteam` command line: one module per kind of command, all on one Typer `app`."""

# isort: skip_file
# `searchteam --help` lists the commands in the order these modules register them.
from searchteam.cli import run, data, serving, listing  # noqa: F401
from searchteam.cli.app import app

__all__ = ["app"]
