"""The trainer of a `searchteam train` run: resolve and check everything the config names, then build the
policy, its rollouts, the warm start and the team-agnostic `rl.Trainer`; and the launcher of several
processes."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import yaml
from accelerate import Accelerator

from searchteam.factory import secondary_llm
from searchteam.methods import build_reward_scheme
from searchteam.metrics import answer_scores
from searchteam.rewards.base import RewardScheme
from searchteam.rl.distributed import make_accelerator
from searchteam.rl.policy import Policy, load_policy
from searchteam.rl.trainer import Trainer
from searchteam.rl.warm_start.data import WarmStart, append_sampling, read_sampling, sampling_path
from searchteam.teams import Team
from searchteam.train.config import TrainRunConfig, check_shardable, plan_training, training_questions
from searchteam.train.rollout import Rollout
from searchteam.types import Episode, Question

log = logging.getLogger(__name__)


def build_trainer(
    cfg: TrainRunConfig,
    out: Path,
    accelerator: Accelerator | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> Trainer:
    """The trainer of a run, in this process: under several processes (`torchrun`, `accelerate launch`)
    the accelerator joins the process group first, then this process loads the policy on its device and
    rolls out its share of the questions; only the main process writes the run's files."""
    plan = plan_training(cfg)
    accelerator = accelerator or make_accelerator(cfg.train, out, plan.tracking, device=cfg.device)
    shard = {"rank": accelerator.process_index, "world": accelerator.num_processes}
    check_shardable(cfg, shard["world"])
    reward = plan.reward
    # the main process fills the caches first (converted models, engine exports, indexes): transformers
    # writes no weights from a process of rank > 0
    with accelerator.main_process_first():
        policy = load_policy(
            cfg.model, cfg.train, device=accelerator.device, dtype=cfg.dtype, temperature=cfg.temperature
        )
        if plan.initial is not None:
            policy.load_initial(plan.initial)
        if cfg.judge_model:
            reward = build_reward_scheme(cfg.method, cfg.reward, judge=secondary_llm(cfg, cfg.judge_model))
        out.mkdir(parents=True, exist_ok=True)
        questions = training_questions(cfg)
        rollout = Rollout(cfg, plan.team, policy, questions, out / "rollout_adapters", **shard)
    warm = None
    if plan.warm is not None:
        warm = warm_start_stage(*plan.warm, policy, questions, out, reward, **shard)
    if accelerator.is_main_process:
        (out / "config.yaml").write_text(yaml.safe_dump(plan.tracking.config, sort_keys=False))
    return Trainer(
        policy,
        rollout,
        reward,
        cfg.train,
        out,
        accelerator=accelerator,
        on_step=on_step,
        warm_start=warm,
        tracking_setup=plan.tracking,
        seed=cfg.seed,
    )


def warm_start_stage(
    warm_cfg: TrainRunConfig,
    team: Team,
    policy: Policy,
    questions: list[Question],
    out: Path,
    reward: RewardScheme | None = None,
    rank: int = 0,
    world: int = 1,
) -> WarmStart:
    """The warm start's rollouts: `samples_per_question` samples of `questions_per_round` questions per
    round at its temperature, by the policy (through the run's engine) or by the teacher; question order
    and seeds apart from RL's. `warm_cfg` is `warm_start_run_config` of the run and `team` is built from it
    (the stage's own options); `reward`, the run's reward scheme, credits roles for `keep_by: role_reward`.
    The engine (or teacher model) is built at the first round, so a run whose warm start already finished
    never loads it."""
    ws = warm_cfg.warm_start
    assert ws is not None
    rollout: list[Rollout] = []

    def collect(round_index: int) -> list[Episode]:
        if not rollout:
            workdir = out / "rollout_adapters" / "warm_start"
            shard = {"progress": rank == 0, "rank": rank, "world": world}
            rollout.append(Rollout(warm_cfg, team, policy, questions, workdir, ws.teacher, **shard))
        # every episode is kept the moment it is sampled, so a run killed mid-round samples only the rest
        path = sampling_path(out, round_index, rank)
        done = read_sampling(path)
        if done:
            log.warning("warm-start round %d resumes: %d episodes sampled before", round_index, len(done))
        episodes = rollout[0](round_index - 1, done=done, on_episode=lambda e: append_sampling(path, e))
        if round_index == ws.rounds:
            rollout.pop().close()  # frees the stage's engine (or teacher) before RL builds its own
        return episodes

    def score(episode: Episode) -> float:
        return answer_scores(episode.answer, episode.question.golden_answers)["f1"]

    return WarmStart(ws, collect, score, reward)


def launch_processes(num_processes: int, argv: list[str]) -> int:
    """Run the command `searchteam ARGV...` in `num_processes` processes on this machine through torch's
    elastic launcher (what `accelerate launch --multi_gpu` runs too; gloo on the CPU, where
    `accelerate launch --cpu` starts one process); returns the launcher's exit code."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={num_processes}",
    ]
    return subprocess.call([*command, "-m", "searchteam.cli", *argv])
