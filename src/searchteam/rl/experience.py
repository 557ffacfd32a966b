"""From recorded episodes to training samples: one Sample per policy Turn (prompt ids, completion ids and a
loss mask that is 1 only on tokens the model generated).

Monolithic agents (Search-R1) keep generating inside one assistant message: turn k's prompt ends with the
continuation (earlier completions plus retrieved <information> text), and `turn.env_spans` holds the
character ranges of environment text inside it. Per-turn samples put that continuation in the prompt, so it
is never trained. `merge_continuations=True` instead folds such a chain of turns into one trajectory
sample, as Search-R1 trains it, whose completion spans the whole assistant message and whose loss mask is
0 on environment tokens."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch

from searchteam.errors import ExperienceError
from searchteam.llm.prefix_tree import PrefixTree, pack
from searchteam.types import Episode, Turn

Render = Callable[[Turn], str]


@dataclass
class Sample:
    """One trainable LLM call. Token lists are unpadded; `loss_mask` is aligned with `completion_ids`."""

    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    role: str
    episode_id: int
    group_id: str
    turn_index: int
    reward: float = 0.0
    subgroup: str = ""
    sft: bool = False
    parsed_ok: bool = True
    old_logprobs: list[float] | None = None
    ref_logprobs: list[float] | None = None
    # the rollout engine's logprob of each completion token (nan where it gave none: retrieved text)
    rollout_logprobs: list[float] | None = None
    old_value: float = 0.0
    advantage: float = 0.0
    returns: float = 0.0

    @property
    def num_trained_tokens(self) -> int:
        return sum(self.loss_mask)


def continuation_of(turn: Turn) -> str:
    """The assistant text already present before this turn's completion ("" for an ordinary chat call)."""
    if turn.continuation is not None:
        return turn.continuation
    if turn.continuation_chars:
        raise ExperienceError(
            f"turn {turn.step} of role '{turn.role}' continued an assistant message but recorded neither "
            "prompt_token_ids nor its continuation; record the continuation text to rebuild its prompt"
        )
    return ""


def chat_render(tokenizer) -> Render:
    """The prompt text the HF backend renders (`HFBackend.render`): chat template with generation prompt
    plus the assistant continuation."""

    def render(turn: Turn) -> str:
        text = tokenizer.apply_chat_template(turn.messages, tokenize=False, add_generation_prompt=True)
        return text + continuation_of(turn)

    return render


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _completion_ids(tokenizer, turn: Turn) -> list[int]:
    return list(turn.completion_token_ids) or (_encode(tokenizer, turn.completion) if turn.completion else [])


def turn_token_ids(turn: Turn, tokenizer, render: Render) -> tuple[list[int], list[int]]:
    """A turn's prompt and completion ids: the engine's where it recorded them, else rendered (`render`) and
    tokenized. An ExperienceError when a continued turn recorded neither its ids nor its continuation."""
    return _prompt_ids(tokenizer, turn, render), _completion_ids(tokenizer, turn)


def _prompt_ids(tokenizer, turn: Turn, render: Render) -> list[int]:
    return list(turn.prompt_token_ids) or _encode(tokenizer, render(turn))


def _turn_sample(
    turn: Turn, index: int, episode_id: int, group_id: str, tokenizer, render: Render
) -> Sample | None:
    completion = _completion_ids(tokenizer, turn)
    if not completion:
        return None
    prompt = _prompt_ids(tokenizer, turn, render)
    logprobs = turn.logprobs if turn.logprobs is not None and len(turn.logprobs) == len(completion) else None
    return Sample(
        prompt_ids=prompt,
        completion_ids=completion,
        loss_mask=[1] * len(completion),
        role=turn.role,
        episode_id=episode_id,
        group_id=group_id,
        turn_index=index,
        reward=0.0 if turn.reward is None else float(turn.reward),
        subgroup=turn.subgroup,
        parsed_ok=turn.parsed_ok,
        old_logprobs=list(logprobs) if logprobs is not None else None,
        rollout_logprobs=list(logprobs) if logprobs is not None else None,
    )


def _sft_sample(
    turn: Turn, index: int, episode_id: int, group_id: str, tokenizer, render: Render
) -> Sample | None:
    """DAC Eq. 7: the pseudo-target a reward scheme recorded for this turn's prompt (`turn.sft_target`,
    e.g. the clean-evidence answer for a hard-positive input), trained by likelihood, not by advantage."""
    completion = _encode(tokenizer, turn.sft_target) if turn.sft_target else []
    base = _turn_sample(turn, index, episode_id, group_id, tokenizer, render) if completion else None
    if base is None:
        return None
    return replace(
        base,
        completion_ids=completion,
        loss_mask=[1] * len(completion),
        reward=0.0,
        old_logprobs=None,
        rollout_logprobs=None,
        sft=True,
    )


def env_token_mask(offsets: list[tuple[int, int]], env_spans: Iterable[tuple[int, int]]) -> list[int]:
    """1 for each token whose characters lie outside every environment span, 0 if it overlaps one."""
    spans = [(int(a), int(b)) for a, b in env_spans]
    return [0 if any(s < b and e > a for a, b in spans) else 1 for s, e in offsets]


