"""Update throughput: the lean update against the update it replaced, one change at a time, in one run.

One RL update (GRPO, one optimizer step over the batch) of a real LoRA policy, the 0.5B default with its
recipe's adapter, on recorded rollouts of the method's 0.5B recipe: Search-R1 as merged trajectories (the
retrieved <information> text inside the completion, masked) and M-ASK (many turns, prompts of ~1,000
tokens, completions of a few dozen). The variants add the changes in turn:

  before   fixed-size micro-batches in shuffled order, a scoring pass for π_old, every completion position
           (padding and environment text too) through the fp32 vocabulary projection
  +mask    only the loss mask's positions projected, the head's weight cast to fp32 once per pass
  +reuse   no scoring pass: the one optimizer step's own forward pass gives π_old
  +sorted  micro-batches of samples of similar length (what `searchteam train` now does)
  +budget  and a token budget per micro-batch (`--micro-batch-tokens`)
  +shared  each micro-batch packed into one row where every shared token prefix is computed once
           (`train.share_prefixes`), micro-batches bounded by distinct tokens (`--micro-batch-tokens`, or
           micro-batch size × the mean sample length)

Each variant updates a fresh copy of the same policy on the same samples; it prints update tokens/s
(prompt + completion tokens over the update's wall time), the ratio to the first variant, the peak memory
the update added (resident set, sampled every 20 ms), the largest difference of its gradient from the
first variant's relative to the gradient's largest entry (the variants compute the same gradient:
tests/rl/test_bench_update.py checks it on a tiny model), and the share of the machine's assumed peak
(`--peak-gflops`) that the computed tokens reach (a forward and backward of a frozen backbone with
recomputed activations: 6 × the decoder's parameters per token). `--samples 0` takes the whole recorded
batch (every group's samples, as one RL step updates on them).

    python benchmarks/bench_update.py --record search_r1   # once per method: writes benchmarks/data/
    python benchmarks/bench_update.py [--methods search_r1,mask] [--samples 8]
    python benchmarks/bench_update.py --dtypes bfloat16,float32 --variants +sorted --samples 2
    python benchmarks/bench_update.py --methods mask,search_r1,decor --samples 0 --variants +sorted,+shared
"""

from __future__ import annotations

import argparse
import copy
import ctypes
import gc
import gzip
import random
import resource
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import NamedTuple

import psutil
import torch

from searchteam.llm.prefix_tree import enable_tree_attention, pack
from searchteam.rl.batching import Slot, mini_batches
from searchteam.rl.config import TrainConfig
from searchteam.rl.experience import Sample, samples_from_episodes
from searchteam.rl.policy import Policy
from searchteam.rl.trainer import Trainer
from searchteam.rl.update import PolicyUpdater
from searchteam.types import Episode

DATA = Path(__file__).parent / "data"
MERGED = {"search_r1"}  # methods trained as one trajectory per continued message (Search-R1's way)
VARIANTS = ("before", "+mask", "+reuse", "+sorted", "+budget", "+shared")


def rollouts_path(method: str) -> Path:
    return DATA / f"rollouts-{method}-0.5b.jsonl.gz"


def record(method: str, questions: int) -> Path:
    """Roll out `questions` train questions with the method's 0.5B CPU recipe (its group size, engine and
    team settings; no warm start) and its reward scheme, and write the rewarded episodes."""
    from searchteam.methods import get_method
    from searchteam.train.build import build_trainer
    from searchteam.train.config import load_train_run_config

    recipe = get_method(method).recipe_path("cpu")
    settings = {"questions_per_step": questions, "warm_start": None, "train.dynamic_sampling": False}
    cfg = load_train_run_config(recipe, {"train.steps": 1}, settings)
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = build_trainer(cfg, Path(run_dir))
        episodes = trainer.rollout(0)
        trainer.reward(episodes)
    path = rollouts_path(method)
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as out:
        out.writelines(e.model_dump_json() + "\n" for e in episodes)
    return path


