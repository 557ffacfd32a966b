"""`searchteam train`: connects a team (rollouts through the batched runtime), its reward scheme and the
team-agnostic RL trainer. The only module that knows all three."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from searchteam.config import RunConfig, load_config
from searchteam.data.benchmark import load_benchmark, load_questions
from searchteam.factory import build_sampling, build_team
from searchteam.llm import build_llm
from searchteam.llm.hf import HFBackend
from searchteam.retrieval import build_retriever
from searchteam.rewards.schemes import build_reward_scheme
from searchteam.rl import Policy, TrainConfig, Trainer, load_policy
from searchteam.runtime import make_backends, run_episodes
from searchteam.teams import Team
from searchteam.types import Episode, Question

DEFAULT_TRAIN_DATASETS = ["nq", "hotpotqa"]  # the papers train on NQ + HotpotQA


class TrainRunConfig(RunConfig):
    """A run config plus what training adds: group sampling, the reward scheme's options, the RL knobs."""

    split: str = "train"
    temperature: float = Field(1.0, ge=0.0, le=5.0)
    group_size: int = Field(4, ge=1, description="rollouts per question (G of GRPO)")
    questions_per_step: int = Field(4, ge=1)
    reward: dict[str, Any] = Field(default_factory=dict, description="options of the method's reward scheme")
    judge_model: str | None = Field(None, description="LLM judge for reward schemes that use one (DECOR)")
    train: TrainConfig = Field(default_factory=TrainConfig)


def load_train_run_config(path: Path | None, overrides: dict[str, Any]) -> TrainRunConfig:
    train_overrides = {k: overrides.pop(k) for k in ("steps",) if overrides.get(k) is not None}
    cfg = load_config(path, overrides, TrainRunConfig)
    assert isinstance(cfg, TrainRunConfig)
    if train_overrides:
        cfg.train = TrainConfig.model_validate({**cfg.train.model_dump(), **train_overrides})
    return cfg


def training_questions(cfg: TrainRunConfig) -> list[Question]:
    if cfg.questions is not None:
        return load_questions(cfg.questions)[: cfg.limit]
    return load_benchmark(cfg.datasets or DEFAULT_TRAIN_DATASETS, cfg.split, cfg.limit)


def questions_for_step(questions: list[Question], step: int, per_step: int, seed: int) -> list[Question]:
    """Epoch-wise shuffled batches that depend only on (seed, step), so a resumed run sees the same data."""
    epoch_len = max(1, len(questions) // per_step)
    epoch, index = divmod(step, epoch_len)
    order = list(range(len(questions)))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return [questions[i] for i in order[index * per_step : (index + 1) * per_step]]


def make_rollout(
    cfg: TrainRunConfig, team: Team, policy: Policy, questions: list[Question]
) -> Callable[[int], list[Episode]]:
    """Rollouts with the current weights: the hf backend shares the policy model (per-role adapters are
    switched by role before each batch). Each question runs `group_size` times with training=True."""
    backend = HFBackend(
        cfg.model,
        model=policy.model,
        tokenizer=policy.tokenizer,
        logprobs=cfg.train.old_logprobs == "rollout",  # otherwise the trainer recomputes π_old
        activate=policy.activate if cfg.train.lora_per_role else None,
    )
    extra = {
        name: build_llm(model, backend="hf", device=cfg.device) for name, model in cfg.extra_models.items()
    }
    retriever = build_retriever(cfg.retriever, corpus=cfg.corpus) if team.uses_retrieval else None
    sampling = build_sampling(cfg)

    def rollout(step: int) -> list[Episode]:
        batch = questions_for_step(questions, step, cfg.questions_per_step, cfg.seed)
        copies = [
            q.model_copy(update={"meta": {**q.meta, "replica": r}})
            for q in batch
            for r in range(cfg.group_size)
        ]
        backends = make_backends({"policy": backend, **extra}, retriever, max_batch=cfg.batch_size)
        policy.model.eval()
        episodes, _ = asyncio.run(
            run_episodes(
                team.run,
                cfg.method,
                copies,
                backends,
                sampling,
                model_name=cfg.model,
                concurrency=cfg.concurrency,
                progress=False,
                training=True,
            )
        )
        position = {(q.id, q.meta["replica"]): i for i, q in enumerate(copies)}
        episodes.sort(key=lambda e: position[(e.question.id, e.question.meta["replica"])])
        for episode in episodes:
            episode.meta["group_id"] = episode.question.id
        return episodes

    return rollout


def build_trainer(
    cfg: TrainRunConfig, out: Path, accelerator=None, on_step: Callable[[dict], None] | None = None
) -> Trainer:
    team = build_team(cfg)
    policy = load_policy(cfg.model, cfg.train, device=cfg.device, dtype=cfg.dtype)
    judge = build_llm(cfg.judge_model, device=cfg.device) if cfg.judge_model else None
    reward = build_reward_scheme(cfg.method, cfg.reward, judge=judge)
    rollout = make_rollout(cfg, team, policy, training_questions(cfg))
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return Trainer(policy, rollout, reward, cfg.train, out, accelerator=accelerator, on_step=on_step)
