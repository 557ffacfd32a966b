"""The reference of every run-configuration field, `docs/config.md`, generated from the pydantic models a
YAML recipe is loaded into: `RunConfig` (eval, ask, serve), `TrainRunConfig` (train) and their sections,
and each method's reward and team options. A field's description is its `Field(description=...)`, written
once in the model; this module only lays them out.

    python -m searchteam.config_reference > docs/config.md

`tests/test_config_reference.py` fails when `docs/config.md` differs from `render()`. The training models
are imported when `render` runs, not with this module, which imports no torch."""

from __future__ import annotations

import re
import sys
import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import annotated_types
import yaml
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from searchteam.config import RunConfig
from searchteam.llm.models import BUILTIN_DEFAULT_MODEL, DEFAULT_MODEL_ENV

COMMAND = "python -m searchteam.config_reference > docs/config.md"
DOC = Path("docs") / "config.md"

METHODS_HEADING = "Methods: roles"
# the placeholder of a dict-of-sections field's key in dotted names (`train.role_estimators.ROLE.gamma`)
KEY_NAMES = {"role_estimators": "ROLE"}
# fields whose keys or values another part of this page lists: the heading they link to
SEE = {
    "options": "`options`",
    "warm_start.options": "`options`",
    "reward": "`reward`",
    "max_new_tokens_per_role": METHODS_HEADING,
    "role_models": METHODS_HEADING,
    "train.roles": METHODS_HEADING,
    "train.role_lr": METHODS_HEADING,
}
# defaults that an environment variable changes: the built-in one, and the variable
ENV_DEFAULTS = {"model": (BUILTIN_DEFAULT_MODEL, DEFAULT_MODEL_ENV)}

INTROS = {
    "": "The top-level fields, read by every command that runs a team (`searchteam eval`, `ask`, `serve`, "
    "`train`): what runs (method, model, backend), what it searches, how it samples, which questions, and "
    "where results go. A command's flags set the fields of the same name (`--top-k` sets `top_k`, "
    "`--dataset` sets `datasets`; `searchteam eval --help` lists them). Where `searchteam train` has "
    "another default, the default column gives both.",
    "engine": "The in-process vLLM engine (`backend: vllm`), as `vllm.LLM` takes them. Where a run's "
    "models run: [serving.md](serving.md#engines-where-a-runs-models-run).",
    "server": "The client of an OpenAI-compatible server (`backend: openai`, `base_url`).",
    "training": "`searchteam train` reads every field above plus these. It trains on `split: train` at "
    "`temperature: 1.0` by default, refuses `temperature: 0` and `top_p` below 1, and the trainer uses "
    "the top-level `temperature` (it scores at it) and `seed`. Concepts and recipes: "
    "[training.md](training.md).",
    "train": "The trainer: advantage estimator, policy loss, critic, what is trained (one LoRA adapter, one "
    "per role, or every weight), optimizer, mini- and micro-batches, checkpoints and records. How they fit "
    "together: [training.md](training.md).",
    "train.role_estimators.ROLE": "A role's own advantage estimator and its options (DAC: searcher `gae`, "
    "generator `grpo`), under `train.role_estimators.ROLE`; an unset option takes the `train:` value.",
    "warm_start": "Rejection-sampling fine-tuning (expert iteration) before RL; off unless the section is "
    "given. How it samples, filters and fine-tunes: "
    "[training.md](training.md#warm-start-rejection-sampling-fine-tuning-before-rl).",
}
REWARD_INTRO = (
    "The options of the method's reward scheme, under `reward:` in a training config "
    "(`--set reward.NAME=VALUE`). Each method takes its own; a key the method's scheme lacks is refused."
)
OPTIONS_INTRO = (
    "The options of the method's team, under `options:` (`--set options.NAME=VALUE`), for every command "
    "that runs it; a warm start's `warm_start.options` are set over them. A key the team lacks is refused, "
    'and values are taken as given, never coerced: `"false"` is not a bool.'
)
METHODS_INTRO = (
    "The names that `max_new_tokens_per_role`, `role_models`, `train.roles`, `train.role_lr` and "
    "`train.role_estimators` take (the method's roles), and the `top_k` a method uses when the config "
    "leaves it unset."
)


@dataclass(frozen=True)
class Row:
    name: str
    type: str
    default: str
    description: str


@dataclass
class Section:
    heading: str
    intro: str
    rows: list[Row] = field(default_factory=list)
    level: int = 2
    body: str = ""  # markdown in place of the field table

    @property
    def anchor(self) -> str:
        return anchor(self.heading)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but `-` and `_` dropped, spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def link(text: str, heading: str) -> str:
    return f"[{text}](#{anchor(heading)})"


