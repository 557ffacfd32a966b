"""The warm start's data side: which sampled episodes to keep, their turns as likelihood samples, and the
files that let a killed warm start resume (`RUN/warm_start/`). `searchteam.train.build` supplies the
rollouts and the answer score."""

from __future__ import annotations

import json
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from searchteam.files import read_jsonl_tolerant, write_lines_atomic
from searchteam.rl.config import WARM_START, WarmStartConfig
from searchteam.rl.experience import Sample, samples_from_episodes
from searchteam.types import Episode, Turn

KEPT = "kept.jsonl"  # every kept episode, one per line, with the round that kept it
LOG = "log.jsonl"  # one record per finished round
COLLECTED = "collected-*.jsonl"  # per round, its sampled episodes and scores, saved before its fine-tuning
COLLECTED_FILE = re.compile(r"collected-(\d+)\.jsonl")
ROUND_DIR = re.compile(r"round-(\d+)")


@dataclass
class WarmStart:
    """What the trainer needs for the stage: its options, `collect(round)` → this process's sampled
    episodes, `score(episode)` → the final answer's F1 against the gold answers, and `reward(episodes)`,
    the method's reward scheme (sets the turns' rewards; used with `keep_by: role_reward`)."""

    config: WarmStartConfig
    collect: Callable[[int], list[Episode]]
    score: Callable[[Episode], float]
    reward: Callable[[list[Episode]], None] | None = None


def policy_turns(episode: Episode, roles: Iterable[str] | None = None) -> list[Turn]:
    """The turns the policy generated (the ones the stage fine-tunes), optionally only of `roles`."""
    wanted = set(roles) if roles else None
    return [
        t
        for t in episode.turns
        if t.model == "policy" and not t.frozen and (wanted is None or t.role in wanted)
    ]


def support_recall(episode: Episode) -> float | None:
    """Share of the question's supporting titles among the titles of every passage the episode retrieved;
    None for a question without supporting titles."""
    titles = set(episode.question.meta.get("supporting_titles") or [])
    if not titles:
        return None
    found = {p.title for p in episode.passages}
    return len(titles & found) / len(titles)


def titles_added(episode: Episode) -> int | None:
    """How many of the question's supporting titles the episode's later searches returned that its first
    search did not (a second hop's find); None for a question without supporting titles."""
    titles = set(episode.question.meta.get("supporting_titles") or [])
    if not titles:
        return None
    first, *later = episode.retrievals or [None]
    seen = {p.title for p in first.passages} if first else set()
    found = {p.title for r in later for p in r.passages}
    return len((titles & found) - seen)


def keep(episode: Episode, score: float, config: WarmStartConfig, roles: Iterable[str] | None = None) -> bool:
    """Rejection sampling's filter: a finished episode with a correct enough answer (F1 ≥ min_f1) whose
    policy turns all parsed (unless `require_parsed` is off), and with at least one policy turn; with
    `min_support_recall`, its searches must also have found that share of the supporting titles, and with
    `min_titles_added`, its later searches that many supporting titles its first search lacked."""
    turns = policy_turns(episode, roles)
    if episode.error or not turns or score < config.min_f1:
        return False
    if not reaches(support_recall(episode), config.min_support_recall):
        return False
    if not reaches(titles_added(episode), config.min_titles_added):
        return False
    return not config.require_parsed or all(t.parsed_ok for t in turns)


def reaches(value: float | None, minimum: float | None) -> bool:
    """Whether a supporting-title check passes: no minimum set, or a value (the question has supporting
    titles) at least the minimum."""
    return minimum is None or (value is not None and value >= minimum)


def role_returns(episode: Episode, roles: Iterable[str] | None = None) -> dict[str, float]:
    """Each role's return in a rewarded episode: the sum of its policy turns' rewards (unset counts 0)."""
    returns: dict[str, float] = defaultdict(float)
    for turn in policy_turns(episode, roles):
        returns[turn.role] += turn.reward or 0.0
    return dict(returns)


