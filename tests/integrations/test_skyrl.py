"""searchteam's SkyRL generator checked by SkyRL itself: a batch of rows of `export-questions --format skyrl`
goes through the generator, whose inference engine client stand-in generates with the real 135M model, and
SkyRL's own `validate_generator_output(..., step_wise=True)` accepts what comes back. skyrl 0.3.0 pins its
own transformers and peft: scripts/check_integrations.sh builds its environment and runs this file; without
skyrl it skips."""

from __future__ import annotations

import asyncio

import pyarrow.parquet as pq
import pytest

pytest.importorskip("skyrl")

from searchteam.integrations.questions import write_questions  # noqa: E402
from searchteam.integrations.skyrl import SearchTeamGenerator, generators  # noqa: E402
from searchteam.llm.base import SamplingParams  # noqa: E402
from searchteam.types import Question  # noqa: E402
from tests.integrations.test_credit import scripted_server  # noqa: E402
from tests.integrations.test_environment import hf_token_server, run_config  # noqa: E402


class EngineClient:
    """SkyRL's InferenceEngineClient as a generator calls it, over the real 135M model."""

    def __init__(self, llm) -> None:
        self.generate_ids = hf_token_server(llm)
        self.seen: list[tuple[list[int], list[int]]] = []

    async def generate(self, engine_input, model=None):
        (prompt,) = engine_input["prompt_token_ids"]
        sampling = SamplingParams(max_new_tokens=engine_input["sampling_params"]["max_tokens"])
        ids, _ = await self.generate_ids(prompt, sampling)
        self.seen.append((list(prompt), ids))
        return {
            "responses": [""],
            "response_ids": [ids],
            "stop_reasons": ["stop"],
            "response_logprobs": [[-1.0] * len(ids)],
        }


def skyrl_batch(tmp_path, method: str, questions: list[Question]) -> dict:
    """A GeneratorInput as SkyRL's trainer builds it from the rows (two samples of each question)."""
    rows = pq.read_table(write_questions(questions, method, "skyrl", "train", tmp_path / method)).to_pylist()
    repeated = [(row, r) for row in rows for r in range(2)]
    return {
        "prompts": [row["prompt"] for row, _ in repeated],
        "env_classes": [row["env_class"] for row, _ in repeated],
        "env_extras": [
            {"reward_spec": row["reward_spec"], "extra_info": row["extra_info"]} for row, _ in repeated
        ],
        "sampling_params": {"temperature": 1.0, "logprobs": 0},
        "trajectory_ids": [
            generators.TrajectoryID(row["extra_info"]["question_id"], r) for row, r in repeated
        ],
        "batch_metadata": generators.BatchMetadata(global_step=1, training_phase="train"),
    }


def test_step_wise_output_passes_skyrls_own_validator(tmp_path, default_llm):
    from skyrl.train.utils.trainer_utils import validate_generator_output

    questions = [
        Question(id="q1", question="Who wrote Dune?", golden_answers=["Frank Herbert"], dataset="hotpotqa"),
        Question(id="q2", question="What is the capital of France?", golden_answers=["Paris"], dataset="nq"),
    ]
    client = EngineClient(default_llm)
    generator = SearchTeamGenerator(
        str(run_config(tmp_path, "jade", max_new_tokens=16)), client, default_llm.tokenizer, "policy"
    )
    batch = skyrl_batch(tmp_path, "jade", questions)
    output = asyncio.run(generator.generate(batch))

    validate_generator_output(len(batch["prompts"]), output, step_wise=True)
    assert sum(output["is_last_step"]) == len(batch["prompts"]) and len(output["response_ids"]) > len(
        batch["prompts"]
    )
    seen = sorted(tuple(p) for p, _ in client.seen)  # the episodes ran concurrently
    assert seen == sorted(tuple(p) for p in output["prompt_token_ids"])  # trained on the prompts it saw
    assert all(
        len(lp) == len(r) for lp, r in zip(output["rollout_logprobs"], output["response_ids"], strict=True)
    )
    firsts = [i for i, t in enumerate(output["trajectory_ids"]) if i == 0 or output["is_last_step"][i - 1]]
    assert [output["trajectory_ids"][i].to_string() for i in firsts] == [
        t.to_string() for t in batch["trajectory_ids"]
    ]


