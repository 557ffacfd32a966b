"""benchmarks/bench_update.py's variants (the update before the lean-update changes, then each change in
turn) compute the same gradient, on a tiny random Llama and samples like Search-R1's merged trajectories:
retrieved text masked inside completions of different lengths."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

from searchteam.rl.policy import build_policy
from tests.rl.test_update import config, rewarded_samples, tiny_model

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_update.py"


@pytest.fixture(scope="module")
def tokenizer(smollm_tokenizer):
    return smollm_tokenizer


def bench_module():
    spec = importlib.util.spec_from_file_location("bench_update", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_variant_computes_the_gradient_of_the_update_before(tokenizer):
    bench = bench_module()
    samples = rewarded_samples(tokenizer)
    for i, s in enumerate(samples):  # retrieved text inside the completion, of a different length each
        own = len(s.completion_ids)
        s.completion_ids = s.completion_ids + [42] * (5 * i) + s.completion_ids
        s.loss_mask = [1] * own + [0] * (5 * i) + [1] * own
    cfg = config(estimator="grpo", mini_batch_size=None, micro_batch_size=3, micro_batch_tokens=60)
    base = build_policy(tiny_model(tokenizer), tokenizer, cfg)
    rows = list(bench.compare(lambda: copy.deepcopy(base), samples, cfg, bench.VARIANTS))
    assert [variant for variant, _, _ in rows] == list(bench.VARIANTS)
    for variant, measured, relative_diff in rows:
        assert measured.seconds > 0 and measured.computed > 0
        assert relative_diff < 1e-5, variant  # fp32 reorderings only: a wrong gradient differs by ~1


def test_prefix_share_counts_each_shared_prefix_once(monkeypatch):
    """benchmarks/prefix_share.py: the tokens of a shared-prefix update are the nodes of the token trie, by
    hand: [1 2 3], [1 2 4], [1 2 3] and [5] hold 10 tokens and 5 distinct prefixes (1, 1 2, 1 2 3, 1 2 4, 5);
    under two sets of weights nothing is shared across them."""
    from searchteam.rl.experience import Sample

    monkeypatch.syspath_prepend(str(BENCH.parent))
    spec = importlib.util.spec_from_file_location("prefix_share", BENCH.parent / "prefix_share.py")
    share = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(share)
    assert share.distinct_prefix_tokens([[1, 2, 3], [1, 2, 4], [1, 2, 3], [5]]) == 5

    def sample(prompt, completion, role):
        return Sample(prompt, completion, [1] * len(completion), role, 0, "g", 0)

    samples = [sample([1, 2], [3], "a"), sample([1, 2], [4], "a"), sample([1, 2], [3], "b")]
    assert share.repeated_share(samples, lambda s: "shared") == (9, 4)
    assert share.repeated_share(samples, lambda s: s.role) == (9, 4 + 3)