def load_samples(method: str, tokenizer, count: int, seed: int = 0) -> list[Sample]:
    """`count` training samples of the recorded rollouts (a seeded choice; 0: all of them), with seeded
    rewards."""
    with gzip.open(rollouts_path(method), "rt") as lines:
        episodes = [Episode.model_validate_json(line) for line in lines]
    samples = samples_from_episodes(episodes, tokenizer, merge_continuations=method in MERGED)
    if not count:
        return with_rewards(samples, seed)
    chosen = random.Random(seed).sample(samples, min(count, len(samples)))
    return with_rewards(chosen, seed)


def with_rewards(samples: list[Sample], seed: int = 0) -> list[Sample]:
    """`samples` with seeded random rewards, so that every group has advantages and a gradient."""
    rng = random.Random(seed)
    for s in samples:
        s.reward = rng.random()
    return samples


class ShuffledChunks(PolicyUpdater):
    """The micro-batching it replaced: fixed-size chunks in shuffled order, padded to the longest."""

    def schedule(
        self, samples, everyone, generator, mini_batch_size, micro_batch_size=None, replicated=False
    ):
        size = micro_batch_size or self.config.micro_batch_size
        steps = []
        for minibatch in mini_batches(everyone, mini_batch_size, generator):
            pools: dict[tuple[str, bool], list[Slot]] = defaultdict(list)
            for slot in minibatch:
                pools[slot.pool].append(slot)
            chunks = [pool[i : i + size] for pool in pools.values() for i in range(0, len(pool), size)]
            steps.append([[samples[s.index] for s in chunk] for chunk in chunks])
        return steps

    def forward_passes(self, samples):
        size = self.config.micro_batch_size
        return [samples[i : i + size] for i in range(0, len(samples), size)]


class ShuffledAndScored(ShuffledChunks):
    """And π_old from a scoring pass of its own."""

    def first_step_gives_old(self) -> bool:
        return False


# variant: (its updater, whether the loss mask reaches the projection)
UPDATERS = {
    "before": (ShuffledAndScored, False),
    "+mask": (ShuffledAndScored, True),
    "+reuse": (ShuffledChunks, True),
    "+sorted": (PolicyUpdater, True),
    "+budget": (PolicyUpdater, True),
    "+shared": (PolicyUpdater, True),
}


@contextmanager
def unmasked(policy: Policy) -> Iterator[None]:
    """The policy projecting every completion position, as before."""
    forward = policy.forward
    policy.forward = lambda *args, mask=None, **kwargs: forward(*args, **kwargs)  # type: ignore[method-assign]
    try:
        yield
    finally:
        del policy.forward


class PeakMemory:
    """The largest resident set above the one at entry, sampled every 20 ms while the block runs. Memory
    freed before entry is first handed back to the system (glibc's `malloc_trim`), so that what an earlier
    update left in the allocator's free lists does not hide this one's peak."""

    def __init__(self) -> None:
        self.process = psutil.Process()
        self.peak = 0

    def __enter__(self) -> PeakMemory:
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        self.start = self.process.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.sample, daemon=True)
        self.thread.start()
        return self

    def sample(self) -> None:
        while not self.done.wait(0.02):
            self.peak = max(self.peak, self.process.memory_info().rss - self.start)

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()


class Measured(NamedTuple):
    seconds: float
    peak_bytes: int  # the resident set the update added at its peak
    computed: int  # tokens through the decoder in training passes (padding included)
    grads: dict[str, torch.Tensor]


