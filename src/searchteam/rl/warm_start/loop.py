"""The warm start's loop: rejection-sampling fine-tuning (expert iteration) before RL. Each round collects
episodes, keeps the correct ones whose turns parsed (`warm_start.keep`) and fine-tunes the policy by
likelihood on every policy turn kept so far, with an AdamW of its own (RL then starts from fresh optimizer
state). All processes gather every process's episodes and train on the same data, each on its share of
the micro-batches. A finished round is saved to `warm_start/round-NN` (policy and adapters), so a killed
stage resumes at the next round, from the round's saved samples when its sampling had finished.

What to keep, the samples and the stage's files are the package's (`searchteam.rl.warm_start`)."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
from accelerate.utils import gather_object

import searchteam.rl.warm_start.data as ws
from searchteam.files import atomic_dir
from searchteam.progress import progress_bar
from searchteam.rl.config import WARM_START, TrainConfig
from searchteam.rl.distributed import mean_over_ranks
from searchteam.rl.run_log import RunLog, truncate_jsonl
from searchteam.rl.update import Optimizer, PolicyUpdater
from searchteam.types import Episode


class WarmStartLoop:
    """The warm start `stage` of the run in `run_dir` (`config`: the RL run's options, for its roles,
    betas and seed), training through `updater` and recording through `log`."""

    def __init__(
        self, stage: ws.WarmStart, updater: PolicyUpdater, log: RunLog, config: TrainConfig, run_dir: Path
    ) -> None:
        self.stage = stage
        self.updater = updater
        self.log = log
        self.config = config
        self.run_dir = run_dir
        self.accelerator = updater.accelerator

    def run(self) -> list[dict[str, Any]]:
        """The rounds after the last finished one; returns their log records, which also go to
        `warm_start/log.jsonl`."""
        cfg, roles = self.stage.config, self.config.roles or None
        done = self._restore()
        dataset = ws.read_kept(self.run_dir)
        policy = self.updater.policy
        groups = [g for g in policy.param_groups(cfg.lr) if g["name"] != "value"]
        optimizer = self.accelerator.prepare(torch.optim.AdamW(groups, lr=cfg.lr, betas=self.config.betas))
        records = []
        for round_index in range(done + 1, cfg.rounds + 1):
            start = time.perf_counter()
            episodes, scores = self._collection(round_index)
            new = self._keep(episodes, scores)
            kept = [e is not None for e in new]
            new = [e for e in new if e is not None]
            collected = time.perf_counter()
            record = {"round": round_index, **ws.round_stats(episodes, scores, kept, roles)}
            record |= ws.kept_turn_counts(new, roles)
            dataset += new
            record |= self._fine_tune(dataset, optimizer, round_index)
            record |= {"time/rollout": collected - start, "time/update": time.perf_counter() - collected}
            self._finish_round(round_index, new, record)
            records.append(record)
        return records

    def _keep(self, episodes: list[Episode], scores: list[float]) -> list[Episode | None]:
        """Per episode, what the round keeps of it (`keep_by`): the whole episode when its answer is
        right enough, or the turns of the roles its method's reward credits; None when nothing."""
        cfg, roles = self.stage.config, self.config.roles or None
        if cfg.keep_by == "answer":
            return [e if ws.keep(e, s, cfg, roles) else None for e, s in zip(episodes, scores, strict=True)]
        assert self.stage.reward is not None, "keep_by role_reward needs the method's reward scheme"
        self.stage.reward(episodes)
        return [ws.keep_by_role(e, cfg, roles) for e in episodes]

    def _restore(self) -> int:
        """Load the policy of the last finished round and cut what an unfinished round wrote (torn lines
        too); returns how many rounds finished."""
        done = ws.finished_rounds(self.run_dir)
        if done:
            policy = self.accelerator.unwrap_model(self.updater.model)  # the critic is not the stage's to set
            policy.load(ws.round_dir(self.run_dir, done) / "policy", policy_only=True)
        if self.accelerator.is_main_process:
            for name in (ws.KEPT, ws.LOG):
                truncate_jsonl(ws.warm_dir(self.run_dir) / name, "round", done)
        self.accelerator.wait_for_everyone()
        return done

    def _collection(self, round_index: int) -> tuple[list[Episode], list[float]]:
        """The round's episodes from every process and their scores: sampled and saved, or read back when
        an earlier run of this round finished sampling (`warm_start.save_collected`)."""
        saved = ws.read_collected(self.run_dir, round_index)
        if saved is not None:
            return saved
        episodes = gather_object(self.stage.collect(round_index))
        scores = [self.stage.score(e) for e in episodes]
        if self.accelerator.is_main_process:
            ws.save_collected(self.run_dir, round_index, episodes, scores)
            ws.clear_sampling(self.run_dir, round_index)
        self.accelerator.wait_for_everyone()
        return episodes, scores

    def _fine_tune(self, episodes: list[Episode], optimizer: Optimizer, round_index: int) -> dict[str, float]:
        """`epochs` shuffled passes of likelihood training over every parsed policy turn of `episodes` (the
        same on every process; each process trains its share of each mini-batch)."""
        cfg = self.stage.config
        policy, updater = self.updater.policy, self.updater
        samples = ws.likelihood_samples(episodes, policy.tokenizer, self.config.roles or None)
        stats: dict[str, list[float]] = defaultdict(list)
        skipped = updates = 0
        policy.train()
        with progress_bar(self.accelerator.is_main_process, "{task.description}: fine-tune") as bar:
            task = bar.add_task(f"warm-start round {round_index}", total=None)
            everyone = updater.slots(samples)
            for epoch in range(cfg.epochs if samples else 0):
                order = updater.generator(round_index, epoch, offset=500_009)  # apart from RL's shuffles
                minibatches = updater.schedule(
                    samples, everyone, order, cfg.mini_batch_size, cfg.micro_batch_size, replicated=True
                )
                bar.update(task, total=cfg.epochs * len(minibatches))  # same every epoch
                for minibatch in minibatches:
                    ok, step_stats = updater.optimizer_step(minibatch, optimizer, 1.0)
                    updates, skipped = updates + 1, skipped + (not ok)
                    for k, v in step_stats.items():
                        stats[k].append(v)
                    bar.advance(task)
        policy.eval()
        out = mean_over_ranks(stats)
        return out | {"samples": float(len(samples)), "updates": float(updates), "skipped_updates": skipped}

    def _finish_round(self, round_index: int, kept: list[Episode], record: dict[str, Any]) -> None:
        """Append the round's kept episodes and log record, then save the policy to `round-NN` atomically:
        the folder's existence marks the round as finished."""
        if self.accelerator.is_main_process:
            ws.append_kept(self.run_dir, round_index, kept)
            self.log.append(ws.warm_dir(self.run_dir) / ws.LOG, record)
            self.log.track(record, "round", prefix=f"{WARM_START}/")
            with atomic_dir(ws.round_dir(self.run_dir, round_index)) as folder:
                self.accelerator.unwrap_model(self.updater.model).save(folder / "policy")
            if self.log.on_step is not None:
                self.log.on_step(record)
        self.accelerator.wait_for_everyone()
