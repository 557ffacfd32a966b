"""searchteam's verl agent loop inside verl's own classes: instantiated by hydra from an agent loop config as
verl's worker does, fed a row of `export-questions --format verl`, generating through a server-manager
stand-in backed by the real 135M model, its outputs stacked by verl's own TensorDict helper as its v1
trainer stacks them. verl is heavy (about 2 GB): scripts/check_integrations.sh builds its environment and
runs this file; without verl it skips."""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq
import pytest

agent_loop = pytest.importorskip("verl.experimental.agent_loop.agent_loop")

import hydra  # noqa: E402
import torch  # noqa: E402
from hydra.errors import InstantiationException  # noqa: E402
from omegaconf import OmegaConf  # noqa: E402
from verl.utils.tensordict_utils import list_of_dict_to_tensordict  # noqa: E402
from verl.workers.rollout.replica import TokenOutput  # noqa: E402

from searchteam.errors import ConfigError  # noqa: E402
from searchteam.integrations.questions import write_questions  # noqa: E402
from searchteam.llm.base import SamplingParams  # noqa: E402
from searchteam.types import Question  # noqa: E402
from tests.test_integrations import hf_token_server, run_config  # noqa: E402

RESPONSE_LENGTH = 64
entry_point = "searchteam.integrations.verl.SearchTeamAgentLoop"


class ModelServer:
    """verl's LLMServerClient as the agent loop calls it, over the real 135M model."""

    def __init__(self, llm) -> None:
        self.generate_ids = hf_token_server(llm)
        self.requests: list[tuple[str, dict]] = []
        self.seen: list[tuple[list[int], list[int]]] = []  # (prompt ids, returned ids) of each request

    async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
        self.requests.append((request_id, dict(sampling_params)))
        sampling = SamplingParams(max_new_tokens=sampling_params["max_tokens"])
        ids, _ = await self.generate_ids(prompt_ids, sampling)
        self.seen.append((list(prompt_ids), ids))
        return TokenOutput(token_ids=ids, log_probs=[-1.0] * len(ids), stop_reason="completed")


def instantiate(path, server, tokenizer, use_v1: bool, settings: dict | None = None):
    """The agent loop as verl's AgentLoopWorker makes it: hydra on an entry of the agent loop config file."""
    config = OmegaConf.create(
        {
            "trainer": {"use_v1": use_v1},
            "actor_rollout_ref": {"rollout": {"prompt_length": 4096, "response_length": RESPONSE_LENGTH}},
            "data": {},
        }
    )
    entry = OmegaConf.create({"_target_": entry_point, "run_config": str(path), "settings": settings or {}})
    return hydra.utils.instantiate(
        config=entry,
        trainer_config=agent_loop.DictConfigWrap(config=config),
        server_manager=server,
        tokenizer=tokenizer,
        processor=None,
        dataset_cls=None,
        data_config=agent_loop.DictConfigWrap(config.data),
    )


def verl_row(tmp_path, method: str) -> dict:
    """A row of `export-questions --format verl`, as verl's dataset hands it to the agent loop."""
    q = Question(id="q1", question="Who wrote Dune?", golden_answers=["Frank Herbert"], dataset="hotpotqa")
    row = pq.read_table(write_questions([q], method, "verl", "train", tmp_path / method)).to_pylist()[0]
    row.pop("agent_name")  # verl's worker takes it to pick the loop
    return {**row, "raw_prompt": row["prompt"], "uid": "uid-1", "index": 0}


def test_v1_gets_one_output_per_trained_turn_in_verls_own_classes(tmp_path, default_llm):
    server = ModelServer(default_llm)
    short = {role: 12 for role in ("plan", "search", "summary", "update", "answer")}
    settings = {"max_new_tokens_per_role": short, "datasets": ["hotpotqa"]}  # as a YAML entry gives them
    loop = instantiate(run_config(tmp_path, "mask"), server, default_llm.tokenizer, True, settings)
    assert loop.env.config.max_new_tokens_per_role == short and loop.env.config.datasets == ["hotpotqa"]
    outputs = asyncio.run(
        loop.run({"temperature": 1.0, "top_p": 1.0, "logprobs": True}, **verl_row(tmp_path, "mask"))
    )

    assert agent_loop._agent_loop_registry["searchteam"]["_target_"] == entry_point  # also registered by name
    assert len(outputs) >= 3 and all(isinstance(o, agent_loop.AgentLoopOutput) for o in outputs)
    assert [o.extra_fields["role"] for o in outputs][-1] == "answer"
    assert len({o.reward_score for o in outputs}) == 1  # the episode's, as verl's v1 trainer spreads it
    assert len(server.requests) == len(outputs) and len({r for r, _ in server.requests}) == 1  # one session
    assert all(p["max_tokens"] <= RESPONSE_LENGTH and p["temperature"] == 1.0 for _, p in server.requests)
    for output, (prompt, returned) in zip(outputs, server.seen, strict=True):  # trained on what it saw
        assert output.prompt_ids == prompt and returned[: len(output.response_ids)] == output.response_ids
        assert output.response_mask == [1] * len(output.response_ids)
        assert output.response_logprobs == [-1.0] * len(output.response_ids)
    # stacked as verl's v1 trainer puts them into its TransferQueue
    fields = [{**o.as_dict(), "loss_mask": torch.tensor(o.response_mask)} for o in outputs]
    stacked = list_of_dict_to_tensordict(fields)
    assert stacked.batch_size[0] == len(outputs)


def test_the_legacy_trainer_gets_search_r1_as_one_masked_trajectory(tmp_path, default_llm):
    path = run_config(
        tmp_path, "search_r1", max_turns=2, max_new_tokens=48, train={"merge_continuations": True}
    )
    loop = instantiate(path, ModelServer(default_llm), default_llm.tokenizer, False)
    output = asyncio.run(loop.run({"temperature": 1.0, "logprobs": True}, **verl_row(tmp_path, "search_r1")))

    assert isinstance(output, agent_loop.AgentLoopOutput)
    assert len(output.response_ids) == len(output.response_mask) <= RESPONSE_LENGTH
    assert output.as_dict()["responses"].shape == output.as_dict()["response_mask"].shape


def test_the_legacy_trainer_refuses_a_team_of_several_roles(tmp_path, default_llm):
    with pytest.raises(InstantiationException, match="trainer.use_v1=True") as refused:
        instantiate(run_config(tmp_path, "mask"), ModelServer(default_llm), default_llm.tokenizer, False)
    assert isinstance(refused.value.__cause__, ConfigError)  # hydra wraps the one line it raised