def update(policy: Policy, samples: list[Sample], config: TrainConfig, variant: str) -> Measured:
    """One `variant` update of `policy` on copies of `samples`."""
    samples = copy.deepcopy(samples)
    updater, masked = UPDATERS[variant]
    if variant not in ("+budget", "+shared"):
        config = config.model_copy(update={"micro_batch_tokens": None})
    if variant == "+shared":
        config = config.model_copy(update={"share_prefixes": True})
        enable_tree_attention(policy.model)
    grads: dict[str, torch.Tensor] = {}
    with tempfile.TemporaryDirectory() as run_dir:
        trainer = Trainer(policy, lambda step: [], lambda episodes: None, config, Path(run_dir))
        trainer.updater.__class__ = updater
        step_if_finite = trainer.updater.step_if_finite

        def keep_gradient(finite, grad_norm, optimizer) -> bool:
            named = dict(policy.named_parameters())
            grads.update({n: named[n].grad.clone() for n in policy._trainable if named[n].grad is not None})
            return step_if_finite(finite, grad_norm, optimizer)

        trainer.updater.step_if_finite = keep_gradient  # type: ignore[method-assign]
        collate, computed = trainer.updater.collate, [0]

        def counting(chunk: list[Sample]):
            batch = collate(chunk)
            computed[0] += batch.input_ids.numel() if torch.is_grad_enabled() else 0
            return batch

        trainer.updater.collate = counting  # type: ignore[method-assign]
        with nullcontext() if masked else unmasked(policy), PeakMemory() as memory:
            start = time.perf_counter()
            record = trainer.updater.rl_update(samples, 0)
            seconds = time.perf_counter() - start
    assert record["updates"] >= 1 and record["skipped_updates"] == 0, record
    return Measured(seconds, memory.peak, computed[0], grads)


def compare(
    make_policy: Callable[[], Policy],
    samples: list[Sample],
    config: TrainConfig,
    variants=VARIANTS[:4],
    budget: TrainConfig | None = None,
) -> Iterator[tuple[str, float, float]]:
    """Per variant, as it finishes: what `update` measured, and its gradient's largest difference from the
    first variant's, relative to the largest entry of that gradient. `budget`: the +budget variant's
    settings (default: `config`)."""
    reference: dict[str, torch.Tensor] = {}
    for variant in variants:
        settings = budget if variant == "+budget" and budget is not None else config
        measured = update(make_policy(), samples, settings, variant)
        reference = reference or measured.grads
        yield variant, measured, relative_diff(measured.grads, reference)


def decoder_parameters(policy: Policy) -> int:
    """The backbone's decoder parameters a token passes through (its embedding table is a lookup)."""
    decoder = policy.model.get_decoder()
    return sum(p.numel() for p in decoder.parameters()) - decoder.get_input_embeddings().weight.numel()


def relative_diff(grads: dict[str, torch.Tensor], reference: dict[str, torch.Tensor]) -> float:
    """The largest difference of `grads` from `reference`, relative to the largest entry of `reference`."""
    scale = max(max(g.abs().max().item() for g in reference.values()), 1e-30)
    return max((grads[n].float() - g.float()).abs().max().item() for n, g in reference.items()) / scale


