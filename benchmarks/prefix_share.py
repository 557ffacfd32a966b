"""How much of an update's forward pass is a repeated token prefix, per method: the measurement behind a
shared-prefix update (each prefix computed once under the same weights).

For the recorded rollouts of each method's 0.5B recipe (`bench_update.py --record METHOD`), the samples are
built as `searchteam train` builds them (merged trajectories for Search-R1). Under one set of weights (the
shared LoRA, or each role's with `lora_per_role`), the tokens a shared-prefix update must compute are the
nodes of the token trie of the samples' prompt + completion ids: every prefix once. The repeated share is
1 − trie nodes ÷ tokens, over the samples of one GRPO group (the question's) and over the whole batch; and
the mean share of a sample that it shares with a sample of the same role and another question.

    python benchmarks/prefix_share.py [--methods mask,search_r1]
"""

from __future__ import annotations

import argparse
import gzip
from collections import defaultdict
from collections.abc import Iterable

from bench_update import MERGED, rollouts_path
from transformers import AutoTokenizer

from searchteam.llm.models import resolve_model
from searchteam.llm.prefix_tree import common_prefix
from searchteam.methods import get_method
from searchteam.rl.experience import Sample, samples_from_episodes
from searchteam.train.config import load_train_run_config
from searchteam.types import Episode

MODEL = "qwen2.5-coder-0.5b"


def distinct_prefix_tokens(sequences: Iterable[list[int]]) -> int:
    """The nodes of the token trie of `sequences`: the tokens left when each shared prefix counts once."""
    root: dict[int, dict] = {}
    nodes = 0
    for ids in sequences:
        node = root
        for token in ids:
            child = node.get(token)
            if child is None:
                child = node[token] = {}
                nodes += 1
            node = child
    return nodes


def repeated_share(samples: list[Sample], key) -> tuple[int, int]:
    """(tokens, tokens left when prefixes are shared within each set of samples with the same `key`)."""
    sets: dict[object, list[list[int]]] = defaultdict(list)
    for s in samples:
        sets[key(s)].append(s.prompt_ids + s.completion_ids)
    total = sum(len(ids) for seqs in sets.values() for ids in seqs)
    return total, sum(distinct_prefix_tokens(seqs) for seqs in sets.values())


def across_questions(samples: list[Sample]) -> float:
    """The mean share of a sample that is a prefix it shares with a sample of the same role and another
    question (the system prompt and the role's instructions): what samples of different questions, such as
    a warm start's shuffled mini-batch, can share."""
    shares = []
    for s in samples:
        ids = s.prompt_ids + s.completion_ids
        others = [o for o in samples if o.role == s.role and o.group_id != s.group_id]
        if others:
            shared = max(common_prefix(ids, o.prompt_ids + o.completion_ids) for o in others)
            shares.append(shared / len(ids))
    return sum(shares) / len(shares) if shares else 0.0


def measure(method: str, tokenizer) -> dict[str, float]:
    with gzip.open(rollouts_path(method), "rt") as lines:
        episodes = [Episode.model_validate_json(line) for line in lines]
    samples = samples_from_episodes(episodes, tokenizer, merge_continuations=method in MERGED)
    per_role = load_train_run_config(get_method(method).recipe_path("cpu"), {}).train.lora_per_role

    def weights(s: Sample) -> str:
        return s.role if per_role else "shared"

    total, in_groups = repeated_share(samples, lambda s: (weights(s), s.group_id))
    _, in_batch = repeated_share(samples, weights)
    return {
        "across": across_questions(samples),
        "episodes": len(episodes),
        "groups": len({e.group_id or e.question.id for e in episodes}),
        "samples": len(samples),
        "tokens": total,
        "group": 1 - in_groups / total,
        "batch": 1 - in_batch / total,
        "per_role": per_role,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--methods", help="comma-separated; default: every method with recorded rollouts")
    args = parser.parse_args()
    from searchteam.methods import METHODS

    methods = args.methods.split(",") if args.methods else [m for m in METHODS if rollouts_path(m).exists()]
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(MODEL))
    columns = ("method", "episodes (groups)", "samples", "tokens", "repeated prefix within a group",
               "within the batch", "shared with another question")  # fmt: skip
    print("| " + " | ".join(columns) + " |")
    print("|" + "---|" * len(columns))
    for method in methods:
        m = measure(method, tokenizer)
        weights = ", one LoRA per role" if m["per_role"] else ""
        print(
            f"| {method}{weights} | {m['episodes']} ({m['groups']}) | {m['samples']} | {m['tokens']:,} | "
            f"{m['group']:.1%} | {m['batch']:.1%} | {m['across']:.1%} |"
        )


if __name__ == "__main__":
    main()
