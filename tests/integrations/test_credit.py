"""The papers' credit inside other RL frameworks (`integrations.credit`), and what the framework-free
environment hands them: each row's advantage equals what `searchteam train` computes on the same episodes,
a framework's failed request aborts the rollout instead of becoming a trained episode, what the frameworks
cannot train is refused, validation plays evaluation episodes, and rows carry recorded logprobs or none.

The episodes are played by each method's real team and reward scheme through `TeamEnvironment.play`, as the
verl loop and the SkyRL generator play them; the server answers with role-format replies drawn at random
(seeded), so that rewards vary within each group. verl's and SkyRL's own consuming code runs in
tests/integrations/test_verl.py and tests/integrations/test_skyrl.py (scripts/check_integrations.sh)."""

from __future__ import annotations

import asyncio
import math
import random
from importlib.resources import files

import pytest
import yaml

from searchteam.errors import ConfigError, FrameworkFault, TeamBug
from searchteam.integrations.credit import Credit, CreditRow, row_credit
from searchteam.integrations.environment import (
    TokenServerLLM,
    credit_fields,
    load_environment,
    recorded_logprobs,
)
from searchteam.rl.advantages import assign_advantages
from searchteam.rl.config import TrainConfig
from searchteam.rl.experience import Sample, samples_from_episodes
from tests.integrations.test_environment import ROW, hf_token_server, run_config

REPLIES = [  # for ROW's question, "Who wrote Dune?" (Frank Herbert)
    "<search>author of Dune</search>",
    "<think>look it up</think><search>Dune novel writer</search>",
    "<answer>Frank Herbert</answer>",
    "<answer>Isaac Asimov</answer>",
    "<answer>Herbert</answer>",
    "<predicted_answer>Frank Herbert</predicted_answer>",
    "<predicted_answer>Asimov</predicted_answer>",
    "<evidence>Dune was written by Frank Herbert.</evidence>",
    "<think>the author</think><search>Dune author</search>",
    "<think>enough</think><search>None</search>",
    "<think>known</think><answer>Frank Herbert</answer>",
    "<think>a guess</think><answer>Isaac Asimov</answer>",
    "<think>Doc 1 names him</think><filter>Frank Herbert wrote Dune.</filter>",
    "<think>nothing</think><filter>Dune is a novel.</filter>",
    "<end>",
    "<stop>",
]


def scripted_server(tokenizer, seed: int):
    """A token-in, token-out server that answers each request with a reply drawn at random, among those that
    end in one of the request's stop strings where any does."""
    rng = random.Random(seed)

    async def generate(prompt_ids, sampling):
        fitting = [r for r in REPLIES if any(r.endswith(stop) for stop in sampling.stop)]
        ids = tokenizer(rng.choice(fitting or REPLIES), add_special_tokens=False)["input_ids"]
        return ids + [tokenizer.eos_token_id], [-0.5] * (len(ids) + 1)

    return generate


def recipe_train(method: str) -> dict:
    """The `train` section of the method's SmolLM2 recipe, with one shared adapter (what frameworks train)."""
    path = files("searchteam") / "methods" / method / "recipes" / "smollm135m-cpu.yaml"
    train = yaml.safe_load(path.read_text())["train"]
    for key in ("lora_per_role", "role_lr"):
        train.pop(key, None)
    return train


def play_groups(env, tokenizer, questions: int = 3, group_size: int = 4):
    """`group_size` rollouts of each of `questions` questions, each as a framework plays one (its own session
    and server), grouped by the prompt uid."""
    episodes = []
    for q in range(questions):
        question = env.question({**ROW, "method": env.method, "question_id": f"q{q}"})
        for g in range(group_size):
            llm = TokenServerLLM(scripted_server(tokenizer, seed=100 * q + g), tokenizer)
            episodes.append(asyncio.run(env.play(question, llm, group=f"uid-{q}")))
    return episodes


