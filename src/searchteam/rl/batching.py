"""Which samples share an optimizer step and which share a forward pass.

A mini-batch (the samples of one optimizer step) is defined over every process's samples: the batch's N
samples, in an order that does not depend on how they are spread over processes, are shuffled and cut into
ceil(N / mini_batch_size) near-equal mini-batches, so one and several processes take the same optimizer
steps on the same samples. Within a mini-batch each process forwards its own samples in micro-batches of
similar length (sorted, so little padding), at most `micro_batch_size` samples and, when set,
`micro_batch_tokens` padded tokens each; a micro-batch holds one kind of sample (RL or SFT) and, with
per-role adapters, one role. The loss is normalized by the whole mini-batch's counts, so how a mini-batch is
cut into micro-batches does not change its gradient. Every process derives the whole schedule from the same
sample descriptions, so all agree on how many micro-batches each step takes (`lockstep`).

With shared prefixes (`share_prefixes`) a micro-batch is one packed row where each shared token prefix
appears once (`searchteam.llm.prefix_tree`): a pool's samples are taken in token order, so that those with
a common prefix meet, and a micro-batch holds as many as fit a budget of distinct tokens."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from searchteam.llm.prefix_tree import common_prefix
from searchteam.rl.experience import Sample


@dataclass(frozen=True)
class Slot:
    """What the schedule needs to know of one sample."""

    rank: int  # the process that forwards it
    index: int  # its position in that process's sample list
    length: int  # prompt + completion tokens
    pool: tuple[str, bool]  # samples that may share a forward pass: (role with per-role adapters, sft)
    key: tuple  # its place in the batch, the same whatever the number of processes
    ids: tuple[int, ...] = ()  # its tokens, when micro-batches share prefixes


def slots_of(
    samples: list[Sample], rank: int = 0, per_role: bool = False, share_prefixes: bool = False
) -> list[Slot]:
    """One slot per sample of process `rank`; `per_role`: a forward pass holds one role (per-role LoRA);
    `share_prefixes`: the slots carry the tokens (`shared_micro_batches`)."""
    return [
        Slot(
            rank=rank,
            index=i,
            length=len(s.prompt_ids) + len(s.completion_ids),
            pool=(s.role if per_role else "", s.sft),
            key=(s.group_id, s.episode_id, s.turn_index, s.sft),
            ids=tuple(s.prompt_ids + s.completion_ids) if share_prefixes else (),
        )
        for i, s in enumerate(samples)
    ]


def pools_of(slots: list[Slot]) -> list[list[Slot]]:
    """The slots that may share a forward pass, pool by pool in a fixed order."""
    pools: dict[tuple[str, bool], list[Slot]] = defaultdict(list)
    for slot in slots:
        pools[slot.pool].append(slot)
    return [pool for _, pool in sorted(pools.items())]


def mini_batches(slots: list[Slot], size: int | None, generator: torch.Generator) -> list[list[Slot]]:
    """The batch in canonical order, shuffled by `generator`, cut into ceil(N / size) near-equal parts
    (one part when `size` is None)."""
    ordered = sorted(slots, key=lambda s: s.key)
    shuffled = [ordered[i] for i in torch.randperm(len(ordered), generator=generator).tolist()]
    parts = 1 if size is None else -(-len(shuffled) // size)
    bounds = [len(shuffled) * k // parts for k in range(parts + 1)]
    return [shuffled[a:b] for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def micro_batches(slots: list[Slot], max_samples: int, max_tokens: int | None = None) -> list[list[Slot]]:
    """Forward passes over `slots`: per pool, longest first, each filled while it holds at most
    `max_samples` samples and (when set) `max_tokens` padded tokens (samples × its longest sample). Slots
    that carry their tokens share prefixes instead (`shared_micro_batches`)."""
    if slots and slots[0].ids:
        return shared_micro_batches(slots, max_samples, max_tokens)
    chunks: list[list[Slot]] = []
    for pool in pools_of(slots):
        current: list[Slot] = []
        for slot in sorted(pool, key=lambda s: (-s.length, s.key)):
            full = len(current) >= max_samples
            if current and max_tokens is not None:
                full = full or (len(current) + 1) * current[0].length > max_tokens
            if full:
                chunks.append(current)
                current = []
            current.append(slot)
        if current:
            chunks.append(current)
    return chunks


def shared_micro_batches(
    slots: list[Slot], max_samples: int, max_tokens: int | None = None
) -> list[list[Slot]]:
    """Packed forward passes over `slots` (which carry their tokens): per pool, in token order, each filled
    while its distinct tokens (the packed row) stay within `max_tokens`, or when unset within the tokens
    of an average plain micro-batch of the pool (`max_samples` × its mean sample length), which keeps the
    peak memory of a pass near the plain update's. A longer sample goes alone."""
    chunks: list[list[Slot]] = []
    for pool in pools_of(slots):
        budget = max_tokens or max_samples * sum(s.length for s in pool) // len(pool)
        current: list[Slot] = []
        packed = 0
        for slot in sorted(pool, key=lambda s: (s.ids, s.key)):
            added = slot.length - (common_prefix(current[-1].ids, slot.ids) if current else 0)
            if current and packed + added > budget:
                chunks.append(current)
                current, packed, added = [], 0, slot.length
            current.append(slot)
            packed += added
        if current:
            chunks.append(current)
    return chunks


def deal(minibatch: list[Slot], world: int) -> list[Slot]:
    """A mini-batch of samples every process holds (the warm start's), dealt to the processes so that their
    shares hold about as many tokens: longest first, each to the process with the fewest so far."""
    loads = [0] * world
    dealt = []
    for slot in sorted(minibatch, key=lambda s: (-s.length, s.key)):
        rank = loads.index(min(loads))
        loads[rank] += slot.length
        dealt.append(replace(slot, rank=rank))
    return dealt


def lockstep(
    minibatch: list[Slot], world: int, max_samples: int, max_tokens: int | None = None
) -> list[list[list[Slot]]]:
    """Each process's micro-batches of one mini-batch, as many on every process: every DDP backward is a
    collective that each process must join, so a process with fewer pads with empty ones (zero-weight)."""
    shares = [
        micro_batches([s for s in minibatch if s.rank == rank], max_samples, max_tokens)
        for rank in range(world)
    ]
    longest = max(len(share) for share in shares)
    return [share + [[]] * (longest - len(share)) for share in shares]