class LoraEngineClient:
    """SkyRL's RemoteInferenceClient as it answers under LoRA: a request without the policy's model name is
    refused (`_resolve_model`), and the scripted replies come with logprobs."""

    def __init__(self, tokenizer) -> None:
        self.server = scripted_server(tokenizer, seed=3)

    async def generate(self, engine_input, model=None):
        if model is None:
            raise ValueError("model is required when LoRA adapters are served")
        (prompt,) = engine_input["prompt_token_ids"]
        sampling = SamplingParams(stop=tuple(engine_input["sampling_params"].get("stop", ())))
        ids, logprobs = await self.server(prompt, sampling)
        return {
            "responses": [""],
            "response_ids": [ids],
            "stop_reasons": ["stop"],
            "response_logprobs": [logprobs],
        }


def skyrl_trainer(credit_config, tokenizer, overrides: list[str], dp_size: int = 4):
    """SkyRL's trainer with searchteam's credit, without its Ray workers: only the post-rollout methods run
    (`dp_size` rows per data-parallel group, so SkyRL pads the batch)."""
    from types import SimpleNamespace

    from skyrl.train.config import SkyRLTrainConfig

    from searchteam.integrations.skyrl_trainer import SearchTeamTrainer

    trainer = SearchTeamTrainer.__new__(SearchTeamTrainer)
    trainer.cfg = SkyRLTrainConfig.from_cli_overrides(
        [
            "generator.step_wise_trajectories=true",
            "trainer.algorithm.advantage_estimator=searchteam",
            "generator.n_samples_per_prompt=2",  # skyrl_batch's two samples of each question
            "trainer.train_batch_size=2",
            "trainer.policy_mini_batch_size=1",
            "trainer.critic_mini_batch_size=1",
            *overrides,
        ]
    )
    trainer.all_metrics, trainer.credit_config, trainer.tokenizer = {}, credit_config, tokenizer
    trainer.dispatch = SimpleNamespace(get_lcm_dp_size=lambda: dp_size)
    return trainer


def test_skyrls_post_rollout_code_trains_each_turn_with_the_papers_credit(tmp_path):
    """M-ASK through SkyRL's own postprocess_generator_output, convert_to_training_input (padded to the
    data-parallel size) and the trainer's advantages: each row's advantage is searchteam's, GAE on the
    critic's values; every trained turn keeps its own credit (SkyRL's own step-wise estimators would give
    each the last step's)."""
    import torch
    from transformers import AutoTokenizer

    from searchteam.integrations.credit import CreditRow, row_credit
    from searchteam.llm.models import resolve_model
    from tests.integrations.test_credit import recipe_train

    smollm_tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    smollm_tokenizer.pad_token = smollm_tokenizer.eos_token  # as SkyRL's own tokenizer setup sets it

    config = run_config(tmp_path, "mask", max_turns=2, train=recipe_train("mask"))
    generator = SearchTeamGenerator(str(config), LoraEngineClient(smollm_tokenizer), smollm_tokenizer, "lora")
    questions = [
        Question(id=f"q{i}", question="Who wrote Dune?", golden_answers=["Frank Herbert"], dataset="nq")
        for i in range(2)
    ]
    batch = skyrl_batch(tmp_path, "mask", questions)
    output = asyncio.run(generator.generate(batch))
    trainer = skyrl_trainer(
        generator.env.config.train, smollm_tokenizer, ["trainer.critic.model.path=critic"]
    )

    uids = [t.instance_id for t in output["trajectory_ids"]]
    output, uids = trainer.postprocess_generator_output(output, uids)
    data = trainer.convert_to_training_input(output, uids)
    rows = len(output["response_ids"])
    assert data["response_mask"].shape[0] % 4 == 0 and data["response_mask"].shape[0] >= rows  # padded
    data["values"] = torch.linspace(-1, 1, data["response_mask"].numel()).reshape(data["response_mask"].shape)
    data = trainer.compute_advantages_and_returns(data)

    trajectory = [sum(output["is_last_step"][:i]) for i in range(rows)]

    def value(i: int) -> float:  # the critic's value at the row's first response token (right-aligned)
        return float(data["values"][i, data["response_mask"].shape[1] - len(output["response_ids"][i])])

    expected = row_credit(
        [
            CreditRow.of(uids[i], f"{uids[i]}#{trajectory[i]}", output["env_metrics"][i], value(i))
            for i in range(rows)
        ],
        generator.env.config.train,
    )
    mask = data["response_mask"][:rows].bool()
    for i, credit in enumerate(expected):
        assert torch.allclose(data["advantages"][i][mask[i]], torch.tensor(credit.advantage), atol=1e-6)
        assert torch.allclose(data["returns"][i][mask[i]], torch.tensor(credit.returns), atol=1e-6)
    assert (data["advantages"][rows:] == 0).all()  # SkyRL's padding rows get no credit
    per_trajectory = {}
    for i in range(rows):
        per_trajectory.setdefault(trajectory[i], set()).add(round(expected[i].advantage, 6))
    assert any(len(a) > 1 for a in per_trajectory.values())  # turns of one episode differ: per-turn credit
    assert "loss/avg_raw_advantages" in trainer.all_metrics


