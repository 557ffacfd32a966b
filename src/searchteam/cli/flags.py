"""The flags shared by the commands that run a team (`RUN_FLAGS`) and by those that run it on a question
set (`QUESTION_FLAGS`), derived from the run config's fields; a command takes them with `@shared_flags(...)`
and reads them as `RunFlags`."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from searchteam.auth import API_KEY_ENV
from searchteam.config import RunConfig, parse_settings

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="YAML file (or shipped recipe name) with any config fields.")
]


SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        metavar="KEY=VALUE",
        help="Set any config field, dotted for a nested one (--set train.lr=1e-5 --set reward.stage=2); "
        "values are read as YAML. Applied after --config and before the other flags. Repeatable.",
    ),
]


ApiKeyOpt = Annotated[
    str | None,
    typer.Option(
        envvar=API_KEY_ENV,
        help="Require this key on every request but /health (Authorization: Bearer KEY).",
    ),
]


AllowOpenOpt = Annotated[
    bool,
    typer.Option("--allow-no-api-key", help="Serve beyond the loopback interface without a key."),
]


def config_flag(field: str, *decls: str, kind: Any = None, model: type[BaseModel] = RunConfig) -> Any:
    """The flag of the config field `field` of `model` (the run config, or a section of a training one),
    whose help is the field's description (written once, in the model); `kind` is the flag's type where the
    command line writes the value as text (a choice, a comma-separated list)."""
    info = model.model_fields[field]
    return Annotated[(kind or info.annotation) | None, typer.Option(*decls, help=info.description)]


def limit_flag(limits: type, name: str, minimum: float) -> Any:
    """The flag of a server's bound `name` (a field of `server_limits.RetrieverLimits` or `ServeLimits`):
    its type and help from the field, at least `minimum`; its default is the field's."""
    found = next(f for f in dataclasses.fields(limits) if f.name == name)
    kind = typing.get_type_hints(limits)[name]
    return Annotated[kind, typer.Option(min=minimum, help=found.metadata["help"])]


# a field whose flag is spelled other than `--field-name`, or whose value the command line writes as text
FLAG_SPELLING: dict[str, dict[str, Any]] = {
    "method": {"decls": ("--method", "-m")},
    "backend": {"kind": str},
    "base_url": {"kind": str},
    "datasets": {"decls": ("--dataset",), "kind": str},
    "report_to": {"decls": ("--report-to",), "kind": str},
    "skip_bad_lines": {"decls": ("--skip-bad-lines",)},
    "resume": {"decls": ("--resume/--no-resume",)},
}


def config_flags(*fields: str) -> dict[str, Any]:
    """The flags of run-config fields, by field name (`RunFlags.overrides` passes them on as they are)."""
    spelled = {name: FLAG_SPELLING.get(name, {}) for name in fields}
    return {
        name: config_flag(name, *how.get("decls", ()), kind=how.get("kind")) for name, how in spelled.items()
    }


RUN_FLAGS: dict[str, Any] = {
    "config": ConfigOpt,
    "settings": SetOpt,
    **config_flags(
        "method",
        "model",
        "backend",
        "base_url",
        "device",
        "retriever",
        "corpus",
        "embedder",
        "reranker",
        "top_k",
        "max_turns",
        "temperature",
        "max_new_tokens",
        "batch_size",
    ),
}


QUESTION_FLAGS: dict[str, Any] = config_flags(
    "benchmark",
    "datasets",
    "split",
    "questions",
    "skip_bad_lines",
    "lines",
    "limit",
    "report_to",
    "out",
    "resume",
)


@dataclass(frozen=True)
class RunFlags:
    """The shared flags one command was given (None: not given), as run-config overrides."""

    given: dict[str, Any]

    @property
    def config(self) -> Path | None:
        return self.given.get("config")

    def settings(self) -> dict[str, Any]:
        """The `--set` items as {dotted key: value}."""
        return parse_settings(self.given.get("settings") or [])

    def overrides(self) -> dict[str, Any]:
        """Config fields from the other flags."""
        return {k: v for k, v in self.given.items() if k not in ("config", "settings")}

    def load(self) -> RunConfig:
        from searchteam.factory import load_run_config

        return load_run_config(self.config, self.overrides(), settings=self.settings())


def shared_flags(*groups: dict[str, Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the flags of `groups` in place of its `flags: RunFlags` parameter; it is called with
    them collected into `flags`."""
    names = [name for group in groups for name in group]
    options = {name: option for group in groups for name, option in group.items()}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        params: list[inspect.Parameter] = []
        for param in inspect.signature(command, eval_str=True).parameters.values():
            if param.name == "flags":
                params += [
                    inspect.Parameter(n, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=options[n])
                    for n in names
                ]
            else:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            given = {name: kwargs.pop(name) for name in names}
            return command(flags=RunFlags(given), **kwargs)

        run.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
        run.__annotations__ = {p.name: p.annotation for p in params}
        return run

    return decorate


EXPORT_QUESTION_FLAGS = {"config": ConfigOpt, "settings": SetOpt} | config_flags(
    "method", "benchmark", "datasets", "split", "questions", "skip_bad_lines", "lines", "limit"
)