def keep_by_role(
    episode: Episode, config: WarmStartConfig, roles: Iterable[str] | None = None
) -> Episode | None:
    """`keep_by: role_reward`'s filter on a rewarded episode: the episode with only the policy turns of the
    roles whose return reaches `min_role_reward` (and whose turns all parsed, unless `require_parsed` is
    off), or None when no role qualifies or the episode failed."""
    if episode.error:
        return None
    turns = policy_turns(episode, roles)
    kept = {
        role
        for role, value in role_returns(episode, roles).items()
        if value >= config.min_role_reward
        and (not config.require_parsed or all(t.parsed_ok for t in turns if t.role == role))
    }
    if not kept:
        return None
    return episode.model_copy(update={"turns": [t for t in turns if t.role in kept]})


def kept_turn_counts(kept: list[Episode], roles: Iterable[str] | None = None) -> dict[str, float]:
    """`kept_turns/ROLE`: the policy turns of the kept episodes by role, the turns the round fine-tunes (a
    frozen reader's turns in the same episodes are not counted)."""
    counts: dict[str, float] = defaultdict(float)
    for episode in kept:
        for turn in policy_turns(episode, roles):
            counts[f"kept_turns/{turn.role}"] += 1
    return dict(counts)


def round_stats(
    episodes: list[Episode], scores: list[float], kept: list[bool], roles: Iterable[str] | None = None
) -> dict[str, float]:
    """Per round: the sampled episodes' mean F1 and share kept, each role's format-error rate and mean
    response length (characters) over all sampled turns."""
    stats = {
        "episodes": float(len(episodes)),
        "kept": float(sum(kept)),
        "kept_share": float(np.mean(kept)) if kept else 0.0,
        "f1/sampled": float(np.mean(scores)) if scores else 0.0,
    }
    recalls = [r for r in map(support_recall, episodes) if r is not None]
    if recalls:
        stats["support_recall/sampled"] = float(np.mean(recalls))
        added = [a for a in map(titles_added, episodes) if a is not None]
        stats["titles_added/sampled"] = float(np.mean([a > 0 for a in added]))
    errors: dict[str, list[bool]] = defaultdict(list)
    lengths: dict[str, list[int]] = defaultdict(list)
    for episode in episodes:
        for turn in policy_turns(episode, roles):
            errors[turn.role].append(not turn.parsed_ok)
            lengths[turn.role].append(len(turn.completion))
    for role in sorted(errors):
        stats[f"format_error_rate/{role}"] = float(np.mean(errors[role]))
        stats[f"response_chars/{role}"] = float(np.mean(lengths[role]))
    return stats


def text_only(episode: Episode) -> Episode:
    """The episode with its turns' token ids and logprobs dropped: samples are then tokenized from the text
    by the student's own tokenizer and chat template, which a teacher's token ids would not match."""
    turns = [
        t.model_copy(update={"prompt_token_ids": [], "completion_token_ids": [], "logprobs": None})
        for t in episode.turns
    ]
    return episode.model_copy(update={"turns": turns})


def likelihood_samples(
    episodes: list[Episode], tokenizer, roles: Iterable[str] | None = None
) -> list[Sample]:
    """Every policy turn of `episodes` that parsed as a likelihood (SFT) sample: the loss trains all its
    completion tokens with weight 1, whatever the turn's reward. A turn that did not parse is never a
    target (with `require_parsed: false` a correct episode is kept, but only its well-formed turns teach)."""
    parsed = [e.model_copy(update={"turns": [t for t in e.turns if t.parsed_ok]}) for e in episodes]
    samples = samples_from_episodes([text_only(e) for e in parsed], tokenizer, roles=roles)
    return [replace(s, sft=True, reward=0.0, old_logprobs=None) for s in samples]


# ---- files ------------------------------------------------------------------------------------------


def warm_dir(run_dir: Path) -> Path:
    return run_dir / WARM_START


def round_dir(run_dir: Path, round_index: int) -> Path:
    return warm_dir(run_dir) / f"round-{round_index:02d}"