def measure(
    base: Policy,
    method: str,
    config: TrainConfig,
    variants: list[str],
    count: int,
    peak_gflops: float,
    fp32: Policy | None = None,
) -> float:
    """Print one line per variant of `method`'s update; returns the last variant's tokens/s. `fp32`: the
    same policy in fp32, whose +sorted gradient each variant's is also compared with."""
    samples = load_samples(method, base.tokenizer, count)
    tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    trained = sum(s.num_trained_tokens for s in samples)
    completion = sum(len(s.completion_ids) for s in samples)
    distinct = pack([s.prompt_ids + s.completion_ids for s in samples]).input_ids.numel()
    print(
        f"\n{method}: {len(samples)} samples, {tokens} tokens ({distinct} distinct prefixes), "
        f"{completion} in completions, {trained} trained"
    )
    header = ["variant", "seconds", "s/sample", "tokens/s", "ratio", "computed", "of-peak", "peak-MB"]
    header += ["grad-diff", "vs-fp32"]
    print("{:<8} {:>8} {:>8} {:>8} {:>6} {:>8} {:>7} {:>7} {:>9} {:>9}".format(*header), flush=True)
    flops_per_token = 6 * decoder_parameters(base)
    exact = update(copy.deepcopy(fp32), samples, config, "+sorted").grads if fp32 is not None else None
    before = speed = 0.0
    for variant, m, diff in compare(lambda: copy.deepcopy(base), samples, config, variants):
        before, speed = before or m.seconds, tokens / m.seconds
        share = flops_per_token * m.computed / m.seconds / (peak_gflops * 1e9)
        print(
            f"{variant:<8} {m.seconds:8.1f} {m.seconds / len(samples):8.2f} {speed:8.1f} "
            f"{before / m.seconds:6.2f} {m.computed:8d} {share:7.1%} {m.peak_bytes / 2**20:7.0f} {diff:9.1e} "
            f"{relative_diff(m.grads, exact) if exact else float('nan'):9.1e}",
            flush=True,
        )
    return speed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--record", metavar="METHOD", help="record rollouts of METHOD's 0.5B recipe and stop")
    parser.add_argument("--questions", type=int, default=2, help="with --record: train questions")
    parser.add_argument("--methods", default="search_r1,mask")
    parser.add_argument("--model", default="qwen2.5-coder-0.5b")
    parser.add_argument("--dtypes", default="auto", help="e.g. bfloat16,float32 (auto: what the recipes get)")
    parser.add_argument("--samples", type=int, default=8, help="samples per update (0: the whole batch)")
    parser.add_argument(
        "--peak-gflops",
        type=float,
        default=332.0,
        help="the machine's assumed peak (default: 2 cores × 2.6 GHz × 64 bf16 FLOP per cycle, AVX512-BF16)",
    )
    parser.add_argument("--micro-batch-size", type=int, default=4)
    parser.add_argument("--micro-batch-tokens", type=int, default=None)
    parser.add_argument(
        "--mini-batch-size", type=int, default=None, help="samples per optimizer step (default: all)"
    )
    parser.add_argument("--gradient-checkpointing", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--variants", default=",".join(VARIANTS[:4]))
    parser.add_argument(
        "--fp32-reference", action="store_true", help="also compare each gradient with the fp32 policy's"
    )
    args = parser.parse_args()
    if args.record:
        print(f"wrote {record(args.record, args.questions)}")
        return
    from searchteam.llm.hf import pick_dtype
    from searchteam.rl.policy import load_policy

    variants = args.variants.split(",")
    config = TrainConfig(
        estimator="grpo",
        lora_r=8,
        lora_alpha=16,
        micro_batch_size=args.micro_batch_size,
        micro_batch_tokens=args.micro_batch_tokens,
        mini_batch_size=args.mini_batch_size,
        gradient_checkpointing=args.gradient_checkpointing,
        save_rollouts=False,
    )
    methods = args.methods.split(",")
    speeds: dict[str, list[float]] = defaultdict(list)
    dtypes = [str(pick_dtype(d, "cpu", training=True)).removeprefix("torch.") for d in args.dtypes.split(",")]
    for dtype in dtypes:
        base = load_policy(args.model, config, device="cpu", dtype=dtype)
        fp32 = load_policy(args.model, config, device="cpu", dtype="float32") if args.fp32_reference else None
        if fp32 is not None:
            fp32.load_trainable_state_dict(base.trainable_state_dict())  # the same initial adapter
        size = f"micro-batches of {args.micro_batch_size}, {torch.get_num_threads()} threads"
        print(f"\n{args.model} ({dtype}), LoRA r=8, {size}")
        for method in methods:
            speeds[method].append(
                measure(base, method, config, variants, args.samples, args.peak_gflops, fp32)
            )
        del base
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\nprocess peak RSS {peak:.0f} MB (run one variant per process to compare those)")
    for method in methods if len(dtypes) == 2 else []:
        ratio = speeds[method][1] / speeds[method][0]
        print(f"{method}: {variants[-1]}, tokens/s in {dtypes[1]} / in {dtypes[0]}: {ratio:.2f}")


if __name__ == "__main__":
    main()
