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
from tests.test_integrations import hf_token_server, run_config  # noqa: E402


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
        str(run_config(tmp_path, "jade", max_new_tokens=16)), client, default_llm.tokenizer
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
