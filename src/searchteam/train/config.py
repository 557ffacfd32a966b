"""What a training run is: `TrainRunConfig` (a run config plus group sampling, reward options and the
RL knobs), loaded from a file or the method's recipe and checked before any model loads."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from searchteam.config import RunConfig
from searchteam.errors import ConfigError
from searchteam.factory import (
    build_team,
    check_engines_fit,
    effective_config,
    load_run_config,
    select_questions,
)
from searchteam.llm.models import TRAINED, checkpoint_of
from searchteam.methods import build_reward_scheme, get_method, recipe_name, resolve_config_path
from searchteam.rewards.base import RewardScheme
from searchteam.rl.config import TrainConfig, WarmStartConfig
from searchteam.teams import Team
from searchteam.tracking import TrackingSetup, check_installed, trackers_for
from searchteam.types import Question

DEFAULT_TRAIN_DATASETS = ["nq", "hotpotqa"]  # the papers train on NQ + HotpotQA
WARM_START_SEED = 7919  # offsets the warm start's question order and sampling seeds from RL's


class TrainRunConfig(RunConfig):
    """A run config plus what training adds: group sampling, the reward scheme's options, the RL knobs."""

    split: str = "train"
    temperature: float = Field(
        1.0, ge=0.0, le=5.0, description="the rollouts' sampling temperature; the trainer scores the same"
    )
    group_size: int = Field(4, ge=1, description="rollouts per question (G of GRPO)")
    questions_per_step: int = Field(
        4, ge=1, description="training questions per RL step; a multiple of the number of processes"
    )
    reward: dict[str, Any] = Field(default_factory=dict, description="options of the method's reward scheme")
    recipe: str | None = Field(
        None, description="the config the run started from: a shipped recipe's name, else its path"
    )
    warm_start: WarmStartConfig | None = Field(
        None, description="rejection-sampling fine-tuning before RL (expert iteration); off when unset"
    )
    init_from: str | None = Field(
        None,
        description="start the policy from trained weights: a checkpoint folder (RUN/checkpoints/step-N, "
        "RUN/warm_start/round-NN) or a shipped adapter's name (`searchteam models`); the critic starts fresh",
    )
    train: TrainConfig = Field(
        default_factory=TrainConfig,
        description="the trainer: estimator, loss, adapters, optimizer, checkpoints",
    )

    @field_validator("temperature")
    @classmethod
    def _sampled(cls, temperature: float) -> float:
        if temperature == 0:
            raise ValueError(
                "temperature 0 (greedy) cannot train: every rollout of a question is the same, so every "
                "advantage is 0; sample at a temperature > 0 (the papers use 1.0)"
            )
        return temperature

    @field_validator("top_p")
    @classmethod
    def _untruncated(cls, top_p: float) -> float:
        """The trainer scores the whole temperature softmax; nucleus sampling would bias its gradient."""
        if top_p < 1.0:
            raise ValueError(
                f"training samples with top_p {top_p}, but the trainer scores the untruncated temperature "
                "softmax (a biased gradient): set top_p: 1"
            )
        return top_p


def default_recipe(method: str, device: str | None = None) -> Path | None:
    """The recipe `method` registers for the device at hand (its `gpu` recipe on CUDA when it has one, else
    its `cpu` recipe), or None when the method registers none."""
    from searchteam.llm.hf import pick_device  # torch: only when a recipe is looked up

    kinds = ("gpu", "cpu") if pick_device(device).startswith("cuda") else ("cpu",)
    found = [get_method(method).recipe_path(kind) for kind in kinds]
    return next((p for p in found if p is not None), None)


def load_train_run_config(
    path: Path | None, overrides: dict[str, Any], settings: dict[str, Any] | None = None
) -> TrainRunConfig:
    """A training config from `path`, else the method's paper recipe (`default_recipe`), else the generic
    defaults; then the `--set` settings, then the CLI overrides. `recipe` names what the run started from."""
    given = {**(settings or {}), **{k: v for k, v in overrides.items() if v is not None}}
    if path is None and given.get("method"):
        path = default_recipe(given["method"], given.get("device"))
    cfg = load_run_config(path, overrides, TrainRunConfig, settings)
    assert isinstance(cfg, TrainRunConfig)
    if path is not None:
        cfg.recipe = recipe_name(resolve_config_path(path)) or str(path)
    if cfg.train.steps == 0 and cfg.warm_start is None:
        raise ConfigError("steps: 0 trains nothing without a warm_start section")
    return cfg


def check_reward_placement(placement: str | None, train: TrainConfig) -> None:
    """Refuse reward placements that the estimator would miscount. GAE with γ > 0 and merged continuation
    chains sum the rewards of later turns, so an outcome repeated on every turn (`every_turn`) would be
    counted once per remaining turn (JADE: a 4-turn episode with R = 0.967 got returns 3.87 … 0.97). Group
    estimators score a trajectory by the mean reward of its turns, so `last_turn` would divide the outcome
    by the number of turns."""
    if placement == "every_turn" and train.sums_returns:
        why = "merge_continuations" if train.merge_continuations else "GAE with gamma > 0"
        raise ConfigError(
            f"reward placement 'every_turn' with {why} counts the outcome once per remaining turn: "
            "set reward.placement: last_turn"
        )
    group_only = not train.uses_critic and not train.merge_continuations
    if placement == "last_turn" and group_only:
        raise ConfigError(
            f"reward placement 'last_turn' with estimator '{train.estimator}' scores a trajectory by the "
            "mean of its turn rewards, i.e. the outcome divided by its turns: "
            "set reward.placement: every_turn"
        )


