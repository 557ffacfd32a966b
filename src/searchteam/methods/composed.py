"""Teams from parts: any method's gatherers in front of any method's reader, composed in a YAML file that is
accepted wherever a method name is (`--method path/team.yaml`, or its name when it sits in a known folder).

    description: Search-R1's new passages after the question's top-5, read by naive RAG's reader
    gatherers:                    # in order; each a method that can gather (`Team.plays`)
      - method: naive_rag         # the question's own top-k, no LLM call
        top_k: 5
      - method: search_r1
        new_passages_only: true   # its searches leave out what the gatherers before it found
        max_turns: 2
        options: {action_tokens: 128}
    merge: {k: 10}                # their evidence in order, deduplicated, the first k
    reader: {method: naive_rag}   # a method that can read given passages (`Team.plays`)
    role_models: {answer: qwen2.5-coder-0.5b-naive_rag}   # each role's model; a run's role_models win

A run sets no part's top_k, max_turns or new_passages_only; its `options` are by part, `{method: {option:
value}}`, over the file's (a warm start's `{search_r1: {bridge_hint: true}}`).

A composed episode is one Episode holding every part's turns under the parts' own role names (two parts
that call the same role are refused) and every gatherer's retrievals; `episode.meta["parts"]` records what
each part found (`PartRecord`) and `episode.meta["evidence"]` the merged passage ids the reader read.

Training trains one place at a time (`reward: {train: gatherers | reader}` in the run config): each trained
part is scored by its own method's reward scheme on its own turns and retrievals, with the episode's answer
(the reader's) as the answer, so a gatherer gets the reader's outcome and its paper's per-turn credit (DAC's
r_S, M-ASK's turn ΔF1, QAgent's retrieval reward); the other parts' turns are frozen.
"""

from __future__ import annotations

import os
from functools import cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

import searchteam.methods as methods
from searchteam.errors import ConfigError
from searchteam.methods import Method, TrainingModels, build_reward_scheme, get_method, get_team
from searchteam.rewards.base import RewardOptions, RewardScheme, RewardSpec, clear, record
from searchteam.runtime.context import Context
from searchteam.teams.base import Team, TeamSettings
from searchteam.teams.transcript import dedupe
from searchteam.types import Episode, Question, Record

Place = Literal["gatherer", "reader"]
TEAM_FOLDERS_ENV = "SEARCHTEAM_TEAMS"  # extra folders of team files, separated like PATH
REPOSITORY_TEAMS = Path(__file__).resolve().parents[3] / "examples" / "teams" / "composed"


class PartSpec(TeamSettings):
    """One part: a registered method and the settings it runs with (unset: its paper's)."""

    method: str

    def settings(self, options: dict[str, Any] | None = None) -> TeamSettings:
        """Its settings, with `options` (a run's, for this part) over the file's."""
        settings = TeamSettings(**self.model_dump(exclude={"method"}))
        return settings.model_copy(update={"options": {**settings.options, **(options or {})}})


class MergeSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    k: int = Field(10, ge=1, le=100, description="passages the reader gets: the gatherers' first k distinct")


class TeamFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    description: str = ""
    gatherers: list[PartSpec] = Field(min_length=1)
    merge: MergeSpec = Field(default_factory=MergeSpec)
    reader: PartSpec
    role_models: dict[str, str] = Field(default_factory=dict)
    max_new_tokens_per_role: dict[str, int] = Field(default_factory=dict)


class PartRecord(BaseModel):
    """What one part of a composed episode did: its place, method and roles, and for a gatherer the passages
    it handed over and its retrievals (`episode.retrievals[first:last]`)."""

    place: Place
    method: str
    roles: list[str]
    passages: list[str] = Field(default_factory=list)
    retrievals: tuple[int, int] = (0, 0)


class ComposedRecord(Record):
    parts: list[PartRecord] = Field(default_factory=list)
    evidence: list[str] = Field(default_factory=list)


