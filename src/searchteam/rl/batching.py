"""Which samples share an optimizer step and which share a forward pass.

A mini-batch (the samples of one optimizer step) is defined over every process's samples: the batch's N
samples, in an order that does not depend on how they are spread over processes, are shuffled and cut into
ceil(N / mini_batch_size) near-equal mini-batches, so one and several processes take the same optimizer
steps on the same samples. Within a mini-batch each process forwards its own samples in micro-batches of
similar length (sorted, so little padding), at most `micro_batch_size` samples and, when set,
`micro_batch_tokens` padded tokens each; a micro-batch holds one kind of sample (RL or SFT) and, with
per-role adapters, one role. The loss is normalized by the whole mini-batch's counts, so how a mini-batch is
cut into micro-batches does not change its gradient. Every process derives the whole schedule from the same
sample descriptions, so all agree on how many micro-batches each step takes (`lockstep`)."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from searchteam.rl.experience import Sample


@dataclass(frozen=True)
class Slot:
    """What the schedule needs to know of one sample."""

    rank: int  # the process that forwards it
    index: int  # its position in that process's sample list
    length: int  # prompt + completion tokens
    pool: tuple[str, bool]  # samples that may share a forward pass: (role with per-role adapters, sft)
    key: tuple  # its place in the batch, the same whatever the number of processes


def slots_of(samples: list[Sample], rank: int = 0, per_role: bool = False) -> list[Slot]:
    """One slot per sample of process `rank`; `per_role`: a forward pass holds one role (per-role LoRA)."""
    return [
        Slot(
            rank=rank,
            index=i,
            length=len(s.prompt_ids) + len(s.completion_ids),
            pool=(s.role if per_role else "", s.sft),
            key=(s.group_id, s.episode_id, s.turn_index, s.sft),
        )
        for i, s in enumerate(samples)
    ]


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
    `max_samples` samples and (when set) `max_tokens` padded tokens (samples × its longest sample)."""
    pools: dict[tuple[str, bool], list[Slot]] = defaultdict(list)
    for slot in slots:
        pools[slot.pool].append(slot)
    chunks: list[list[Slot]] = []
    for _, pool in sorted(pools.items()):
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
