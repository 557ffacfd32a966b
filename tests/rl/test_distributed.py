"""Data-parallel training in two real processes (torchrun, gloo on the CPU) with the real Trainer and Policy
on a tiny random Llama: uneven shares of the data (rank 0 three turns per step, rank 1 nine, or none) finish
within a bounded process-group timeout, every process ends with the same weights, the log covers both
processes, and two processes take the optimizer steps of one process over the union of their data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.support import dist_scenarios
from tests.support.fake_vllm import FakeVLLM
from tests.support.helpers import serve_on_loopback

ROOT = Path(__file__).resolve().parents[2]
TRAINING = [
    "shared",
    "per_role",
    "critic_sft",
    "empty",
    "separate_full",
    "critic_checkpointed",
    "mixed",
    "equivalence",
    "shared_prefixes",
]


@pytest.fixture(scope="module")
def fake_vllm() -> Iterator[tuple[FakeVLLM, str]]:
    fake = FakeVLLM(dist_scenarios.tokenizer(), model="base")
    with serve_on_loopback(fake.app()) as url:
        yield fake, url


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory, fake_vllm) -> Path:
    """Runs every scenario once in two processes; returns the folder of their results."""
    out = tmp_path_factory.mktemp("ddp")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env["FAKE_VLLM_URL"] = fake_vllm[1]
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    done = subprocess.run(
        [*command, "-m", "tests.support.dist_scenarios", str(out), *TRAINING, "server"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out


def results(out: Path, scenario: str) -> list[dict]:
    return [torch.load(out / f"{scenario}-rank{r}.pt", weights_only=False) for r in (0, 1)]


def initial_weights(scenario: str) -> dict[str, torch.Tensor]:
    tok = dist_scenarios.tokenizer()
    cfg = dist_scenarios.config(scenario)
    model = dist_scenarios.tiny_model(tok, tied=scenario != "separate_full")
    return dist_scenarios.build_policy(model, tok, cfg).trainable_state_dict()


@pytest.mark.parametrize("scenario", [s for s in TRAINING if s not in ("equivalence", "shared_prefixes")])
def test_uneven_ranks_finish_with_identical_weights(two_ranks: Path, scenario: str):
    rank0, rank1 = results(two_ranks, scenario)
    assert rank0["weights"].keys() == rank1["weights"].keys()
    for name, tensor in rank0["weights"].items():
        torch.testing.assert_close(tensor, rank1["weights"][name], rtol=0, atol=0, msg=name)
    start = initial_weights(scenario)
    moved = [n for n, t in rank0["weights"].items() if not torch.equal(t, start[n])]
    assert moved, "training changed no weight"
    assert len(rank0["grads"]) == len(rank1["grads"])  # as many optimizer steps on both


def test_log_counts_every_process_and_names_the_world_size(two_ranks: Path):
    log = [json.loads(line) for line in (two_ranks / "shared" / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in log] == [1, 2]
    assert all(r["world_size"] == 2 for r in log)
    assert all(r["samples"] == 3 + 9 and r["episodes"] == 6 for r in log)
    traces = (two_ranks / "shared" / "rollouts.jsonl").read_text().splitlines()
    assert sorted({json.loads(t)["question"]["id"] for t in traces}) == ["s0-r0", "s0-r1", "s1-r0", "s1-r1"]
    warm = json.loads((two_ranks / "shared" / "warm_start" / "log.jsonl").read_text())
    assert warm["episodes"] == 2 + 6


def test_a_process_without_samples_still_joins_every_update(two_ranks: Path):
    rank0, rank1 = results(two_ranks, "empty")
    assert [r["samples"] for r in rank0["records"]] == [3, 3]
    # one optimizer step (three samples, mini-batches of four) of rank 0's two micro-batches, padded on rank 1
    assert [r["updates"] for r in rank1["records"]] == [1, 1]


def test_per_role_log_has_both_roles_of_both_processes(two_ranks: Path):
    records = results(two_ranks, "per_role")[0]["records"]
    assert records[0]["samples/plan"] == 3 + 3 and records[0]["samples/answer"] == 6


@pytest.mark.parametrize("scenario", ["equivalence", "shared_prefixes"])
def test_two_processes_take_the_single_process_steps_on_the_union(
    two_ranks: Path, tmp_path: Path, scenario: str
):
    """Mini-batches are planned over every process's samples and the loss is normalized by the counts of
    all processes, so two processes take the optimizer steps one process takes over both processes'
    samples: as many (two per batch here), each with the same gradient (DDP's average of the two). Also
    when the two processes share prefixes and the one process does not."""
    torch.set_num_threads(1)
    single = dist_scenarios.build("equivalence", tmp_path, [0, 1])
    records = single.train()
    rank0, _ = results(two_ranks, scenario)
    assert [r["updates"] for r in records] == [r["updates"] for r in rank0["records"]] == [2]
    assert len(single.grads) == len(rank0["grads"]) == 2
    for step, grads in enumerate(single.grads):
        scale = max(g.abs().max().item() for g in grads.values())
        assert scale > 1e-4  # a real gradient, not rounding noise around zero
        for name, grad in grads.items():
            torch.testing.assert_close(
                rank0["grads"][step][name], grad, rtol=1e-4, atol=1e-5 * scale, msg=f"step {step}: {name}"
            )
    weights = single.policy.trainable_state_dict()
    for name, tensor in weights.items():
        scale = max(tensor.abs().max().item(), 1e-3)
        torch.testing.assert_close(rank0["weights"][name], tensor, rtol=1e-4, atol=1e-5 * scale, msg=name)


def test_processes_on_one_server_load_each_adapter_once(two_ranks: Path, fake_vllm):
    """Adapter sync through a vLLM server from two processes: the main process loads each role's adapter
    once per update and the other uses the broadcast names (no duplicate-name refusal, no second copy);
    the main process unloads its adapters when it exits."""
    fake, _ = fake_vllm
    served = [torch.load(two_ranks / f"server-rank{r}.pt")["served"] for r in (0, 1)]
    assert served[0] == served[1]
    assert [sorted(s) for s in served[0]] == [["answer", "plan"]] * 2 and served[0][0] != served[0][1]
    # two loads per update, the first update's names unloaded after the second, the last at exit
    assert [kind for kind, _ in fake.lora_calls] == ["load"] * 4 + ["unload"] * 4
    assert [name for kind, name in fake.lora_calls if kind == "load"] == [
        name for update in served[0] for name in update.values()
    ]
    assert fake.loras == {}
    assert not (two_ranks / "server" / "rank1").exists()


@pytest.mark.parametrize("kind", ["FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA"])
def test_distributed_modes_that_do_not_work_are_refused_in_one_line(kind: str):
    from accelerate.utils import DistributedType

    from searchteam.errors import ConfigError
    from searchteam.rl.distributed import check_distributed

    with pytest.raises(ConfigError, match=r"not supported.*--num-processes N") as refused:
        check_distributed(DistributedType[kind])
    assert "\n" not in str(refused.value)
    for supported in ("NO", "MULTI_CPU", "MULTI_GPU"):
        check_distributed(DistributedType[supported])


@pytest.mark.parametrize(
    ("overrides", "unused"),
    [
        ({}, False),
        ({"lora_per_role": True, "roles": ["plan", "answer"]}, True),  # other roles' adapters idle
        ({"estimator": "gae"}, True),  # the critic idle on SFT micro-batches and in the warm start
        ({"role_estimators": {"searcher": {"estimator": "gae"}}, "roles": ["searcher", "generator"]}, True),
    ],
)
def test_ddp_tolerates_unused_parameters_where_a_micro_batch_can_leave_some_out(tmp_path, overrides, unused):
    from searchteam.rl.config import TrainConfig
    from searchteam.rl.distributed import make_accelerator

    accelerator = make_accelerator(TrainConfig(**overrides), tmp_path)
    assert accelerator.ddp_handler.find_unused_parameters is unused
    assert accelerator.ddp_handler.broadcast_buffers is False  # no collective in a forward pass


def test_train_refuses_a_question_count_the_processes_cannot_share_before_launching(tmp_path):
    from typer.testing import CliRunner

    from searchteam.cli import app

    result = CliRunner().invoke(
        app, ["train", "--config", "naive_rag/smollm135m-cpu", "--num-processes", "3", "--out", str(tmp_path)]
    )
    assert result.exit_code == 2
    assert "questions_per_step (4) must be a multiple of the number of processes (3)" in result.output
    assert not list(tmp_path.iterdir())