def type_name(tp: Any) -> str:
    """A type as a config writer reads it: `int | None`, `list[str]`, a Literal's choices as `a | b`."""
    origin, args = get_origin(tp), get_args(tp)
    if tp is type(None):
        return "None"
    if tp is Any:
        return "any"
    if origin is Annotated:
        return type_name(args[0])
    if origin is Literal:
        return " | ".join(str(a) for a in args)
    if origin in (Union, types.UnionType):
        parts = [type_name(a) for a in args if a is not type(None)]
        return " | ".join(parts + (["None"] if type(None) in args else []))
    if origin is not None:
        inner = ", ".join("..." if a is Ellipsis else type_name(a) for a in args)
        return f"{getattr(origin, '__name__', str(origin))}[{inner}]"
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return "section"
    if isinstance(tp, type) and issubclass(tp, Path):
        return "path"
    return tp.__name__ if isinstance(tp, type) else str(tp)


def _number(value: Any) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def bounds(info: FieldInfo) -> str:
    """The field's numeric bounds: ` in [1, 100]`, ` in (0, 1]`, ` ≥ 1`, ` > 0`, or ``."""
    low = high = None
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            low = f"[{_number(item.ge)}"
        elif isinstance(item, annotated_types.Gt):
            low = f"({_number(item.gt)}"
        elif isinstance(item, annotated_types.Le):
            high = f"{_number(item.le)}]"
        elif isinstance(item, annotated_types.Lt):
            high = f"{_number(item.lt)})"
    if low and high:
        return f" in {low}, {high}"
    if low:
        return f" {'≥' if low[0] == '[' else '>'} {low[1:]}"
    if high:
        return f" {'≤' if high[-1] == ']' else '<'} {high[:-1]}"
    return ""


def yaml_value(value: Any) -> str:
    """`value` as it is written in a YAML config, on one line (`null`, `true`, `1.0e-05`, `[a, b]`, `{}`)."""
    if isinstance(value, tuple):
        value = list(value)
    if isinstance(value, Path):
        value = str(value)
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True, sort_keys=False)
    return text.strip().removesuffix("\n...").strip()


def default_of(name: str, info: FieldInfo) -> str:
    if info.is_required():
        return "required"
    if name in ENV_DEFAULTS:
        builtin, env = ENV_DEFAULTS[name]
        return f"`{yaml_value(builtin)}` (`${env}` when set)"
    value = info.get_default(call_default_factory=True)
    if isinstance(value, BaseModel):
        return "—"  # a section: its own table gives its fields' defaults
    return f"`{yaml_value(value)}`"


def section_of(tp: Any) -> tuple[type[BaseModel], bool] | None:
    """The pydantic model a field's type holds, and whether it holds one per key (`dict[str, Model]`)."""
    origin, args = get_origin(tp), get_args(tp)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return tp, False
    if origin in (Union, types.UnionType):
        found = [s for s in (section_of(a) for a in args) if s is not None]
        return found[0] if found else None
    if origin is dict and args and isinstance(args[1], type) and issubclass(args[1], BaseModel):
        return args[1], True
    return None


def model_sections(
    model: type[BaseModel],
    prefix: str,
    heading: str,
    intro: str,
    names: Iterable[str] | None = None,
    defaults: type[BaseModel] | None = None,
) -> list[Section]:
    """The section of `model`'s fields (`names`, else all), dotted under `prefix`, then one section per
    nested model, depth first. Where `defaults` (a subclass) has another default, both are given."""
    section = Section(heading, intro)
    nested: list[Section] = []
    for name in names if names is not None else model.model_fields:
        info = model.model_fields[name]
        dotted = prefix + name
        description = info.description or ""
        found = section_of(info.annotation)
        if found is not None:
            sub, keyed = found
            key = f"{dotted}.{KEY_NAMES.get(name, 'KEY')}" if keyed else dotted
            sub_heading = f"`{key}`"
            nested += model_sections(sub, f"{key}.", sub_heading, _intro(key, sub))
            description = _join(description, f"fields: {link(f'`{key}.*`', sub_heading)}")
        if dotted in SEE:
            description = _join(description, f"see {link(SEE[dotted].strip('`'), SEE[dotted])}")
        default = default_of(dotted, info)
        other = defaults.model_fields.get(name) if defaults is not None else None
        if other is not None and default_of(dotted, other) != default:
            default += f" (train: {default_of(dotted, other)})"
        row_type = f"`{type_name(info.annotation)}`{bounds(info)}"
        section.rows.append(Row(dotted, row_type, default, description))
    return [section, *nested]


def _join(description: str, extra: str) -> str:
    description = description.rstrip().rstrip(".")
    return f"{description}; {extra}" if description else extra