@pytest.mark.parametrize("method", ["mask", "dac", "decor"])
def test_each_rows_credit_equals_what_searchteam_train_computes(tmp_path, smollm_tokenizer, method):
    env = load_environment(run_config(tmp_path, method, max_turns=2, train=recipe_train(method)))
    episodes = play_groups(env, smollm_tokenizer)
    config = env.config.train

    trained = samples_from_episodes(episodes, smollm_tokenizer, roles=config.roles or None)  # train's
    assign_advantages(trained, config)
    rows = [  # the framework's rows: one per trained turn of each rollout, with its extra fields
        CreditRow.of(episode.group_id, f"{episode.group_id}_{e}", credit_fields(episode, sample))
        for e, episode in enumerate(episodes)
        for sample in env.samples(episode, smollm_tokenizer)
    ]
    credit = row_credit(rows, config)

    assert [c.advantage for c in credit] == pytest.approx([s.advantage for s in trained], abs=1e-12)
    assert [c.returns for c in credit] == pytest.approx([s.returns for s in trained], abs=1e-12)
    assert len({round(c.advantage, 9) for c in credit}) > 2  # rewards varied: a test that can fail


def test_grpo_over_trajectories_by_hand_and_placeholders_out_of_the_groups():
    """Two questions: q1's rollouts score trajectory rewards 1 (two turns of 1), 0 and 0.5 (turns 1 and 0);
    q2 has one scored rollout and one placeholder (no turn), so no peer to compare with."""
    rows = [
        CreditRow("q1", "a", "plan", 0, 1.0),
        CreditRow("q1", "a", "answer", 1, 1.0),
        CreditRow("q1", "b", "answer", 0, 0.0),
        CreditRow("q1", "c", "plan", 0, 1.0),
        CreditRow("q1", "c", "answer", 1, 0.0),
        CreditRow("q2", "d", "answer", 0, 1.0),
        CreditRow("q2", "e", "", -1, 0.0, trained=False),
    ]
    credit = row_credit(rows, TrainConfig(estimator="grpo", adv_eps=1e-6))
    # R = (1, 0, 0.5): mean 0.5, sample std 0.5, so Â = (1, -1, 0) (up to ε)
    a, b, c = 0.5 / (0.5 + 1e-6), -0.5 / (0.5 + 1e-6), 0.0
    assert [x.advantage for x in credit] == pytest.approx([a, a, b, c, c, 0.0, 0.0], abs=1e-12)
    assert credit[-1] == Credit(0.0, 0.0)


def test_turn_level_gae_by_hand():
    """γ = λ = 1, values (0.2, 0.5), rewards (0, 1): δ = (0 + 0.5 − 0.2, 1 − 0.5) = (0.3, 0.5),
    Â = (0.8, 0.5), R = Â + V = (1.0, 1.0). The rows come in any order; the turn index orders them."""
    rows = [
        CreditRow("q", "a", "search", 1, 1.0, value=0.5),
        CreditRow("q", "a", "search", 0, 0.0, value=0.2),
    ]
    credit = row_credit(rows, TrainConfig(estimator="gae", gamma=1.0, lam=1.0))
    assert [x.advantage for x in credit] == pytest.approx([0.5, 0.8])
    assert [x.returns for x in credit] == pytest.approx([1.0, 1.0])


def test_a_failed_server_request_aborts_the_rollout_instead_of_training_it(tmp_path, smollm_tokenizer):
    env = load_environment(run_config(tmp_path, "naive_rag"))

    async def dead_server(prompt_ids, sampling):
        raise ConnectionResetError("the actor died")

    question = env.question({**ROW, "method": "naive_rag"})
    with pytest.raises(FrameworkFault, match="ConnectionResetError: the actor died"):
        asyncio.run(env.play(question, TokenServerLLM(dead_server, smollm_tokenizer, name="verl"), group="g"))


def test_a_team_bug_that_repeats_stops_the_frameworks_rollouts(tmp_path, smollm_tokenizer, monkeypatch):
    """A bug in the team's own code fails its episode (trained as nothing); the second time, `TeamBug` leaves
    the loop with its traceback, so the framework's run stops instead of training broken episodes."""
    env = load_environment(run_config(tmp_path, "naive_rag"))

    async def broken_run(q, ctx):
        raise KeyError("passages")

    monkeypatch.setattr(env.team, "run", broken_run)
    server = TokenServerLLM(scripted_server(smollm_tokenizer, seed=0), smollm_tokenizer, name="verl")
    question = env.question({**ROW, "method": "naive_rag"})
    first = asyncio.run(env.play(question, server, group="g"))
    assert first.error_kind == "bug" and first.reward == 0.0
    with pytest.raises(TeamBug, match="in 2 of the 2 episodes so far: KeyError: 'passages'"):
        asyncio.run(env.play(question, server, group="g"))