def training_models(cfg: TrainRunConfig) -> dict[str, str]:
    """The roles that run on their own, frozen model in training: the run's `role_models`, plus any its
    method adds (`register_method(training_models=)`: QAgent stage 2's frozen generator). The method's hook
    refuses a config it cannot train; a role it names cannot also be trained (`train.roles`), and some role
    must be left to the policy."""
    hook = get_method(cfg.method).training_models
    frozen = hook(cfg) if hook is not None else dict(cfg.role_models)
    trained = sorted(set(cfg.train.roles) & set(frozen))
    if trained:
        role = trained[0]
        raise ConfigError(
            f"role '{role}' runs on its own model ({frozen[role]}), which training keeps frozen: remove it "
            f"from train.roles, or from role_models to train it on {cfg.model}"
        )
    roles = get_method(cfg.method).team.roles
    if roles and set(roles) <= set(frozen):
        raise ConfigError(
            f"every role of {cfg.method} runs on its own model (role_models), so nothing is left to train: "
            f"leave at least one role on {cfg.model}"
        )
    return frozen


def training_questions(cfg: TrainRunConfig) -> list[Question]:
    """The questions a run trains on, chosen as `searchteam eval` chooses (`select_questions`); without a
    questions file or datasets, the papers' training sets."""
    if cfg.questions is None and not cfg.datasets:
        cfg = cfg.model_copy(update={"datasets": DEFAULT_TRAIN_DATASETS})
    return select_questions(cfg)


def initial_checkpoint(cfg: TrainRunConfig) -> Path | None:
    """The folder `init_from` names, checked before any model loads: it must hold a `policy/`, and a
    shipped adapter must have been trained on the run's model."""
    if cfg.init_from is None:
        return None
    trained = TRAINED.get(cfg.init_from)
    if trained is not None and trained.base != cfg.model:
        raise ConfigError(f"init_from: {trained.name} was trained on {trained.base}, not on {cfg.model}")
    folder = Path(checkpoint_of(cfg.init_from))
    if not (folder / "policy").is_dir():
        raise ConfigError(
            f"init_from: {cfg.init_from} is neither a shipped adapter nor a checkpoint folder with a policy/ "
            "(RUN/checkpoints/step-N or RUN/warm_start/round-NN)"
        )
    return folder


def warm_start_run_config(cfg: TrainRunConfig) -> TrainRunConfig:
    """The run config of the warm start's rollouts: its own seeds, sample count, questions per round,
    temperature and team options (over the run's)."""
    ws = cfg.warm_start
    assert ws is not None
    return cfg.model_copy(
        update={
            "seed": cfg.seed + WARM_START_SEED,
            "group_size": ws.samples_per_question,
            "questions_per_step": ws.questions_per_round,
            "temperature": ws.temperature,
            "options": options_over(cfg.options, ws.options),
        }
    )


def options_over(run: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """Team options `over` a run's; a composed team's options by part merge per part."""
    merged = dict(run)
    for key, value in over.items():
        both = isinstance(value, dict) and isinstance(run.get(key), dict)
        merged[key] = {**run[key], **value} if both else value
    return merged


def check_shardable(cfg: TrainRunConfig, world: int) -> None:
    """Refuse, before any model loads, question counts that `world` processes cannot share equally."""
    counts = {"questions_per_step": cfg.questions_per_step}
    if cfg.warm_start is not None:
        counts["warm_start.questions_per_round"] = cfg.warm_start.questions_per_round
    for name, count in counts.items():
        check_equal_shares(name, count, world)


def check_equal_shares(name: str, count: int, world: int) -> None:
    """Refuse a question count (`name`) that `world` processes cannot share equally."""
    if count % world:
        raise ConfigError(
            f"{name} ({count}) must be a multiple of the number of processes ({world}): each process "
            "rolls out an equal share of the questions"
        )


@dataclass(frozen=True)
class TrainingPlan:
    """A training run's config resolved once, every check done before any model loads: the team and its
    reward scheme, the warm start's run config and team, the weights to start from, and the trackers with
    the effective config they record (and `config.yaml` holds)."""

    team: Team
    reward: RewardScheme
    warm: tuple[TrainRunConfig, Team] | None
    initial: Path | None
    tracking: TrackingSetup


def refuse_warm_start_only(team: Team) -> None:
    """Refuse RL rollouts with an option that writes the policy's actions from privileged data."""
    privileged = team.privileged_options()
    if privileged:
        raise ConfigError(
            f"options.{privileged[0]} is for a warm start's sampling only: set it under warm_start.options"
        )


def plan_training(cfg: TrainRunConfig) -> TrainingPlan:
    """Resolve and check everything `cfg` names that can fail before a model loads."""
    team = build_team(cfg)
    refuse_warm_start_only(team)
    warm_cfg = warm_start_run_config(cfg) if cfg.warm_start else None
    warm = (warm_cfg, build_team(warm_cfg)) if warm_cfg else None  # validates the stage's own options
    reward = build_reward_scheme(cfg.method, cfg.reward)  # validates the options
    check_reward_placement(getattr(getattr(reward, "options", None), "placement", None), cfg.train)
    check_engines_fit(cfg, training_models(cfg), training=True)  # training_models refuses what cannot train
    initial = initial_checkpoint(cfg)
    check_installed(trackers_for(cfg.report_to))  # a named tracker that is missing
    tracking = TrackingSetup(cfg.report_to, cfg.tracker_project, effective_config(cfg, team))
    return TrainingPlan(team, reward, warm, initial, tracking)