class ComposedTeam(Team):
    """A team built from a `TeamFile` (`team_class` makes one subclass per file)."""

    spec: TeamFile
    path: Path

    def __init__(self, settings: TeamSettings | None = None) -> None:
        given = settings or TeamSettings()
        unused = [name for name in TeamSettings.model_fields if name != "options" and getattr(given, name)]
        if unused:
            raise ConfigError(
                f"{self.name} is a composed team: set {unused[0]} per part in {self.path}, not for the run"
            )
        self.settings = given
        self.options = self.Options()
        self.prompts = {}
        check_part_options(given.options, self.spec, self.path)
        self.gatherers = [self.part(p) for p in self.spec.gatherers]
        self.reader = self.part(self.spec.reader)

    def part(self, spec: PartSpec) -> Team:
        return get_team(spec.method, spec.settings(self.settings.options.get(spec.method)))

    def privileged_options(self) -> list[str]:
        return [f"{t.name}.{name}" for t in (*self.gatherers, self.reader) for name in t.privileged_options()]

    async def run(self, q: Question, ctx: Context) -> str:
        parts, evidence = [], []
        for team in self.gatherers:
            ctx.new_passages_only = team.settings.new_passages_only
            first = len(ctx.episode.retrievals)
            found = await team.gather(q, ctx)
            last = len(ctx.episode.retrievals)
            parts.append(part_record("gatherer", team, [p.id for p in found], (first, last)))
            evidence += found
        merged = dedupe(evidence)[: self.spec.merge.k]
        parts.append(part_record("reader", self.reader))
        composed = ComposedRecord(parts=parts, evidence=[p.id for p in merged])
        composed.write(ctx.episode)
        ctx.snapshot(composed.model_dump(mode="json"))  # in the results' trace too
        ctx.step += 1
        return await self.reader.read(q, ctx, merged)

    def example_answers(self) -> frozenset[str]:
        return self.reader.example_answers()


def check_part_options(options: dict[str, Any], spec: TeamFile, path: Path) -> None:
    """A run's options of a composed team are by part, `{method: {option: value}}`, each over that part's file
    options (e.g. a warm start's `{search_r1: {bridge_hint: true}}`)."""
    parts = {p.method for p in (*spec.gatherers, spec.reader)}
    for method, given in options.items():
        if method not in parts or not isinstance(given, dict):
            raise ConfigError(
                f"options.{method}: a composed team's options are by part, {{method: {{option: value}}}}, "
                f"for its parts {', '.join(sorted(parts))} ({path})"
            )


def part_record(
    place: Place, team: Team, passages: list[str] | None = None, retrievals: tuple[int, int] = (0, 0)
) -> PartRecord:
    return PartRecord(
        place=place,
        method=team.name,
        roles=list(team.roles_as(place)),
        passages=passages or [],
        retrievals=retrievals,
    )


def read_team_file(path: Path) -> TeamFile:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return TeamFile.model_validate(data)
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"team file {path}: {err}") from None
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'file'}: {e['msg']}" for e in err.errors())
        raise ConfigError(f"team file {path}: {problems}") from None


def check_parts(spec: TeamFile, path: Path) -> tuple[str, ...]:
    """Refuse a part that cannot play its place, naming the methods that can, and two parts that call the same
    role; the composed team's roles."""
    placed = [("gatherer", part) for part in spec.gatherers] + [("reader", spec.reader)]
    roles: dict[str, str] = {}
    for place, part in placed:
        team = get_method(part.method).team
        if not team.plays(place):
            can = ", ".join(n for n, m in methods.REGISTRY.items() if m.team.plays(place))
            raise ConfigError(f"team file {path}: {part.method} cannot be a {place}; those that can: {can}")
        for role in team.roles_as(place):
            if role in roles:
                raise ConfigError(
                    f"team file {path}: {roles[role]} and {part.method} both call the role '{role}'; a "
                    "composed episode keeps roles distinct, so compose parts whose roles differ"
                )
            roles[role] = part.method
    return tuple(roles)


def team_class(path: Path) -> type[ComposedTeam]:
    """The ComposedTeam subclass of a team file, named by the file's stem."""
    spec = read_team_file(path)
    roles = check_parts(spec, path)
    name = path.stem
    description = spec.description or (
        f"composed: {' + '.join(p.method for p in spec.gatherers)} -> {spec.reader.method}"
    )
    namespace = {"name": name, "description": description, "roles": roles, "spec": spec, "path": path}
    return type(f"Composed_{path.stem}", (ComposedTeam,), namespace)


def team_folders() -> list[Path]:
    """Where `searchteam methods` looks for team files and a bare name finds one: $SEARCHTEAM_TEAMS, ./teams,
    and the repository's examples/teams/composed in a source checkout."""
    extra = [Path(p) for p in os.environ.get(TEAM_FOLDERS_ENV, "").split(os.pathsep) if p]
    return [folder for folder in (*extra, Path("teams"), REPOSITORY_TEAMS) if folder.is_dir()]