def finished_rounds(run_dir: Path) -> int:
    """How many rounds finished: the highest `round-NN` folder (each is written atomically at a round's
    end, after its kept episodes and log record)."""
    found = [int(m.group(1)) for p in warm_dir(run_dir).glob("round-*") if (m := ROUND_DIR.fullmatch(p.name))]
    return max(found, default=0)


def collected_path(run_dir: Path, round_index: int) -> Path:
    return warm_dir(run_dir) / COLLECTED.replace("*", f"{round_index:02d}")


def _episode_line(key: str, value: float, episode: Episode) -> str:
    """One JSONL line: the episode (text only) with one extra field, `key`."""
    return json.dumps({key: value, **text_only(episode).model_dump(mode="json")}) + "\n"


def _read_episode_lines(path: Path, key: str) -> list[tuple[float, Episode]]:
    """What `_episode_line` wrote: the extra field's value and the episode, per line (a torn last line is
    left out)."""
    return [(r.pop(key), Episode.model_validate(r)) for r in read_jsonl_tolerant(path)]


def append_kept(run_dir: Path, round_index: int, episodes: list[Episode]) -> None:
    warm_dir(run_dir).mkdir(parents=True, exist_ok=True)
    with (warm_dir(run_dir) / KEPT).open("a", encoding="utf-8") as fh:
        for episode in episodes:
            fh.write(_episode_line("round", round_index, episode))


def save_collected(run_dir: Path, round_index: int, episodes: list[Episode], scores: list[float]) -> None:
    """Every episode a round sampled, with its score, written atomically once sampling ends: a run killed
    during the (long) fine-tuning resumes the round from these instead of sampling it again."""
    lines = (_episode_line("score", score, e) for e, score in zip(episodes, scores, strict=True))
    write_lines_atomic(collected_path(run_dir, round_index), lines)


def sampling_path(run_dir: Path, round_index: int, rank: int = 0) -> Path:
    """Where a process appends each episode of a round the moment it is sampled, until the round's
    `collected-NN.jsonl` holds them all: a run killed while sampling keeps what it had sampled."""
    return warm_dir(run_dir) / f"sampling-{round_index:02d}-rank{rank}.jsonl"


def read_sampling(path: Path) -> list[Episode]:
    """The episodes a killed sampling had finished (a torn last line left out)."""
    return [Episode.model_validate(r) for r in read_jsonl_tolerant(path)] if path.exists() else []


def append_sampling(path: Path, episode: Episode) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as fh:
        fh.write(text_only(episode).model_dump_json() + "\n")


def clear_sampling(run_dir: Path, round_index: int) -> None:
    """Drop the round's per-episode files once its `collected-NN.jsonl` is written."""
    for path in warm_dir(run_dir).glob(f"sampling-{round_index:02d}-rank*.jsonl"):
        path.unlink(missing_ok=True)


def collected_rounds(run_dir: Path) -> list[int]:
    """The rounds whose sampled episodes were saved, in order."""
    files = warm_dir(run_dir).glob(COLLECTED)
    return sorted(int(m.group(1)) for p in files if (m := COLLECTED_FILE.fullmatch(p.name)))


def read_collected(run_dir: Path, round_index: int) -> tuple[list[Episode], list[float]] | None:
    """What `save_collected` wrote for the round, or None when its sampling never finished."""
    path = collected_path(run_dir, round_index)
    if not path.exists():
        return None
    lines = _read_episode_lines(path, "score")
    return [episode for _, episode in lines], [float(score) for score, _ in lines]


def read_kept(run_dir: Path) -> list[Episode]:
    """Every episode in `kept.jsonl`. The trainer first cuts the lines of unfinished rounds (and a torn
    last line) with `truncate_jsonl`, so a resumed stage reads and extends what finished rounds kept."""
    path = warm_dir(run_dir) / KEPT
    if not path.exists():
        return []
    return [episode for _, episode in _read_episode_lines(path, "round")]
