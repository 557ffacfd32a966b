"""What every team shares: settings, the prompt file next to its module, the chat layout."""

from __future__ import annotations

import sys
from abc import ABC, abstractmethod
from functools import cache
from pathlib import Path
from typing import Any, ClassVar

import yaml
from pydantic import BaseModel, ConfigDict, Field

from searchteam.runtime.context import Context, Turn
from searchteam.teams.parsing import parse_answer
from searchteam.types import Message, Passage, Question


class TeamSettings(BaseModel):
    """Knobs every method understands; method-specific extras go in `options`. `top_k` and `max_turns` left
    at None take the team's paper defaults (`Team.default_top_k`, `Team.default_max_turns`)."""

    model_config = ConfigDict(extra="forbid")

    top_k: int | None = Field(None, ge=1, le=100, description="passages per retrieval")
    max_turns: int | None = Field(None, ge=1, le=32, description="cap on the team's search loop")
    options: dict[str, Any] = Field(default_factory=dict)


class Team(ABC):
    """A method's team. `run` is an async workflow that mirrors the paper's algorithm box; its prompts are
    `prompts.yaml` next to the module that defines it (`searchteam/methods/<name>/`)."""

    name: ClassVar[str]
    description: ClassVar[str]
    uses_retrieval: ClassVar[bool] = True
    # The paper's settings, used where the user set none; a team whose paper differs overrides them.
    default_top_k: ClassVar[int] = 5
    default_max_turns: ClassVar[int] = 4
    # What a run config may name for this team (checked by `factory.build_team`): the roles it calls the model
    # as (`max_new_tokens_per_role`), the extra models it asks for by name (`extra_models`), and the keys of
    # `settings.options` it reads.
    roles: ClassVar[tuple[str, ...]] = ()
    model_names: ClassVar[tuple[str, ...]] = ()
    option_names: ClassVar[tuple[str, ...]] = ()

    def __init__(self, settings: TeamSettings | None = None) -> None:
        given = settings or TeamSettings()
        self.settings = given.model_copy(
            update={
                "top_k": self.default_top_k if given.top_k is None else given.top_k,
                "max_turns": self.default_max_turns if given.max_turns is None else given.max_turns,
            }
        )
        self.prompts = load_prompts(prompt_file(type(self)))

    @abstractmethod
    async def run(self, q: Question, ctx: Context) -> str: ...

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


def prompt_file(team: type[Team]) -> Path:
    """The team's prompts: `prompts.yaml` in the folder of the module that defines it."""
    return Path(sys.modules[team.__module__].__file__ or "").parent / "prompts.yaml"


@cache
def load_prompts(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def format_documents(passages: list[Passage]) -> str:
    """Numbered documents in the `Doc i (Title: ...) text` form used by Search-R1 and FlashRAG."""
    return "\n".join(f"Doc {i} (Title: {p.title}) {p.text}" for i, p in enumerate(passages, 1))