@pytest.mark.parametrize(
    ("overrides", "estimator", "refusal"),
    [
        (["generator.step_wise_trajectories=false"], "grpo", "set generator.step_wise_trajectories=true"),
        (["generator.merge_stepwise_output=true"], "grpo", "merge_stepwise_output merges the turns"),
        ([], "gae", "needs SkyRL's critic: set trainer.critic.model.path"),
    ],
)
def test_rows_searchteam_cannot_credit_are_refused_before_any_rollout(overrides, estimator, refusal):
    from skyrl.train.config import SkyRLTrainConfig

    from searchteam.errors import ConfigError
    from searchteam.integrations.skyrl_trainer import refuse_rows_without_credit
    from searchteam.rl.config import TrainConfig

    base = ["generator.step_wise_trajectories=true", "trainer.algorithm.advantage_estimator=searchteam"]
    cfg = SkyRLTrainConfig.from_cli_overrides([*base, *overrides])
    with pytest.raises(ConfigError, match=refusal):
        refuse_rows_without_credit(cfg, TrainConfig(estimator=estimator))
    refuse_rows_without_credit(SkyRLTrainConfig.from_cli_overrides(base), TrainConfig())  # one row a turn


def test_the_skyrl_generator_refuses_to_run_without_the_policys_model_name(tmp_path, smollm_tokenizer):
    from searchteam.errors import ConfigError

    with pytest.raises(ConfigError, match="resolve_policy_model_name"):
        SearchTeamGenerator(str(run_config(tmp_path, "jade")), LoraEngineClient(smollm_tokenizer), None, "")


def test_evaluation_batches_play_evaluation_episodes(tmp_path, smollm_tokenizer):
    questions = [
        Question(id="q1", question="Who wrote Dune?", golden_answers=["Frank Herbert"], dataset="nq")
    ]
    generator = SearchTeamGenerator(
        str(run_config(tmp_path, "dac", max_turns=2)),
        LoraEngineClient(smollm_tokenizer),
        smollm_tokenizer,
        "lora",
    )
    batch = skyrl_batch(tmp_path, "dac", questions)
    played = []
    original = generator.env.play

    async def recording(question, llm, group="", training=True):
        played.append(training)
        return await original(question, llm, group=group, training=training)

    generator.env.play = recording
    asyncio.run(generator.generate({**batch, "batch_metadata": generators.BatchMetadata(1, "eval")}))
    asyncio.run(generator.generate(batch))
    assert played == [False, False, True, True]
