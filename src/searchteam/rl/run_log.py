"""What a training run records: one JSONL record per step (`train_log.jsonl`) and per warm-start round,
the same numbers sent to accelerate's trackers (`searchteam.tracking`: TensorBoard by default), and the
traces of the episodes it rolled out (`rollouts.jsonl`). Only the main process writes; a resumed run cuts
the files back to its checkpoint's step."""

from __future__ import annotations

import json
import math
from collections import defaultdict
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from accelerate import Accelerator
from accelerate.utils import gather_object

from searchteam import tracking
from searchteam.files import read_jsonl_numbered, write_lines_atomic
from searchteam.rl.config import LOG_NAME, ROLLOUTS_NAME
from searchteam.rl.experience import Sample
from searchteam.types import Episode


class RunLog:
    """The records of one run in `run_dir`. Trackers of the accelerator's `log_with` that are not yet
    running start at the first record and stop at `finish()` (the next record restarts them); `on_step`,
    if given, sees every record first."""

    def __init__(
        self,
        run_dir: Path,
        accelerator: Accelerator,
        setup: tracking.TrackingSetup,
        on_step: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.accelerator = accelerator
        self.setup = setup
        self.on_step = on_step
        self._own_trackers = bool(accelerator.log_with) and not accelerator.trackers
        self._tracking = False

    @property
    def path(self) -> Path:
        return self.run_dir / LOG_NAME

    def step(self, record: dict[str, Any]) -> None:
        """An RL step's record: to `on_step`, the run's log and the trackers (main process only)."""
        if not self.accelerator.is_main_process:
            return
        if self.on_step is not None:
            self.on_step(record)
        self.append(self.path, record)
        self.track(record, "step")

    def append(self, path: Path, record: dict[str, Any]) -> None:
        """One record at the end of a JSONL log; NaN and infinities are written as null."""
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(jsonable(record)) + "\n")

    def track(self, record: dict[str, Any], step_key: str, prefix: str = "") -> None:
        """Send a log record's numbers to the trackers (main process; started at the first record), with
        `record[step_key]` as their step."""
        if self._own_trackers and not self._tracking:
            tracking.start(self.accelerator, self.setup, self.run_dir.name)
            self._tracking = True
        values = tracking.scalars(record, prefix, skip=(step_key,))
        self.accelerator.log(values, step=int(record[step_key]))

    def finish(self) -> None:
        """Close the trackers this log started; the next record reopens them."""
        if self._tracking:
            tracking.finish(self.accelerator)
            self._tracking = False

    def rollouts(self, episodes: list[Episode], step: int, whole: bool = False) -> None:
        """Every process's episodes of a step: traces for reading what the policy did (each turn's
        completion, format flag and reward), or with `whole` the episodes as recorded, prompts and token
        ids included."""
        lines = gather_object([json.dumps({"step": step, **rollout_line(e, whole)}) for e in episodes])
        if not self.accelerator.is_main_process:
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        with (self.run_dir / ROLLOUTS_NAME).open("a", encoding="utf-8") as fh:
            fh.writelines(line + "\n" for line in lines)

    def cut_back(self, step: int) -> None:
        """Drop the log records and traces of steps after `step` (a resumed run writes them again)."""
        if self.accelerator.is_main_process:
            for path in (self.path, self.run_dir / ROLLOUTS_NAME):
                truncate_jsonl(path, "step", step)


def truncate_jsonl(path: Path, key: str, upto: int) -> None:
    """Keep the records of a JSONL log whose `key` is at most `upto` (a resumed run rewrites the rest); a
    torn last line (the process died mid-write) is dropped."""
    if not path.exists():
        return
    kept = [r for _, r in read_jsonl_numbered(path) if r.get(key, 0) <= upto]
    write_lines_atomic(path, (json.dumps(r) + "\n" for r in kept))


def run_trackers(setup: tracking.TrackingSetup) -> list[str]:
    """The trackers a run starts: `report_to`, else TensorBoard (training's default)."""
    if setup.report_to is None:
        return tracking.default_trackers()
    names = tracking.trackers_for(setup.report_to)
    tracking.check_installed(names)
    return names


