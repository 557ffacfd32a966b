"""The methods, one package per paper: `methods/<name>/` holds its team (`team.py`), prompts
(`prompts.yaml`), reward scheme (`reward.py`, where the paper has one), shipped training recipes
(`recipes/*.yaml`), trained adapters (`adapters/NAME/`, each with its `adapter.yaml` card) and its own tests
(`tests/`); its `__init__.py` calls `register_method` once.

This module is the one registry: it imports every package in this folder, so adding a method means adding
one folder. What generic code needs of a method (the team, the reward scheme and its options, its shipped
recipes and the one `searchteam train --method NAME` starts from, the role models training adds) comes
from here, never from a list kept elsewhere.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from searchteam.errors import ConfigError, UnknownMethodError, did_you_mean
from searchteam.llm.base import LLM
from searchteam.llm.models import ADAPTER_CARD, register_adapter
from searchteam.rewards.base import RewardScheme, RewardSpec
from searchteam.teams.base import Team, TeamSettings

logger = logging.getLogger(__name__)

TrainingModels = Callable[[Any], dict[str, str]]  # a training run config → its frozen role models, by role


@dataclass(frozen=True)
class Method:
    """One registered method. `position` orders listings (the baselines first, then by paper; a method
    that gives none comes after them, by name);
    `recipes` names the recipe a run without `--config` starts from, per device kind (`cpu`, `gpu`);
    `training_models` adds the frozen role models a training run needs (QAgent stage 2's frozen generator)."""

    name: str
    team: type[Team]
    position: int
    folder: Path
    reward: RewardSpec | None = None
    recipes: Mapping[str, str] = field(default_factory=dict)
    training_models: TrainingModels | None = None
    run_settings: Mapping[str, Any] = field(default_factory=dict)  # a composed team's: its roles' models

    @property
    def purpose(self) -> str:
        """The one-line description of `searchteam methods`."""
        return self.team.description

    def recipe_path(self, kind: str) -> Path | None:
        """The shipped recipe for a device kind (`cpu`, `gpu`), or None when the method ships none."""
        stem = self.recipes.get(kind)
        return self.folder / "recipes" / f"{stem}.yaml" if stem else None


_REGISTRY: dict[str, Method] = {}
LAST = 1_000  # the position of a method that gives none: after the shipped ones


def register_method(
    team: type[Team],
    *,
    position: int = LAST,
    reward: RewardSpec | None = None,
    recipes: Mapping[str, str] | None = None,
    training_models: TrainingModels | None = None,
) -> Method:
    """Register `team` (its `name` and `description`) as a method; called once by the
    method package's `__init__.py`. A recipe it names must ship in the package's `recipes/` folder."""
    folder = Path(importlib.import_module(team.__module__).__file__ or "").parent
    method = Method(
        name=team.name,
        team=team,
        position=position,
        folder=folder,
        reward=reward,
        recipes=dict(recipes or {}),
        training_models=training_models,
    )
    if team.name in _REGISTRY:
        raise ValueError(f"method '{team.name}' is registered twice")
    for kind in method.recipes:
        path = method.recipe_path(kind)
        if path is None or not path.is_file():
            raise ValueError(f"method '{team.name}' names the {kind} recipe {path}, which does not exist")
    _REGISTRY[team.name] = method
    for card in sorted(folder.glob(f"adapters/*/{ADAPTER_CARD}")):  # the trained adapters it ships
        register_adapter(card.parent, team.name)
    return method


def _load_packages() -> dict[str, Method]:
    for info in pkgutil.iter_modules(__path__):
        if info.ispkg:
            importlib.import_module(f"{__name__}.{info.name}")
    return dict(sorted(_REGISTRY.items(), key=lambda kv: (kv[1].position, kv[0])))


REGISTRY: dict[str, Method] = _load_packages()
METHODS: dict[str, type[Team]] = {name: method.team for name, method in REGISTRY.items()}


def get_method(name: str) -> Method:
    """A registered method, or a composed team: a team file's path, or its stem in a known folder
    (`methods.composed`)."""
    if name in REGISTRY:
        return REGISTRY[name]
    from searchteam.methods.composed import composed_method_at, find_team_file

    path = find_team_file(name)
    if path is not None:
        return composed_method_at(path.resolve())
    raise UnknownMethodError(
        f"unknown method '{name}'; choose one of: {', '.join(REGISTRY)}, or a composed team's YAML file"
        + did_you_mean(name, REGISTRY)
    )


def get_team(name: str, settings: TeamSettings | None = None) -> Team:
    return get_method(name).team(settings)


def reward_methods() -> list[str]:
    """The methods with a reward scheme (the ones `searchteam train` can train)."""
    return sorted(name for name, method in REGISTRY.items() if method.reward is not None)


def build_reward_scheme(
    method: str, options: dict[str, Any] | None = None, judge: LLM | None = None
) -> RewardScheme:
    """The reward scheme of `method`, with validated `options`; `judge` serves LLM-judged schemes (DECOR)."""
    try:
        spec = get_method(method).reward
    except UnknownMethodError:
        spec = None
    if spec is None:
        raise ValueError(
            f"no reward scheme for method '{method}'; known methods: {', '.join(reward_methods())}"
        )
    try:
        parsed = spec.options.model_validate(options or {})
    except ValidationError as err:
        allowed = ", ".join(spec.options.model_fields) or "none"
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'options'}: {e['msg']} (got {e.get('input')!r})"
            for e in err.errors()
        )
        raise ValueError(
            f"bad reward options for '{method}': {problems}. Allowed options: {allowed}"
        ) from None
    if judge is not None and not spec.uses_judge:
        logger.warning("reward scheme '%s' uses no judge; the judge '%s' is ignored", method, judge.name)
    return spec.build(parsed, judge)


__all__ = [
    "METHODS",
    "REGISTRY",
    "Method",
    "RewardSpec",
    "build_reward_scheme",
    "get_method",
    "get_team",
    "register_method",
    "reward_methods",
]


def shipped_recipes() -> dict[str, tuple[Path, str]]:
    """Every training recipe shipped with searchteam: its name `METHOD/MODEL-DEVICE[-VARIANT]` (what
    `--config` takes) → (its file, its purpose: the first comment line of its YAML header, or "")."""
    named = {
        f"{name}/{path.stem}": path
        for name, method in REGISTRY.items()
        for path in method.folder.glob("recipes/*.yaml")
    }
    return {name: (path, _header_line(path)) for name, path in sorted(named.items())}


def resolve_config_path(path: Path) -> Path:
    """A YAML file, or the name of a recipe shipped with searchteam (`METHOD/MODEL-DEVICE[-VARIANT]`, e.g.
    `mask/qwen0.5b-cpu`; see `shipped_recipes`)."""
    if path.exists():
        return path
    recipes = shipped_recipes()
    name = str(path).removesuffix(".yaml")
    if name in recipes:
        return recipes[name][0]
    raise ConfigError(
        f"config file not found: {path}{did_you_mean(name, recipes)} (shipped recipes: {', '.join(recipes)})"
    )


def recipe_name(path: Path) -> str | None:
    """The shipped recipe name of a config file, or None for a file of the user's."""
    resolved = path.resolve()
    return next((name for name, (p, _) in shipped_recipes().items() if p.resolve() == resolved), None)


def _header_line(path: Path) -> str:
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            return line.strip().removeprefix("#").strip() if line.lstrip().startswith("#") else ""
    return ""
