"""Peak memory of the logprob computation: bf16 logits cast to fp32 at every completion position at once
(searchteam up to commit 85a4d67) against the chunked fp32 projection of `searchteam.llm.logprobs`.

One training micro-batch's head pass, measured in one run: hidden states [B, C, H] in bf16 that require
grad (as a backbone produces them), a frozen bf16 LM head (LoRA training), the chosen tokens' logprobs and
the detached entropy the trainer logs, then the backward pass of a token-mean loss. Peak memory is the
largest sum of live tensor storage bytes that torch ops allocated, tracked by a dispatch mode (views
counted once; the inputs and the head's weights are excluded, being the same both ways).

CPUs without native bf16 matrix units take tens of minutes for a bf16 GEMM of this size, so the old way's
bf16 projection runs as `Bf16Gemm`: an fp32 GEMM whose fp32 scratch is not tracked and whose result is
rounded to bf16, i.e. the memory of a native bf16 GEMM (a bf16 output, the input saved for backward).

    nice -n 10 python benchmarks/bench_logprobs.py [--batch 2 --completion 1024 --vocab 151936 --hidden 896]
"""

from __future__ import annotations

import argparse
import weakref
from collections.abc import Callable

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from searchteam.llm.logprobs import CHUNK_POSITIONS, projected_stats, token_entropy


class LiveBytes(TorchDispatchMode):
    """Peak of the bytes held by storages that ops allocate while the mode is active (and not paused)."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.paused = False
        self._seen: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self._track(t.untyped_storage())
        return out

    def track(self, t: torch.Tensor) -> torch.Tensor:
        self._track(t.untyped_storage())
        return t

    def _track(self, storage: torch.UntypedStorage) -> None:
        key = storage._cdata
        if key in self._seen:
            return
        self._seen.add(key)
        size = storage.nbytes()
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        self._seen.discard(key)
        self.live -= size


TRACKER: LiveBytes | None = None


def _untracked_bf16(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b rounded to bf16; only the bf16 result counts (a native bf16 GEMM allocates nothing else)."""
    assert TRACKER is not None
    TRACKER.paused = True
    try:
        out = (a.float() @ b.float()).to(torch.bfloat16)
    finally:
        TRACKER.paused = False
    return TRACKER.track(out)


class Bf16Gemm(torch.autograd.Function):
    """hidden [N, H] @ weight.T [H, V] with a frozen weight, as a bf16 GEMM would be."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(weight)
        return _untracked_bf16(hidden, weight.t())

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (weight,) = ctx.saved_tensors
        return _untracked_bf16(grad, weight), None


def old_way(head: nn.Linear, hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """85a4d67: logits in the head's dtype for every position, cast to fp32, entropy from the same logits."""
    flat = Bf16Gemm.apply(hidden.reshape(-1, hidden.shape[-1]), head.weight)
    logits = flat.view(*hidden.shape[:-1], -1).float()
    logprobs = logits.gather(-1, tokens[..., None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    with torch.no_grad():
        entropy = token_entropy(logits)
    return logprobs, entropy


def new_way(head: nn.Module, hidden: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    logprobs, entropy = projected_stats(head, hidden, tokens, entropy="detached")
    assert entropy is not None
    return logprobs, entropy


def measure(
    way: Callable, head: nn.Module, hidden: torch.Tensor, tokens: torch.Tensor
) -> tuple[int, torch.Tensor]:
    """Peak bytes of forward + backward, and the hidden states' gradient."""
    global TRACKER
    hidden = hidden.detach().requires_grad_(True)
    with LiveBytes() as TRACKER:
        logprobs, _ = way(head, hidden, tokens)
        (-logprobs.mean()).backward()
        values = logprobs.detach()
        del logprobs
    return TRACKER.peak, values, hidden.grad


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--completion", type=int, default=1024, help="completion positions per row")
    parser.add_argument("--vocab", type=int, default=151936, help="Qwen2.5's vocabulary")
    parser.add_argument("--hidden", type=int, default=896, help="Qwen2.5-0.5B's hidden size")
    args = parser.parse_args()
    torch.manual_seed(0)
    head = nn.Linear(args.hidden, args.vocab, bias=False).to(torch.bfloat16).requires_grad_(False)
    hidden = torch.randn(args.batch, args.completion, args.hidden, dtype=torch.bfloat16)
    tokens = torch.randint(0, args.vocab, (args.batch, args.completion))
    new_peak, new_lp, new_grad = measure(new_way, head, hidden, tokens)
    old_peak, old_lp, old_grad = measure(old_way, head, hidden, tokens)
    gib = 2**30  # GiB
    shape = f"B={args.batch} C={args.completion} V={args.vocab} H={args.hidden}"
    print(f"{shape}, chunks of {CHUNK_POSITIONS} positions")
    print(f"old (bf16 logits, all positions): peak {old_peak / gib:.3f} GiB")
    print(f"new (fp32, chunked, recomputed):   peak {new_peak / gib:.3f} GiB")
    print(f"peak ratio old / new: {old_peak / new_peak:.1f}x")
    lp_diff = (old_lp - new_lp).abs().max().item()
    grad_diff = (old_grad.float() - new_grad.float()).abs().max().item()
    print(f"max |logprob old - new| {lp_diff:.2e}, max |hidden.grad old - new| {grad_diff:.2e}")


if __name__ == "__main__":
    main()