def _trajectory_sample(
    chain: list[tuple[int, Turn]], episode_id: int, group_id: str, tokenizer, render: Render
) -> Sample | None:
    """One sample for a chain of continued turns: prompt = chat template, completion = whole assistant
    message (continuation + last completion), env tokens masked out."""
    index, last = chain[-1]
    continuation = continuation_of(last)
    full = render(last)
    head = full[: len(full) - len(continuation)] if continuation else full
    enc = tokenizer(continuation, add_special_tokens=False, return_offsets_mapping=True)
    mask = env_token_mask(enc["offset_mapping"], last.env_spans)
    completion = _completion_ids(tokenizer, last)
    if not completion and not any(mask):
        return None
    rewards = [t.reward for _, t in chain if t.reward is not None]
    known = last.logprobs is not None and len(last.logprobs) == len(completion) and bool(completion)
    earlier = _chain_logprobs(chain[:-1], enc["input_ids"], enc["offset_mapping"])
    rollout = earlier + (list(last.logprobs) if known else [math.nan] * len(completion))
    if all(math.isnan(x) for x in rollout):
        rollout = None
    return Sample(
        prompt_ids=_encode(tokenizer, head),
        completion_ids=list(enc["input_ids"]) + completion,
        loss_mask=mask + [1] * len(completion),
        rollout_logprobs=rollout,
        role=last.role,
        episode_id=episode_id,
        group_id=group_id,
        turn_index=index,
        reward=float(sum(rewards)),
        parsed_ok=all(t.parsed_ok for _, t in chain),
    )


def _chain_logprobs(
    turns: list[tuple[int, Turn]], ids: list[int], offsets: list[tuple[int, int]]
) -> list[float]:
    """The engine's logprob of each token of a chain's re-tokenized continuation, nan where unknown. Inside
    the characters of an earlier turn's completion, the tokens that re-tokenize to the ids it generated
    (matched from its start and from its end: only a boundary with retrieved text can tokenize otherwise)
    take their logprobs; retrieved text stays nan."""
    out = [math.nan] * len(ids)
    for _, turn in turns:
        generated = list(turn.completion_token_ids)
        if not generated or turn.logprobs is None or len(turn.logprobs) != len(generated):
            continue
        start = len(continuation_of(turn))
        end = start + len(turn.completion)
        inside = [i for i, (a, b) in enumerate(offsets) if a >= start and b <= end and b > a]
        forward = zip(inside, range(len(generated)), strict=False)
        backward = zip(reversed(inside), range(-1, -len(generated) - 1, -1), strict=False)
        for pairs in (forward, backward):
            for i, g in pairs:
                if ids[i] != generated[g]:
                    break
                out[i] = turn.logprobs[g]
    return out


def _extends(prev: Turn, turn: Turn) -> bool:
    """Whether `turn` continues the assistant message in which `prev` generated its completion."""
    if turn.role != prev.role or turn.messages != prev.messages or turn.continuation is None:
        return False
    return turn.continuation.startswith((prev.continuation or "") + prev.completion)


def _chains(turns: list[tuple[int, Turn]]) -> list[list[tuple[int, Turn]]]:
    """Group turns into maximal chains where each turn continues the previous one of the chain."""
    chains: list[list[tuple[int, Turn]]] = []
    for item in turns:
        owner = next((c for c in reversed(chains) if _extends(c[-1][1], item[1])), None)
        if owner is None:
            chains.append([item])
        else:
            owner.append(item)
    return chains


def group_key(episode: Episode) -> str:
    """The GRPO group of an episode: rollouts of the same question (override with `episode.group_id`)."""
    return episode.group_id or episode.question.id


def samples_from_episodes(
    episodes: list[Episode],
    tokenizer,
    render: Render | None = None,
    *,
    roles: Iterable[str] | None = None,
    merge_continuations: bool = False,
    sft_targets: bool = False,
) -> list[Sample]:
    """Training samples from every turn the policy generated (`turn.model == "policy"`; roles on their own
    models and frozen turns are skipped), optionally only for `roles`. Prompt ids come from the
    turn when the backend recorded them, else from `render(turn)` (default: `chat_render(tokenizer)`).
    A turn without a reward counts as reward 0; `subgroup` is the turn's `subgroup` (a separate GRPO
    group within the question, e.g. DAC's hard-positive generator inputs). With `sft_targets`, a turn whose
    reward scheme recorded an `sft_target` adds one more sample with `sft=True` (see `_sft_sample`).
    `episode_id` is the episode's index in `episodes`; `group_id` is `group_key(episode)`."""
    render = render or chat_render(tokenizer)
    wanted = set(roles) if roles is not None else None
    samples: list[Sample] = []
    for episode_id, episode in enumerate(episodes):
        group_id = group_key(episode)
        turns = [
            (i, t)
            for i, t in enumerate(episode.turns)
            if t.model == "policy" and not t.frozen and (wanted is None or t.role in wanted)
        ]
        if merge_continuations:
            for chain in _chains(turns):
                if len(chain) == 1 and not chain[0][1].continuation:
                    sample = _turn_sample(chain[0][1], chain[0][0], episode_id, group_id, tokenizer, render)
                else:
                    sample = _trajectory_sample(chain, episode_id, group_id, tokenizer, render)
                if sample is not None:
                    samples.append(sample)
            continue
        for index, turn in turns:
            sample = _turn_sample(turn, index, episode_id, group_id, tokenizer, render)
            if sample is not None:
                samples.append(sample)
            if sft_targets:
                sft = _sft_sample(turn, index, episode_id, group_id, tokenizer, render)
                if sft is not None:
                    samples.append(sft)
    return samples


