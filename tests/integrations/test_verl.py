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
from tests.integrations.test_environment import hf_token_server, run_config  # noqa: E402

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


def instantiate(path, server, tokenizer, use_v1: bool, settings: dict | None = None, config=None):
    """The agent loop as verl's AgentLoopWorker makes it: hydra on an entry of the agent loop config file,
    in a trainer `config` (default: the parts the loop reads)."""
    config = config or OmegaConf.create(
        {
            "trainer": {"use_v1": use_v1},
            "algorithm": {"adv_estimator": "grpo"},
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


class TransferQueueStore:
    """TransferQueue's key-value calls over a dict, in this process: what verl's v1 agent loop worker puts
    and its trainer gets (rows stacked by verl's own TensorDict helper, as TransferQueue hands them back)."""

    def __init__(self) -> None:
        self.rows: dict[str, dict] = {}
        self.tags: dict[str, dict] = {}

    async def async_kv_batch_put(self, keys, partition_id, fields, tags=None):
        self.kv_batch_put(keys, partition_id, fields, tags)

    def kv_batch_put(self, keys, partition_id, fields, tags=None):
        from transfer_queue import KVBatchMeta

        for name, value in fields.items():
            if isinstance(value, torch.Tensor):
                column = value.unbind()
            elif hasattr(value, "tolist"):  # non-tensor data
                column = value.tolist()
            else:  # a nested TensorDict (empty multi_modal_inputs)
                column = [value[i] for i in range(len(keys))]
            for key, row in zip(keys, column, strict=True):
                self.rows.setdefault(key, {})[name] = row
        for key, tag in zip(keys, tags or [{}] * len(keys), strict=True):
            self.tags.setdefault(key, {}).update(tag)
        return KVBatchMeta(keys=list(keys), tags=[self.tags[k] for k in keys], partition_id=partition_id)

    def kv_batch_get(self, keys, partition_id, select_fields):
        return list_of_dict_to_tensordict(
            [{f: self.rows[k][f] for f in select_fields if f in self.rows[k]} for k in keys]
        )


def verl_config(overrides: list[str]):
    """verl's own ppo_trainer config, composed by hydra from verl's config folder."""
    from pathlib import Path

    from hydra import compose, initialize_config_dir
    from verl.trainer import main_ppo

    with initialize_config_dir(str(Path(main_ppo.__file__).parent / "config"), version_base=None):
        return compose("ppo_trainer", overrides=overrides)


def test_v1_trainer_runs_past_its_first_step_with_the_papers_credit(tmp_path, smollm_tokenizer, monkeypatch):
    """M-ASK (GAE on turn rewards) rollouts through searchteam's loop, verl's own row and tag building
    (`AgentLoopWorkerTQ._agent_loop_postprocess`), then searchteam's trainer's `_compute_advantage` (verl's
    own, then searchteam's credit) and verl's `_compute_metrics`, which reads every row's weight versions:
    each trained turn's advantage is searchteam's, and the step's metrics are computed."""
    import numpy as np
    import transfer_queue
    from transfer_queue import KVBatchMeta
    from verl.trainer.ppo.v1 import agent_loop_tq

    from searchteam.integrations import verl_trainer
    from searchteam.integrations.credit import CreditRow, row_credit
    from tests.integrations.test_credit import recipe_train, scripted_server

    store = TransferQueueStore()
    for name in ("async_kv_batch_put", "kv_batch_put", "kv_batch_get"):
        monkeypatch.setattr(transfer_queue, name, getattr(store, name))

    class VersionedServer:  # verl's LLMServerClient: a reply carries the weight version it ran on
        def __init__(self, seed):
            self.generate_ids = scripted_server(smollm_tokenizer, seed)

        async def generate(self, request_id, *, prompt_ids, sampling_params, **kwargs):
            sampling = SamplingParams(stop=tuple(sampling_params.get("stop", ())))
            ids, logprobs = await self.generate_ids(prompt_ids, sampling)
            versions = {"global_steps": 3, "min_global_steps": 3, "max_global_steps": 3}  # as its generate
            return TokenOutput(token_ids=ids, log_probs=logprobs, extra_fields=versions)

    path = run_config(tmp_path, "mask", max_turns=2, train=recipe_train("mask"))
    config = verl_config(
        ["trainer.use_v1=True", "trainer.v1.trainer_mode=searchteam", "algorithm.adv_estimator=gae",
         "actor_rollout_ref.rollout.n=3", "trainer.n_gpus_per_node=1",
         f"actor_rollout_ref.rollout.response_length={RESPONSE_LENGTH}"]
    )  # fmt: skip
    worker = agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__.__new__(
        agent_loop_tq.AgentLoopWorkerTQ.__ray_actor_class__
    )
    worker.processor, worker.reward_loop_worker_handles, worker.distillation_enabled = None, None, False
    settings = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": True}
    for q in range(2):
        for session in range(3):
            loop = instantiate(path, VersionedServer(10 * q + session), smollm_tokenizer, True, config=config)
            outputs = asyncio.run(loop.run(settings, **{**verl_row(tmp_path, "mask"), "uid": f"u{q}"}))
            asyncio.run(
                worker._agent_loop_postprocess(
                    outputs, False, uid=f"u{q}", session_id=session, global_steps=3
                )
            )

    keys = list(store.rows)
    batch = KVBatchMeta(keys=keys, tags=[store.tags[k] for k in keys], partition_id="train")
    values = [torch.linspace(-j / 10, 1, len(store.rows[k]["responses"])) for j, k in enumerate(keys)]
    old = [store.rows[k]["rollout_log_probs"] - 0.01 for k in keys]  # the actor's π_old
    computed = [{"values": v, "old_log_probs": o} for v, o in zip(values, old, strict=True)]
    store.kv_batch_put(keys, "train", list_of_dict_to_tensordict(computed))

    trainer = verl_trainer.SearchTeamTrainer.__new__(verl_trainer.SearchTeamTrainer)
    trainer.config, trainer.use_critic = config, True
    trainer.credit_config = loop.env.config.train
    trainer._rollout_moe_lb_metrics_accumulator = None
    trainer._get_n_gpus_for_throughput = lambda: 1  # its resource pool is Ray's
    metrics: dict = {}
    batch = trainer._compute_advantage(batch, metrics)
    timing = {"step": 2.0, "gen": 1.0, "update_actor": 0.5}
    trainer._compute_metrics(batch, metrics, timing, global_steps=4, epoch=0)

    extra = [store.rows[k]["extra_fields"] for k in keys]
    expected = row_credit(
        [
            CreditRow.of(k.rsplit("_", 2)[0], k.rsplit("_", 1)[0], e, float(v[0]))
            for k, e, v in zip(keys, extra, values, strict=True)
        ],
        trainer.credit_config,
    )
    for key, credit in zip(keys, expected, strict=True):
        advantages = store.rows[key]["advantages"]
        assert torch.allclose(advantages, torch.full_like(advantages, credit.advantage), atol=1e-6)
    assert len({round(c.advantage, 6) for c in expected}) > 2
    assert metrics["training/off_policy/trajectory_staleness/mean"] == 0  # versions 3, step 4
    assert np.isfinite(metrics["critic/advantages/mean"])
