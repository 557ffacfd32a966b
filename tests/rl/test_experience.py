"""Samples from episodes with the real SmolLM2 tokenizer: prompt rendering, role filtering, frozen-model
turns, and the loss mask of environment text in Search-R1-style continued messages."""

from __future__ import annotations

import pytest

from searchteam.errors import ExperienceError
from searchteam.rl.experience import chat_render, collate, samples_from_episodes
from searchteam.types import Episode, Question, Turn

MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]
FIRST = "<search>capital of France</search>"
ENV = "\n\n<information>Doc 1: Paris is the capital and largest city of France.</information>\n\n"
SECOND = "<answer>Paris</answer>"


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def monolithic_episode(tokenizer) -> Episode:
    """Two Search-R1 turns inside one assistant message: the second continues after retrieved text."""
    first = Turn(
        role="agent",
        step=0,
        messages=MESSAGES,
        completion=FIRST,
        completion_token_ids=encode(tokenizer, FIRST),
    )
    continuation = FIRST + ENV
    second = Turn(
        role="agent",
        step=1,
        messages=MESSAGES,
        completion=SECOND,
        completion_token_ids=encode(tokenizer, SECOND),
        reward=1.0,
        continuation=continuation,
        continuation_chars=len(continuation),
        env_spans=[[len(FIRST), len(continuation)]],
    )
    return Episode(
        question=Question(id="q1", question=MESSAGES[0]["content"]), method="search_r1", turns=[first, second]
    )


def test_per_turn_samples_keep_env_text_in_the_prompt(tokenizer):
    samples = samples_from_episodes([monolithic_episode(tokenizer)], tokenizer)
    assert [s.turn_index for s in samples] == [0, 1]
    second = samples[1]
    prompt = tokenizer.decode(second.prompt_ids)
    assert prompt == chat_render(tokenizer)(monolithic_episode(tokenizer).turns[1])
    assert "Paris is the capital" in prompt
    assert tokenizer.decode(second.completion_ids) == SECOND
    assert second.loss_mask == [1] * len(second.completion_ids)
    assert (samples[0].reward, second.reward) == (0.0, 1.0)
    assert second.group_id == "q1" and second.episode_id == 0


def test_merged_trajectory_masks_environment_tokens(tokenizer):
    (sample,) = samples_from_episodes([monolithic_episode(tokenizer)], tokenizer, merge_continuations=True)
    trained = tokenizer.decode([t for t, m in zip(sample.completion_ids, sample.loss_mask, strict=True) if m])
    masked = tokenizer.decode(
        [t for t, m in zip(sample.completion_ids, sample.loss_mask, strict=True) if not m]
    )
    assert "Paris is the capital" in masked and "information" in masked
    assert "Paris is the capital" not in trained
    assert "capital of France" in trained and trained.endswith(SECOND)
    assert tokenizer.decode(sample.completion_ids) == FIRST + ENV + SECOND
    assert tokenizer.decode(sample.prompt_ids).endswith("<|im_start|>assistant\n")
    assert sample.reward == 1.0 and sample.turn_index == 1
    batch = collate([sample], pad_id=0)
    assert batch.loss_mask[0].tolist() == [float(m) for m in sample.loss_mask]


def test_frozen_models_and_unlisted_roles_are_skipped(tokenizer):
    turns = [
        Turn(role="search", messages=MESSAGES, completion="a", completion_token_ids=[64]),
        Turn(
            role="generator", messages=MESSAGES, completion="b", completion_token_ids=[65], model="generator"
        ),
        Turn(role="answer", messages=MESSAGES, completion="c", completion_token_ids=[66], parsed_ok=False),
        Turn(role="answer", messages=MESSAGES, completion="", completion_token_ids=[]),
    ]
    episode = Episode(question=Question(id="q", question="?"), method="qagent", turns=turns)
    assert [s.role for s in samples_from_episodes([episode], tokenizer)] == ["search", "answer"]
    only = samples_from_episodes([episode], tokenizer, roles=["search"])
    assert [s.role for s in only] == ["search"]


def test_recorded_ids_and_logprobs_are_used(tokenizer):
    turn = Turn(
        role="a",
        messages=MESSAGES,
        completion="x",
        prompt_token_ids=[5, 6, 7],
        completion_token_ids=[8, 9],
        logprobs=[-0.5, -1.0],
    )
    episode = Episode(question=Question(id="q", question="?"), method="m", turns=[turn], group_id="g7")
    (sample,) = samples_from_episodes([episode], tokenizer)
    assert sample.prompt_ids == [5, 6, 7] and sample.old_logprobs == [-0.5, -1.0] and sample.group_id == "g7"
    batch = collate([sample], pad_id=0)
    assert batch.target_index[0].tolist() == [2, 3]  # logits at positions 2 and 3 predict tokens 8 and 9
    assert batch.value_index.tolist() == [2]


def test_missing_continuation_text_is_an_actionable_error(tokenizer):
    turn = Turn(role="a", messages=MESSAGES, completion="x", completion_token_ids=[8], continuation_chars=12)
    episode = Episode(question=Question(id="q", question="?"), method="m", turns=[turn])
    with pytest.raises(ExperienceError, match="continuation"):
        samples_from_episodes([episode], tokenizer)