@dataclass
class Batch:
    """Tensors for one micro-batch: right-padded rows, or with a `tree` one packed row of shared prefixes
    (`searchteam.llm.prefix_tree`). Completion token j of sample i (`target_ids[i, j]`) is predicted by the
    logit at `target_index[i, j]` (row i's position, or the packed row's); the critic reads the hidden state
    at `value_index[i]` (the last prompt token, i.e. the observation o_t the turn acted on)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    target_index: torch.Tensor
    loss_mask: torch.Tensor
    value_index: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    old_values: torch.Tensor
    old_logprobs: torch.Tensor | None
    ref_logprobs: torch.Tensor | None
    roles: list[str]
    target_ids: torch.Tensor
    rollout_logprobs: torch.Tensor | None = None  # nan where unknown
    tree: PrefixTree | None = None

    def to(self, device: torch.device | str) -> Batch:
        movable = (torch.Tensor, PrefixTree)
        moved = {k: (v.to(device) if isinstance(v, movable) else v) for k, v in self.__dict__.items()}
        return Batch(**moved)


def _padded(rows: list[list[float]] | list[list[int]], width: int, fill: float, dtype) -> torch.Tensor:
    out = torch.full((len(rows), width), fill, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def collate(samples: list[Sample], pad_id: int, share_prefixes: bool = False) -> Batch:
    """Stack samples (prompt + completion, right padding) into a Batch, or with `share_prefixes` pack them
    into one row where each shared token prefix appears once; logprob fields are kept only when every
    sample has them."""
    if not samples:
        raise ValueError("cannot collate an empty micro-batch")
    if any(not s.prompt_ids for s in samples):
        raise ExperienceError("a sample has an empty prompt; the first completion token needs a context")
    seqs = [s.prompt_ids + s.completion_ids for s in samples]
    cwidth = max(len(s.completion_ids) for s in samples)
    targets = [[len(s.prompt_ids) - 1 + j for j in range(len(s.completion_ids))] for s in samples]
    have_old = all(s.old_logprobs is not None for s in samples)
    have_ref = all(s.ref_logprobs is not None for s in samples)
    if share_prefixes:
        tree = pack(seqs)
        input_ids, attention_mask = tree.input_ids, torch.ones_like(tree.input_ids)
        targets = [tree.paths[i][row].tolist() for i, row in enumerate(targets)]
        value_index = torch.stack([tree.paths[i][len(s.prompt_ids) - 1] for i, s in enumerate(samples)])
    else:
        tree, width = None, max(len(s) for s in seqs)
        input_ids = _padded(seqs, width, pad_id, torch.long)
        attention_mask = _padded([[1] * len(s) for s in seqs], width, 0, torch.long)
        value_index = torch.tensor([len(s.prompt_ids) - 1 for s in samples], dtype=torch.long)
    return Batch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        target_index=_padded(targets, cwidth, 0, torch.long),
        loss_mask=_padded([s.loss_mask for s in samples], cwidth, 0.0, torch.float32),
        value_index=value_index,
        target_ids=_padded([s.completion_ids for s in samples], cwidth, pad_id, torch.long),
        tree=tree,
        advantages=torch.tensor([s.advantage for s in samples], dtype=torch.float32),
        returns=torch.tensor([s.returns for s in samples], dtype=torch.float32),
        old_values=torch.tensor([s.old_value for s in samples], dtype=torch.float32),
        old_logprobs=_padded([s.old_logprobs for s in samples], cwidth, 0.0, torch.float32)
        if have_old
        else None,
        ref_logprobs=_padded([s.ref_logprobs for s in samples], cwidth, 0.0, torch.float32)
        if have_ref
        else None,
        roles=[s.role for s in samples],
        rollout_logprobs=_rollout_logprobs(samples, cwidth),
    )


def _rollout_logprobs(samples: list[Sample], width: int) -> torch.Tensor | None:
    """The engine's logprobs of a micro-batch, nan where unknown; None when no sample has any."""
    if all(s.rollout_logprobs is None for s in samples):
        return None
    rows = [s.rollout_logprobs or [math.nan] * len(s.completion_ids) for s in samples]
    return _padded(rows, width, math.nan, torch.float32)