def find_team_file(name: str) -> Path | None:
    """The team file `name` names: a path to a YAML file, or the stem of one in a known folder."""
    path = Path(name)
    if path.suffix in (".yaml", ".yml"):
        return path if path.is_file() else None
    return next((f for folder in team_folders() for f in sorted(folder.glob(f"{name}.y*ml"))), None)


def known_team_files() -> list[Path]:
    return sorted({f.resolve() for folder in team_folders() for f in folder.glob("*.y*ml")})


# ---- training one place at a time -------------------------------------------------------------------------


class ComposedOptions(RewardOptions):
    train: Literal["gatherers", "reader"] = Field(
        description="the place trained: gatherers (every gatherer that calls a model) or reader"
    )
    part: dict[str, Any] = Field(
        default_factory=dict, description="options of the trained part's own method's reward scheme"
    )


def trained_parts(spec: TeamFile, train: str) -> tuple[Place, list[PartSpec], set[str]]:
    """The place `train` names, its parts that call a model, and their roles."""
    place: Place = "reader" if train == "reader" else "gatherer"
    teams = [(p, get_method(p.method).team) for p in ([spec.reader] if place == "reader" else spec.gatherers)]
    calling = [(p, team.roles_as(place)) for p, team in teams if team.roles_as(place)]
    return place, [p for p, _ in calling], {role for _, roles in calling for role in roles}


class ComposedReward:
    """Each trained part scored by its own method's scheme on a view of the episode holding its turns and its
    retrievals (a reader: every retrieval) with the episode's answer; every other turn frozen."""

    def __init__(self, options: ComposedOptions, spec: TeamFile) -> None:
        self.place, parts, _ = trained_parts(spec, options.train)
        self.schemes: dict[str, RewardScheme] = {
            p.method: build_reward_scheme(p.method, options.part) for p in parts
        }

    def __call__(self, episodes: list[Episode]) -> None:
        for episode in episodes:
            self._score(episode)

    def _score(self, episode: Episode) -> None:
        clear(episode)
        record_ = ComposedRecord.of(episode)
        trained = [p for p in record_.parts if p.place == self.place and p.method in self.schemes]
        roles = {role for part in trained for role in part.roles}
        terms: dict[str, float] = {}
        rewards = []
        for part in trained:
            view = part_view(episode, part)
            self.schemes[part.method]([view])
            rewards.append(view.reward or 0.0)
            terms |= {f"{part.method}/{k}": v for k, v in view.reward_terms.items()}
        for turn in episode.turns:
            if turn.role not in roles:
                turn.frozen = True
        record(episode, sum(rewards) / max(len(rewards), 1), terms)


def part_view(episode: Episode, part: PartRecord) -> Episode:
    """The episode as the part's own reward scheme sees it: its turns (the same objects, so the rewards the
    scheme sets land on them), its retrievals, the episode's answer and meta."""
    first, last = part.retrievals
    retrievals = episode.retrievals[first:last] if part.place == "gatherer" else episode.retrievals
    turns = [t for t in episode.turns if t.role in part.roles]
    return episode.model_copy(update={"turns": turns, "retrievals": retrievals, "reward_terms": {}})


def reward_spec(spec: TeamFile) -> RewardSpec:
    return RewardSpec(ComposedOptions, lambda options, _judge: ComposedReward(options, spec))


def training_models(spec: TeamFile, path: Path) -> TrainingModels:
    """The run's role models, all frozen; refuses a trained place whose roles all run on their own model."""

    def frozen(cfg: Any) -> dict[str, str]:
        train = (cfg.reward or {}).get("train")
        if train is not None:
            _, _, roles = trained_parts(spec, train)
            if not roles:
                raise ConfigError(f"{path}: no {train} part calls a model, so there is nothing to train")
            on_own = sorted(roles & set(cfg.role_models))
            if on_own == sorted(roles):
                raise ConfigError(
                    f"{path}: the trained {train} roles ({', '.join(on_own)}) all run on their own model "
                    f"(role_models), which training keeps frozen: leave them on {cfg.model}"
                )
        return dict(cfg.role_models)

    return frozen


@cache
def composed_method_at(path: Path) -> Method:
    """The Method of a team file (read once per path)."""
    team = team_class(path)
    spec = team.spec
    return Method(
        name=team.name,
        team=team,
        position=2_000,
        folder=path.parent,
        reward=reward_spec(spec),
        training_models=training_models(spec, path),
        run_settings=spec.model_dump(include={"role_models", "max_new_tokens_per_role"}),
    )