def role_stats(samples: list[Sample]) -> dict[str, float]:
    """Per-role reward mean, format-error rate and response length (tokens) for the log."""
    out: dict[str, float] = {}
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        by_role[s.role].append(s)
    for role, group in sorted(by_role.items()):
        out[f"reward/{role}"] = float(np.mean([s.reward for s in group]))
        out[f"format_error_rate/{role}"] = float(np.mean([not s.parsed_ok for s in group]))
        out[f"response_length/{role}"] = float(np.mean([len(s.completion_ids) for s in group]))
        out[f"samples/{role}"] = float(len(group))
    if samples:
        out["reward/mean"] = float(np.mean([s.reward for s in samples]))
    return out


def credit_stats(samples: list[Sample]) -> dict[str, float]:
    """Per-role mean return (the critic's target, or the trajectory reward of a group estimator) and mean
    |advantage| after `assign_advantages`, to read the credit each role received from the log."""
    out: dict[str, float] = {}
    by_role: dict[str, list[Sample]] = defaultdict(list)
    for s in samples:
        if not s.sft:
            by_role[s.role].append(s)
    for role, group in sorted(by_role.items()):
        out[f"return/{role}"] = float(np.mean([s.returns for s in group]))
        out[f"abs_advantage/{role}"] = float(np.mean([abs(s.advantage) for s in group]))
    return out


def mismatch_sums(samples: list[Sample]) -> dict[str, list[float]]:
    """Per role, over the trained tokens whose rollout engine gave a logprob: [tokens, Σ |π_rollout − π_old|,
    max |π_rollout − π_old|, Σ k3], with k3 = (r − 1) − log r and r = π_old / π_rollout, an unbiased
    estimate of KL(π_rollout ‖ π_old) on tokens sampled from π_rollout. Combine processes' with
    `mismatch_stats`."""
    sums: dict[str, list[float]] = {}
    for s in samples:
        if s.sft or s.rollout_logprobs is None or s.old_logprobs is None:
            continue
        rows = zip(s.rollout_logprobs, s.old_logprobs, s.loss_mask, strict=True)
        pairs = [(r, o) for r, o, m in rows if m and math.isfinite(r)]
        if not pairs:
            continue
        rollout, old = np.array(pairs).T
        gap = np.abs(np.exp(rollout) - np.exp(old))
        log_r = old - rollout
        role = sums.setdefault(s.role, [0.0, 0.0, 0.0, 0.0])
        role[0] += len(pairs)
        role[1] += float(gap.sum())
        role[2] = max(role[2], float(gap.max()))
        role[3] += float((np.exp(log_r) - 1 - log_r).sum())
    return sums


def mismatch_stats(per_process: list[dict[str, list[float]]]) -> dict[str, float]:
    """The log's rollout-vs-trainer mismatch from every process's `mismatch_sums`: per role the mean and
    max of |π_rollout − π_old| per token and the mean k3 KL estimate."""
    merged: dict[str, list[float]] = {}
    for sums in per_process:
        for role, (n, total, top, k3) in sums.items():
            acc = merged.setdefault(role, [0.0, 0.0, 0.0, 0.0])
            acc[0], acc[1], acc[2], acc[3] = acc[0] + n, acc[1] + total, max(acc[2], top), acc[3] + k3
    out: dict[str, float] = {}
    for role, (n, total, top, k3) in sorted(merged.items()):
        out[f"mismatch/prob_diff_mean/{role}"] = total / n
        out[f"mismatch/prob_diff_max/{role}"] = top
        out[f"mismatch/kl/{role}"] = k3 / n
    return out


def light(sample: Sample) -> Sample:
    """A sample without its prompt and per-token lists, for the log statistics of all processes."""
    return replace(
        sample, prompt_ids=[], loss_mask=[], old_logprobs=None, ref_logprobs=None, rollout_logprobs=None
    )


def rollout_line(episode: Episode, whole: bool = False) -> dict[str, Any]:
    """An episode for `rollouts.jsonl`: question, answer, reward, meta and turns without prompts or token
    ids; with `whole`, the episode as recorded (prompts, continuations, token ids, passages)."""
    if whole:
        return episode.model_dump(mode="json")
    return episode.model_dump(
        mode="json",
        include={"question", "answer", "error", "group_id", "reward", "reward_terms", "meta", "turns"},
        exclude={"turns": {"__all__": {"messages", "prompt_token_ids", "completion_token_ids", "logprobs"}}},
    )


def jsonable(record: dict[str, Any]) -> dict[str, Any]:
    """NaN/inf become null so the log stays valid JSON."""
    return {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in record.items()}
