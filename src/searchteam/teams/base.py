"""What every team shares: settings, typed options, the prompt file next to its module, the chat layout."""

from __future__ import annotations

import re
import sys
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from functools import cache
from pathlib import Path
from typing import Any, ClassVar, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from searchteam.errors import ConfigError, did_you_mean
from searchteam.metrics import normalize_answer, sufficiency
from searchteam.runtime.context import Context, Turn
from searchteam.teams.parsing import parse_answer
from searchteam.teams.transcript import dedupe
from searchteam.types import Message, Passage, Question


class TeamSettings(BaseModel):
    """Knobs every method understands; method-specific extras go in `options`. `top_k` and `max_turns` left
    at None take the team's paper defaults (`Team.default_top_k`, `Team.default_max_turns`)."""

    model_config = ConfigDict(extra="forbid")

    top_k: int | None = Field(None, ge=1, le=100, description="passages per retrieval")
    max_turns: int | None = Field(None, ge=1, le=32, description="cap on the team's search loop")
    new_passages_only: bool = Field(False, description="searches leave out passages already retrieved")
    options: dict[str, Any] = Field(default_factory=dict)


class TeamOptions(BaseModel):
    """A team's options (`settings.options`, `options:` in a run config): a team subclasses it as `Options`.
    Unknown keys are errors and values are taken as given, never coerced: the string "false" is not a
    bool and "3" is not a number."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Team(ABC):
    """A method's team. `run` is an async workflow that mirrors the paper's algorithm box; its prompts are
    `prompts.yaml` next to the module that defines it (`searchteam/methods/<name>/`)."""

    name: ClassVar[str]
    description: ClassVar[str]
    uses_retrieval: ClassVar[bool] = True
    # The paper's settings, used where the user set none; a team whose paper differs overrides them.
    default_top_k: ClassVar[int] = 5
    default_max_turns: ClassVar[int] = 4
    # What a run config may name for this team (checked by `factory.build_team`): the roles it calls a model
    # as (`max_new_tokens_per_role`, `role_models`), and the keys of `settings.options` it reads (the fields
    # of its `Options` model, validated into `self.options`).
    roles: ClassVar[tuple[str, ...]] = ()
    Options: ClassVar[type[TeamOptions]] = TeamOptions
    option_names: ClassVar[tuple[str, ...]] = ()
    # options that write the policy's actions from privileged data (e.g. Search-R1's bridge_hint): only a
    # warm start's sampling may turn them on in training (an evaluation with them is a privileged diagnostic)
    warm_start_only: ClassVar[tuple[str, ...]] = ()
    # Roles a team calls as a part of a composed team (`teams from parts`): as a gatherer, as a reader; unset,
    # its `roles`. Naive RAG gathers with no LLM call, so its gatherer roles are ().
    gatherer_roles: ClassVar[tuple[str, ...] | None] = None
    reader_roles: ClassVar[tuple[str, ...] | None] = None
    options: TeamOptions

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.option_names = tuple(cls.Options.model_fields)

    def __init__(self, settings: TeamSettings | None = None) -> None:
        given = settings or TeamSettings()
        self.settings = given.model_copy(
            update={
                "top_k": self.default_top_k if given.top_k is None else given.top_k,
                "max_turns": self.default_max_turns if given.max_turns is None else given.max_turns,
            }
        )
        self.options = parse_options(self.name, self.Options, self.settings.options)
        self.prompts = load_prompts(prompt_file(type(self)))

    @abstractmethod
    async def run(self, q: Question, ctx: Context) -> str: ...

    async def solve(self, q: Question, ctx: Context) -> str:
        """The episode's final answer: `run`'s, withdrawn when it repeats an answer or a listed entity of the
        prompts' examples (`example_answers`) that neither the question nor any retrieved passage contains.
        A small model copies its example when it has nothing to go on ("George Orwell" for "Who wrote
        Dune?"); the withdrawn answer stays in `episode.meta`, and the turn that wrote it is flagged as a
        format error."""
        ctx.new_passages_only = self.settings.new_passages_only
        answer = await self.run(q, ctx)
        texts = [q.question, *(p.contents for p in ctx.episode.passages)]
        if not unsupported_copy(answer, texts, self.example_answers()):
            return answer
        ctx.episode.meta[WITHDRAWN] = answer
        copied = normalize_answer(answer)
        turns = reversed(ctx.episode.turns)
        writer = next((t for t in turns if copied in normalize_answer(t.completion)), None)
        if writer is not None:
            writer.flag_format_error(f"repeats the prompt example's answer {answer!r}; no passage holds it")
        return ""

    async def gather(self, q: Question, ctx: Context) -> list[Passage]:
        """A gatherer's evidence for `q`: the passages its searches found, in its order. A team that can
        gather for a composed team overrides this (`plays`); the other parts' retrievals are already on
        `ctx.episode`."""
        raise NotImplementedError(f"method '{self.name}' cannot gather evidence for a composed team")

    async def read(self, q: Question, ctx: Context, passages: list[Passage]) -> str:
        """A reader's answer to `q` from the given `passages` alone, with no search of its own. A team that
        can read for a composed team overrides this (`plays`)."""
        raise NotImplementedError(f"method '{self.name}' cannot read given evidence for a composed team")

    @classmethod
    def plays(cls, place: str) -> bool:
        """Whether it can be a composed team's `gatherer` (it overrides `gather`) or `reader` (`read`)."""
        if place == "gatherer":
            return cls.gather is not Team.gather
        return cls.read is not Team.read

    def privileged_options(self) -> list[str]:
        """The `warm_start_only` options this team runs with turned on."""
        return [name for name in self.warm_start_only if getattr(self.options, name)]

    @classmethod
    def roles_as(cls, place: str) -> tuple[str, ...]:
        """The roles it calls as a composed team's `gatherer` or `reader`."""
        own = cls.gatherer_roles if place == "gatherer" else cls.reader_roles
        return cls.roles if own is None else own

    def chat(self, prompt: str = "", **fields: str) -> list[Message]:
        """System prompt, the one example exchange, then the user turn filled with `fields`."""
        p = self.prompts[prompt] if prompt else self.prompts
        messages = [{"role": "system", "content": p["system"].strip()}]
        for shot in p.get("examples", []):
            messages += [
                {"role": "user", "content": shot["user"].strip()},
                {"role": "assistant", "content": shot["assistant"].strip()},
            ]
        messages.append({"role": "user", "content": p["user"].format(**fields).strip()})
        return messages

    def example_answers(self) -> frozenset[str]:
        """The answers and `example_entities` its prompts show, normalized: a prediction equal to one was
        probably copied."""
        return prompt_answers(self.prompts)

    @staticmethod
    def answer_from(turn: Turn, tag: str = "answer", prefill: str = "") -> str:
        """Parse the answer tag (in the `prefill` the call continued, plus the completion); on a missing tag
        record the format error and use the documented fallback. A completion that repeats the prefilled
        opening tag is parsed on its own."""
        echoed = prefill and turn.completion.lstrip().startswith(prefill)
        parsed = parse_answer(turn.completion if echoed else prefill + turn.completion, tag)
        if not parsed.ok:
            turn.flag_format_error(parsed.error or "bad answer format")
        return parsed.value


GATHERER_ANSWERS = "gatherer_answers"  # episode.meta: what each gatherer that answers answered, by method


class GathersItsSearches:
    """Mixin of a team whose evidence, as a composed team's gatherer, is what its own searches returned: it
    runs its whole workflow and hands over the distinct passages found, keeping its own answer in
    `episode.meta["gatherer_answers"]`. Put it before `Team` in the bases."""

    async def gather(self, q: Question, ctx: Context) -> list[Passage]:
        first = len(ctx.episode.retrievals)
        answer = await self.run(q, ctx)  # type: ignore[attr-defined]
        ctx.episode.meta.setdefault(GATHERER_ANSWERS, {})[self.name] = answer  # type: ignore[attr-defined]
        return dedupe([p for r in ctx.episode.retrievals[first:] for p in r.passages])


def check_names(method: str, kind: str, field: str, given: Iterable[str], valid: tuple[str, ...]) -> None:
    """A one-line ConfigError for the first key of `given` that is not in `valid`, naming the valid ones."""
    unknown = next((name for name in given if name not in valid), None)
    if unknown is None:
        return
    if not valid:
        raise ConfigError(
            f"unknown {kind} '{unknown}' in {field}: method '{method}' has no {kind}s; remove it"
        )
    raise ConfigError(
        f"unknown {kind} '{unknown}' in {field}: method '{method}' has the {kind}s {', '.join(valid)}"
        + did_you_mean(unknown, valid)
    )


def parse_options(method: str, model: type[TeamOptions], given: Mapping[str, Any]) -> TeamOptions:
    """`given` validated into the team's options model; a ConfigError names the option and what it takes."""
    names = tuple(model.model_fields)
    check_names(method, "option", "options", given, names)
    try:
        return model.model_validate({name: given[name] for name in names if name in given})
    except ValidationError as exc:
        raise ConfigError("; ".join(_option_problem(method, model, e) for e in exc.errors())) from None


def _option_problem(method: str, model: type[TeamOptions], err: Any) -> str:
    """One invalid option as `METHOD option 'NAME' must be ..., not VALUE`."""
    name = ".".join(str(p) for p in err["loc"])
    if err["type"] == "value_error":  # a validator's own sentence
        return str(err["ctx"]["error"])
    if err["type"] == "literal_error":
        choices = get_args(model.model_fields[name].annotation)
        return f"{method} option '{name}' must be one of {', '.join(map(str, choices))}, not {err['input']!r}"
    if err["type"] in ("bool_type", "bool_parsing"):
        return f"{method} option '{name}' must be true or false, not {err['input']!r}"
    return f"{method} option '{name}': {err['msg'].lower()}, not {err['input']!r}"


def prompt_file(team: type[Team]) -> Path:
    """The team's prompts: `prompts.yaml` in the folder of the module that defines it, else of the nearest
    base class that has one (a variant of a method's team, defined elsewhere, reads the method's prompts)."""
    for cls in team.__mro__:
        source = getattr(sys.modules.get(cls.__module__), "__file__", None)
        if source and (path := Path(source).parent / "prompts.yaml").is_file():
            return path
    raise FileNotFoundError(f"team '{team.name}' has no prompts.yaml next to its module or a base class's")


EXAMPLE_ENTITIES = "example_entities"  # prompts.yaml: the names the examples use besides their answers
WITHDRAWN = "withdrawn_example_answer"  # episode.meta: the copied example answer `Team.solve` withdrew
# An answer tag with its content (`<answer>George Orwell</answer>`, `<predicted_answer>x</predicted_answer>`).
ANSWER_TAG = re.compile(r"<(\w*answer)>([^<]*)</\1>")


def unsupported_copy(answer: str, texts: Iterable[str], examples: frozenset[str]) -> bool:
    """Whether `answer` repeats one of the normalized `examples` (`Team.example_answers`) that none of
    `texts` (the question and the retrieved passages) holds: the copy `Team.solve` withdraws."""
    copied = normalize_answer(answer)
    return copied in examples and not sufficiency(texts, [copied])


def prompt_answers(prompts: Any) -> frozenset[str]:
    """Every answer written in a prompt tree's strings and every name its `example_entities` lists (the
    examples' other entities, such as the intermediate hop "George Orwell", which a small model copies too),
    normalized. "between <answer> and </answer>" in an instruction names the tags and is no answer."""
    if isinstance(prompts, str):
        found = (normalize_answer(m.group(2)) for m in ANSWER_TAG.finditer(prompts))
        return frozenset(a for a in found if a and a != "and")
    if isinstance(prompts, list):
        return frozenset().union(*(prompt_answers(child) for child in prompts))
    if not isinstance(prompts, dict):
        return frozenset()
    named = frozenset(normalize_answer(name) for name in prompts.get(EXAMPLE_ENTITIES, ()))
    return named.union(*(prompt_answers(v) for k, v in prompts.items() if k != EXAMPLE_ENTITIES))


@cache
def load_prompts(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def format_documents(passages: list[Passage]) -> str:
    """Numbered documents in the `Doc i (Title: ...) text` form used by Search-R1 and FlashRAG."""
    return "\n".join(f"Doc {i} (Title: {p.title}) {p.text}" for i, p in enumerate(passages, 1))