@pytest.mark.parametrize(
    ("fields", "setting"),
    [
        ({"train": {"lora_per_role": True, "roles": ["searcher", "generator"]}}, "train.lora_per_role"),
        ({"train": {"sft_coef": 0.05}}, "train.sft_coef"),
        ({"train": {"estimator": "gae", "critic": "head"}}, "train.critic: head"),
        ({"warm_start": {"rounds": 1}}, "warm_start"),
        ({"init_from": "qwen2.5-coder-0.5b-dac"}, "init_from"),
    ],
)
def test_what_verl_and_skyrl_cannot_train_is_refused_in_one_line(tmp_path, fields, setting):
    with pytest.raises(ConfigError, match=rf"^{setting}: .*`searchteam train`") as refused:
        load_environment(run_config(tmp_path, "dac", **fields))
    assert "\n" not in str(refused.value)


def test_validation_plays_evaluation_episodes(tmp_path, smollm_tokenizer):
    """DAC runs its generator on the partial evidence after each search in training only (its difference
    rewards); a validation rollout plays the episode `searchteam eval` plays."""
    env = load_environment(run_config(tmp_path, "dac", max_turns=2))
    question = env.question({**ROW, "method": "dac"})

    async def search_then_answer(prompt_ids, sampling):
        searching = "</search>" in sampling.stop
        reply = "<search>Dune author</search>" if searching else "<answer>Frank Herbert</answer>"
        return smollm_tokenizer(reply, add_special_tokens=False)["input_ids"], None

    def roles(training: bool) -> list[str]:
        llm = TokenServerLLM(search_then_answer, smollm_tokenizer)
        return [t.role for t in asyncio.run(env.play(question, llm, training=training)).turns]

    assert len(roles(training=True)) > len(roles(training=False))


def test_rows_carry_recorded_logprobs_or_leave_the_loss():
    known = [-0.1, math.nan, math.nan]  # the engine's, then retrieved text (masked), then a trained unknown
    sample = Sample([1], [5, 6, 7], [1, 0, 1], "agent", 0, "q", 0, rollout_logprobs=known)
    assert recorded_logprobs(sample, requested=True) == ([1, 0, 0], [-0.1, 0.0, 0.0])
    assert recorded_logprobs(sample, requested=False) == ([1, 0, 1], None)
    placeholder = Sample([1], [2], [0], "", 0, "q", -1)
    assert recorded_logprobs(placeholder, requested=True) == ([0], [0.0])


def test_a_merged_trajectory_records_the_logprobs_of_its_earlier_turns(tmp_path, default_llm):
    """Search-R1 as one trajectory: each earlier completion's tokens carry the engine's logprobs (they
    re-tokenize to the ids it generated), so a framework's rollout correction reads what was sampled."""
    server = hf_token_server(default_llm)

    async def with_logprobs(prompt_ids, sampling):
        ids, _ = await server(prompt_ids, sampling)
        return ids, [-0.25] * len(ids)

    path = run_config(
        tmp_path, "search_r1", max_turns=2, max_new_tokens_per_role={"agent": 32},
        train={"merge_continuations": True},
    )  # fmt: skip
    env = load_environment(path)
    question = env.question({**ROW, "method": "search_r1"})
    llm = TokenServerLLM(with_logprobs, default_llm.tokenizer)
    episode = asyncio.run(env.play(question, llm, group="g"))
    (sample,) = env.samples(episode, default_llm.tokenizer)

    assert len(episode.turns) > 1 and episode.turns[-1].env_spans  # the greedy model searched
    mask, logprobs = recorded_logprobs(sample, requested=True)
    trained = [lp for lp, m in zip(logprobs, sample.loss_mask, strict=True) if m]
    assert trained == [-0.25] * len(trained) and mask == sample.loss_mask  # every trained token recorded
