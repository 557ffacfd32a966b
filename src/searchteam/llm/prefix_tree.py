"""Shared-prefix packing: token sequences that share prefixes, forwarded as one row in which every shared
prefix appears once.

The row holds the nodes of the sequences' token trie in depth-first order: the sequences sorted, each one
adding the tokens after its longest common prefix with the one before it. A token's position id is its depth
(its index in its sequence), and it attends to exactly the tokens before it in its own sequence: its
ancestors in the trie. So each token's hidden state, and every gradient through it, equals what the
sequence's own forward pass computes, while a prefix shared by k sequences is computed once, not k times.

The attention runs per added run of tokens, over the keys of its own sequence's path (`tree_attention`),
so its cost is that of the distinct tokens, not the square of the packed length; it is registered with
transformers as an attention implementation (`TREE_ATTENTION`) that behaves as `sdpa` in every forward pass
not given a tree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

TREE_ATTENTION = "searchteam_prefix_tree"


@dataclass
class Run:
    """Tokens one sequence adds to the row (`start`..`end`), and the row positions of that sequence up to
    `end` (keys and values); the run's first token sits at depth `len(keys) - (end - start)`."""

    start: int
    end: int
    keys: torch.Tensor
    mask: torch.Tensor | None  # [run, keys] True where a query sees a key; None: the run is a whole sequence


@dataclass
class PrefixTree:
    """A packed row of token sequences. `paths[i][t]` is the row position of token t of sequence i."""

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    runs: list[Run]
    paths: list[torch.Tensor]

    def to(self, device: torch.device | str) -> PrefixTree:
        runs = [
            Run(r.start, r.end, r.keys.to(device), None if r.mask is None else r.mask.to(device))
            for r in self.runs
        ]
        return PrefixTree(
            self.input_ids.to(device), self.position_ids.to(device), runs, [p.to(device) for p in self.paths]
        )

    @property
    def decoder_kwargs(self) -> dict:
        """What a transformers decoder takes to forward the row: a placeholder 4D mask, which transformers
        passes through unbuilt (the tree attention ignores it), the depths as position ids, and the tree."""
        placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=self.input_ids.device)
        return {
            "input_ids": self.input_ids,
            "attention_mask": placeholder,
            "position_ids": self.position_ids,
            "prefix_tree": self,
            "use_cache": False,
        }


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def pack(sequences: list[list[int]]) -> PrefixTree:
    """The packed row of `sequences` (each non-empty); `paths` follow the order given."""
    if any(not s for s in sequences):
        raise ValueError("cannot pack an empty sequence")
    order = sorted(range(len(sequences)), key=lambda i: sequences[i])
    ids: list[int] = []
    depths: list[int] = []
    runs: list[Run] = []
    paths: list[list[int]] = [[] for _ in sequences]
    previous: list[int] = []
    previous_path: list[int] = []
    for i in order:
        seq = sequences[i]
        shared = common_prefix(previous, seq)
        start = len(ids)
        path = previous_path[:shared] + list(range(start, start + len(seq) - shared))
        ids.extend(seq[shared:])
        depths.extend(range(shared, len(seq)))
        if len(seq) > shared:
            runs.append(_run(start, path, shared))
        paths[i] = path
        previous, previous_path = seq, path
    return PrefixTree(
        input_ids=torch.tensor([ids], dtype=torch.long),
        position_ids=torch.tensor([depths], dtype=torch.long),
        runs=runs,
        paths=[torch.tensor(p, dtype=torch.long) for p in paths],
    )


def _run(start: int, path: list[int], shared: int) -> Run:
    """The run of the tokens a sequence adds after its `shared` first: query q (depth shared + q) sees the
    keys of depth 0..shared + q."""
    length = len(path) - shared
    mask = None if shared == 0 else torch.ones(length, len(path), dtype=torch.bool).tril(diagonal=shared)
    return Run(start, start + length, torch.tensor(path, dtype=torch.long), mask)


def tree_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention over a packed row ([1, heads, N, d]) given `prefix_tree`, each run over its sequence's keys;
    `sdpa` without one."""
    tree: PrefixTree | None = kwargs.pop("prefix_tree", None)
    if tree is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = query.shape[1] // key.shape[1]
    dropout = dropout if module.training else 0.0
    outputs = []
    for run in tree.runs:
        keys, values = key.index_select(2, run.keys), value.index_select(2, run.keys)
        if run.mask is not None and groups > 1:  # a masked GQA call falls back to the math kernel
            keys, values = keys.repeat_interleave(groups, 1), values.repeat_interleave(groups, 1)
        outputs.append(
            F.scaled_dot_product_attention(
                query[:, :, run.start : run.end],
                keys,
                values,
                attn_mask=run.mask,
                dropout_p=dropout,
                is_causal=run.mask is None,
                scale=scaling,
                enable_gqa=run.mask is None and groups > 1,
            )
        )
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(TREE_ATTENTION, tree_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(TREE_ATTENTION, sdpa_mask)


def enable_tree_attention(model: torch.nn.Module) -> None:
    """Let `model` (an sdpa transformers model) forward a `PrefixTree`; other forward passes are unchanged."""
    config = model.config
    if config._attn_implementation not in ("sdpa", TREE_ATTENTION):
        raise ValueError(
            f"a shared-prefix update needs the model's sdpa attention, not {config._attn_implementation!r}; "
            "load it with attn_implementation='sdpa' or set train.share_prefixes: false"
        )
    config._attn_implementation = TREE_ATTENTION


def uses_tree_attention(model: torch.nn.Module) -> bool:
    return getattr(model.config, "_attn_implementation", None) == TREE_ATTENTION
