"""The framework-free core of the verl and SkyRL integrations (`integrations.environment`): a real team
(the 135M model generating token-in, token-out as a framework's server would, the shipped corpus, BM25)
plays an episode, its method's reward scheme scores it, and it becomes one sample per trained turn whose
ids are the ones the server saw. The frameworks' own classes are checked by scripts/check_integrations.sh."""

from __future__ import annotations

import asyncio
import importlib
from pathlib import Path

import pytest
import torch
import yaml

from searchteam.errors import ConfigError, MissingExtra
from searchteam.extras import has
from searchteam.integrations.environment import TokenServerLLM, load_environment, server_request
from searchteam.llm.base import GenerationRequest, SamplingParams, render_prompt_ids
from searchteam.rl.experience import env_token_mask


def hf_token_server(llm):
    """A token-in, token-out server over the real 135M model (greedy), as verl's and SkyRL's engines are."""

    async def generate(prompt_ids: list[int], sampling: SamplingParams):
        ids = torch.tensor([prompt_ids])
        with torch.no_grad():
            out = llm.model.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=sampling.max_new_tokens,
                do_sample=False, pad_token_id=llm.tokenizer.eos_token_id,
            )  # fmt: skip
        return out[0, len(prompt_ids) :].tolist(), None

    return generate


def run_config(tmp: Path, method: str, **fields) -> Path:
    path = tmp / f"{method}.yaml"
    config = {"method": method, "model": "smollm2-135m", "max_new_tokens": 24, "max_turns": 1, **fields}
    path.write_text(yaml.safe_dump(config))
    return path


ROW = {"method": "", "question_id": "q1", "dataset": "hotpotqa", "question": "Who wrote Dune?",
       "golden_answers": ["Frank Herbert"]}  # fmt: skip


def play(env, llm, method: str):
    question = env.question({**ROW, "method": method})
    return asyncio.run(env.play(question, TokenServerLLM(hf_token_server(llm), llm.tokenizer), group="g"))


def test_each_trained_turn_is_a_sample_with_the_ids_the_server_saw(tmp_path, default_llm):
    short = {role: 12 for role in ("plan", "search", "summary", "update", "answer")}
    env = load_environment(run_config(tmp_path, "mask", max_new_tokens_per_role=short))
    episode = play(env, default_llm, "mask")
    samples = env.samples(episode, default_llm.tokenizer)

    assert episode.error is None and episode.reward is not None and episode.group_id == "g"
    trained = [t for t in episode.turns if t.model == "policy" and not t.frozen]
    assert len(trained) >= 3 and len(samples) == len(trained)  # M-ASK: planning, search, ..., answer
    for sample, turn in zip(samples, trained, strict=True):
        request = GenerationRequest(turn.messages, continuation=turn.continuation or "")
        assert sample.prompt_ids == render_prompt_ids(default_llm.tokenizer, request)
        assert sample.completion_ids == turn.completion_token_ids and sample.role == turn.role
        assert sample.loss_mask == [1] * len(sample.completion_ids)
        assert sample.reward == turn.reward


def test_a_continued_agent_becomes_one_trajectory_with_retrieved_text_masked(tmp_path, default_llm):
    path = run_config(
        tmp_path,
        "search_r1",
        max_turns=2,
        max_new_tokens_per_role={"agent": 32},
        train={"merge_continuations": True},
    )
    env = load_environment(path)
    episode = play(env, default_llm, "search_r1")
    (sample,) = env.samples(episode, default_llm.tokenizer)

    last = episode.turns[-1]
    whole = default_llm.tokenizer.decode(sample.prompt_ids + sample.completion_ids)
    assert whole.endswith((last.continuation or "") + last.completion)
    assert last.env_spans  # the (greedy) model searched: the passages it read are in it, out of the loss
    enc = default_llm.tokenizer(last.continuation, add_special_tokens=False, return_offsets_mapping=True)
    assert sample.loss_mask[: len(enc["input_ids"])] == env_token_mask(enc["offset_mapping"], last.env_spans)
    assert 0 in sample.loss_mask


def test_completions_are_cut_at_the_roles_stop_string_as_every_backend_cuts_them(smollm_tokenizer):
    tail = smollm_tokenizer("<search>dune author</search> and then more text", add_special_tokens=False)

    async def server(prompt_ids, sampling):
        return tail["input_ids"], [-0.5] * len(tail["input_ids"])

    llm = TokenServerLLM(server, smollm_tokenizer)
    request = GenerationRequest([{"role": "user", "content": "q"}], SamplingParams(stop=("</search>",)))
    completion = asyncio.run(llm.agenerate(request))

    assert completion.text == "<search>dune author</search>" and completion.finish_reason == "stop"
    assert smollm_tokenizer.decode(completion.token_ids) == completion.text
    assert completion.logprobs == [-0.5] * len(completion.token_ids)
    assert completion.prompt_token_ids == render_prompt_ids(smollm_tokenizer, request)


def test_the_server_request_keeps_the_frameworks_sampling_and_the_roles_limits():
    params = {"temperature": 0.9, "top_p": 0.95, "logprobs": True}
    role = SamplingParams(max_new_tokens=256, temperature=0.0, stop=("</answer>",))
    assert server_request(params, role, max_tokens=128) == {
        **params,
        "max_tokens": 128,
        "stop": ["</answer>"],
    }
    assert server_request(params, SamplingParams(max_new_tokens=64)) == {**params, "max_tokens": 64}


def test_what_a_single_model_framework_cannot_run_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="serve only the policy"):
        load_environment(run_config(tmp_path, "qagent", role_models={"generator": "smollm2-135m"}))
    env = load_environment(run_config(tmp_path, "naive_rag"))
    with pytest.raises(ConfigError, match="--method naive_rag"):
        env.question({**ROW, "method": "mask"})
    with pytest.raises(ConfigError, match="export-questions"):
        env.question({"method": "naive_rag"})


@pytest.mark.parametrize("framework", ["verl", "skyrl"])
def test_a_missing_framework_is_a_one_line_error_naming_its_extra(framework):
    if has(framework):
        pytest.skip(f"{framework} is installed here")
    with pytest.raises(MissingExtra, match=rf"pip install 'searchteam\[{framework}\]'"):
        importlib.import_module(f"searchteam.integrations.{framework}")


def test_an_episode_that_trained_no_turn_becomes_one_fully_masked_sample(tmp_path, smollm_tokenizer):
    from searchteam.types import Episode

    env = load_environment(run_config(tmp_path, "naive_rag"))
    episode = Episode(question=env.question({**ROW, "method": "naive_rag"}), method="naive_rag")
    sample = env.placeholder(episode, smollm_tokenizer)
    request = GenerationRequest([{"role": "user", "content": "Who wrote Dune?"}])
    assert sample.prompt_ids == render_prompt_ids(smollm_tokenizer, request)
    assert sample.completion_ids == [smollm_tokenizer.eos_token_id] and sample.loss_mask == [0]
    assert sample.group_id == "q1" and sample.turn_index == -1