def _intro(key: str, model: type[BaseModel]) -> str:
    """The section's intro line: `INTROS`, else the first paragraph of the model's docstring."""
    if key in INTROS:
        return INTROS[key]
    doc = (model.__doc__ or "").strip().split("\n\n")[0]
    return " ".join(doc.split())


def method_sections() -> list[Section]:
    """The `reward` and `options` sections, one subsection per options model (methods that share one
    share it), and the table of each method's roles."""
    from searchteam.methods import REGISTRY

    sections: list[Section] = []
    for key, intro, models in (
        (
            "reward",
            REWARD_INTRO,
            {name: m.reward.options for name, m in REGISTRY.items() if m.reward is not None},
        ),
        ("options", OPTIONS_INTRO, {name: m.team.Options for name, m in REGISTRY.items()}),
    ):
        groups: dict[type[BaseModel], list[str]] = {}
        for name, options in models.items():
            groups.setdefault(options, []).append(name)
        empty = [name for options, names in groups.items() if not options.model_fields for name in names]
        if empty:
            intro += f" Methods without {key}: {', '.join(f'`{n}`' for n in empty)}."
        sections.append(Section(f"`{key}`", intro))
        for options, names in groups.items():
            if not options.model_fields:
                continue
            heading = f"`{key}` of {', '.join(f'`{n}`' for n in names)}"
            folders = {n: REGISTRY[n].folder for n in names}
            readmes = [
                f"[{n}](../src/searchteam/methods/{folder.name}/README.md)"
                for n, folder in folders.items()
                if (folder / "README.md").is_file()
            ]
            what = "reward scheme" if key == "reward" else "team"
            about = f"What the {what} does: {', '.join(readmes)}." if readmes else ""
            sub = model_sections(options, f"{key}.", heading, about)
            sub[0].level = 3
            sections += sub
    rows = [
        "| method | roles | top_k unset |",
        "|---|---|---|",
    ]
    for name, method in REGISTRY.items():
        team = method.team
        roles = ", ".join(f"`{r}`" for r in team.roles) or "—"
        top_k = str(team.default_top_k) if team.uses_retrieval else "— (no search)"
        rows.append(f"| `{name}` | {roles} | {top_k} |")
    sections.append(Section(METHODS_HEADING, METHODS_INTRO, body="\n".join(rows)))
    return sections


def sections() -> list[Section]:
    from searchteam.train.config import TrainRunConfig  # heavier imports: only when rendering

    run_fields = list(RunConfig.model_fields)
    training_fields = [name for name in TrainRunConfig.model_fields if name not in RunConfig.model_fields]
    return [
        *model_sections(RunConfig, "", "Run", INTROS[""], run_fields, defaults=TrainRunConfig),
        *model_sections(TrainRunConfig, "", "Training run", INTROS["training"], training_fields),
        *method_sections(),
    ]


def _cell(text: str) -> str:
    """Table cell text: one line, `|` escaped (GitHub unescapes it inside code spans too)."""
    return " ".join(text.split()).replace("|", "\\|")


def render() -> str:
    """docs/config.md: every field of the run configuration, by section, with type, default and
    description."""
    parts = sections()
    count = sum(len(s.rows) for s in parts)
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from the config models by `{COMMAND}`; do not edit by hand. -->",
        "",
        f"Every field a run config takes ({count} in all), with its type, default and meaning, generated "
        "from the pydantic models a YAML recipe is loaded into. A config is a YAML file (`--config FILE`, or "
        "a shipped recipe's name), then `--set KEY=VALUE` settings, then the command's flags. A dotted name "
        "is a field of a section: `train.lr` is `lr` under `train:` in YAML and `--set train.lr=1e-5` on the "
        "command line. `None` is written `null`; an unknown field is refused with the nearest valid name. "
        "What the fields do together: [training.md](training.md), [serving.md](serving.md), "
        "[metrics.md](metrics.md).",
        "",
    ]
    lines += [f"{'  ' * (s.level - 2)}- {link(s.heading, s.heading)}" for s in parts]
    for s in parts:
        lines += ["", f"{'#' * s.level} {s.heading}"]
        lines += ["", s.intro] if s.intro else []
        lines += [""] if s.body or s.rows else []
        if s.body:
            lines.append(s.body)
        if not s.rows:
            continue
        lines += ["| field | type | default | description |", "|---|---|---|---|"]
        lines += [
            f"| `{_cell(r.name)}` | {_cell(r.type)} | {_cell(r.default)} | {_cell(r.description)} |"
            for r in s.rows
        ]
    return "\n".join(lines) + "\n"


def main() -> None:
    sys.stdout.reconfigure(encoding="utf-8")  # type: ignore[union-attr]
    sys.stdout.write(render())


if __name__ == "__main__":
    main()
