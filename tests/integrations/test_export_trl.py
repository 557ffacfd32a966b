"""TRL consumes exported views for real: the `sft` view trains two SFTTrainer steps and the `dpo` view one
DPOTrainer step of the 135M model on the CPU. The runs are real evals (the shipped corpus, BM25, naive RAG)
whose answers a scripted double decides, one run right and one wrong, so that their shared answer prompts
make preference pairs."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchteam.config import RunConfig
from searchteam.data.benchmark import load_benchmark
from searchteam.eval import runner
from searchteam.factory import Components, build_team
from searchteam.integrations.export import export_runs
from searchteam.llm.models import resolve_model
from searchteam.llm.scripted import ScriptedLLM

trl = pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")
N = 4


def naive_rag_run(out: Path, answers: dict[str, str], bm25) -> Path:
    def reply(request) -> str:
        asked = request.messages[-1]["content"]
        return next(a for q, a in answers.items() if q in asked) + "</answer>"

    # one passage: prompts short enough for max_length, and the 135M model's steps take seconds
    config = RunConfig(
        method="naive_rag",
        model="smollm2-135m",
        datasets=["hotpotqa"],
        split="dev",
        limit=N,
        top_k=1,
        out=out,
    )
    runner.evaluate(
        config, Components(build_team(config), {"policy": ScriptedLLM(reply)}, bm25), progress=False
    )
    return out


@pytest.fixture(scope="module")
def exported(tmp_path_factory, bm25) -> Path:
    tmp = tmp_path_factory.mktemp("trl")
    questions = load_benchmark(["hotpotqa"], "dev", N)
    right = naive_rag_run(tmp / "right", {q.question: q.golden_answers[0] for q in questions}, bm25)
    wrong = naive_rag_run(tmp / "wrong", {q.question: "I do not know" for q in questions}, bm25)
    report = export_runs([right, wrong], tmp / "ds", views=("sft", "dpo"))
    assert report.counts["sft"] == report.counts["dpo"] == N
    return tmp / "ds"


@pytest.fixture(autouse=True)
def fresh_accelerate_state():
    """A Trainer leaves accelerate's process-wide state behind; later tests build their own Accelerator."""
    from accelerate.state import AcceleratorState

    yield
    AcceleratorState._reset_state(reset_partial_state=True)


def small_model():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = resolve_model("smollm2-135m")
    return AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)


def changed(before: dict, model) -> bool:
    return any(not p.detach().equal(before[n]) for n, p in model.named_parameters())


def common_args(tmp_path: Path, steps: int) -> dict:
    return {
        "output_dir": str(tmp_path / "trainer"),
        "max_steps": steps,
        "per_device_train_batch_size": 1,
        "learning_rate": 1e-4,
        "report_to": [],
        "save_strategy": "no",
        "logging_steps": 1,
        "use_cpu": True,
        "bf16": False,  # the precision of the suite's other accelerators
    }


def test_sft_trainer_trains_two_steps_on_the_sft_view(exported, tmp_path):
    model, tokenizer = small_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    dataset = datasets.load_dataset(str(exported), "sft", split="train")
    trainer = trl.SFTTrainer(
        model=model,
        args=trl.SFTConfig(**common_args(tmp_path, 2), max_length=512),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    result = trainer.train()
    assert result.global_step == 2 and result.training_loss > 0
    assert changed(before, model)


def test_dpo_trainer_trains_one_step_on_the_dpo_view(exported, tmp_path):
    model, tokenizer = small_model()
    reference, _ = small_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    dataset = datasets.load_dataset(str(exported), "dpo", split="train")
    trainer = trl.DPOTrainer(
        model=model,
        ref_model=reference,
        args=trl.DPOConfig(**common_args(tmp_path, 1), max_length=512),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    result = trainer.train()
    assert result.global_step == 1
    assert changed(before, model)
