"""Listings of what ships (`methods`, `recipes`, `models`) and `ship-adapter`, which adds to them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from searchteam.cli.app import JSON_LISTING, app, console, print_listing, user_errors
from searchteam.methods import METHODS

if TYPE_CHECKING:
    from searchteam.llm.models import TrainedAdapter


@app.command()
def methods(as_json: bool = JSON_LISTING) -> None:
    """List every method with a one-line description, then the composed teams in the known folders
    ($SEARCHTEAM_TEAMS, ./teams, the repository's examples/teams/composed)."""
    from searchteam.errors import ConfigError
    from searchteam.methods import get_method
    from searchteam.methods.composed import known_team_files

    rows = [(n, c.description) for n, c in METHODS.items()]
    for path in known_team_files():
        try:
            described = get_method(str(path)).purpose
        except ConfigError as err:
            described = f"cannot be used: {err}"
        rows.append((path.stem, f"composed team ({path}): {described}"))
    print_listing(("method", "description"), rows, as_json)


@app.command()
def recipes(as_json: bool = JSON_LISTING) -> None:
    """List the shipped training recipes (names for `searchteam train --config`) and what each is for."""
    from searchteam.methods import shipped_recipes

    rows = [(name, purpose) for name, (_, purpose) in shipped_recipes().items()]
    print_listing(("recipe", "purpose"), rows, as_json)


@app.command("ship-adapter")
def ship_adapter(
    checkpoint: Annotated[
        Path, typer.Argument(help="A checkpoint or warm-start round folder (RUN/checkpoints/step-N).")
    ],
    name: Annotated[str, typer.Argument(help="The name it is selected by (--model NAME).")],
    into: Annotated[
        Path | None,
        typer.Option(
            help="Folder to write it under (default: the adapters/ folder of the run's method; for a "
            "composed team, of its trained part's method)."
        ),
    ] = None,
) -> None:
    """Copy a training checkpoint's LoRA adapters (fp16) into the package as a named trained adapter, with
    its card (adapter.yaml) from the run's config: --model NAME selects it."""
    from searchteam.llm.models import ADAPTER_CARD
    from searchteam.ship import ship

    with user_errors():
        target = ship(checkpoint, name, into)
    console.print(f"[green]shipped:[/] {target}")
    if (target / ADAPTER_CARD).is_file():
        console.print(f"describe it in {target / ADAPTER_CARD} (`searchteam models` shows the description)")


def adapter_kind(trained: TrainedAdapter) -> str:
    part = f" (its part of {trained.team})" if trained.team else ""
    return f"{trained.method} adapter{part} on {trained.base}"


@app.command()
def models(as_json: bool = JSON_LISTING) -> None:
    """List the model presets and the trained adapters shipped with searchteam (names for --model)."""
    from searchteam.llm.models import PRESETS, TRAINED

    rows = [(name, "preset", preset.description) for name, preset in PRESETS.items()]
    rows += [(n, adapter_kind(t), t.description) for n, t in TRAINED.items()]
    print_listing(("model", "kind", "description"), rows, as_json)
