"""Training scenarios that `tests/rl/test_distributed.py` runs in two real processes (torchrun, gloo on the
CPU): `python -m torch.distributed.run --nproc-per-node 2 -m tests.support.dist_scenarios OUT SCENARIO...`.
Every process builds the same tiny random Llama, rolls out a scripted, deliberately uneven share of the data
(rank 0 three turns per step, rank 1 nine) and trains with the real Trainer; each writes its trainable
weights, the gradients of its optimizer steps and its log records to OUT/SCENARIO-rankR.pt."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import torch

from searchteam.rl.config import TrainConfig, WarmStartConfig
from searchteam.rl.distributed import make_accelerator
from searchteam.rl.policy import Policy, build_policy
from searchteam.rl.trainer import Trainer
from searchteam.rl.warm_start.data import WarmStart
from searchteam.types import Episode, Question, Turn
from tests.rl.test_trainer import tiny_model

REWARDS = (0.1, 0.5, 0.9)  # of the three rollouts of a question: a GRPO group with distinct advantages
CITIES = ("Paris", "Lyon", "Nice")  # what the three rollouts say: distinct sequences, a non-zero gradient


def tokenizer():
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model

    return AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))


def turn(tok, role: str, qid: str, index: int, city: str, sft_target: str | None = None) -> Turn:
    text = f"<plan>find {city}</plan>" if role == "plan" else f"<answer>{city}</answer>"
    return Turn(
        role=role,
        step=index,
        messages=[{"role": "user", "content": f"{role} {index}: capital of France? ({qid})"}],
        completion=text,
        completion_token_ids=tok(text, add_special_tokens=False)["input_ids"],
        sft_target=sft_target,
    )


def rank_episodes(tok, rank: int, step: int, scenario: str) -> list[Episode]:
    """One question per process and step, three rollouts of it: one turn each on rank 0 (three turns), three
    each on rank 1 (nine turns); rank 1 none at all in `empty`. Per-role: rank 0 plans only, rank 1 plans
    once and answers twice per rollout. In `critic_sft` rank 1's answers carry an SFT target."""
    if scenario == "empty" and rank == 1:
        return []
    roles = ["plan"] if rank == 0 else ["plan", "answer", "answer"]
    qid = f"s{step}-r{rank}"
    episodes = []
    for k, (reward, city) in enumerate(zip(REWARDS, CITIES, strict=True)):
        target = "<answer>Paris</answer>" if scenario == "critic_sft" else None
        turns = [
            turn(tok, role, qid, i, city, target if role == "answer" else None)
            for i, role in enumerate(roles)
        ]
        for t in turns:
            t.reward = reward
        episodes.append(
            Episode(question=Question(id=qid, question="capital of France?"), method="scripted", turns=turns)
        )
        episodes[-1].meta["replica"] = k
    return episodes


def config(scenario: str) -> TrainConfig:
    base: dict[str, Any] = dict(
        steps=2,
        lr=5e-2,
        micro_batch_size=2,
        mini_batch_size=4,
        lora_r=4,
        lora_alpha=8,
        lora_targets=["q_proj", "v_proj"],
        dist_timeout_s=60,  # a regression fails the collective instead of hanging the test
    )
    extra: dict[str, dict[str, Any]] = {
        "shared": {},
        "empty": {},
        "per_role": {"lora_per_role": True, "roles": ["answer", "plan"]},
        "critic_sft": {"estimator": "gae", "sft_coef": 0.5, "whiten_advantages": True, "gamma": 0.9},
        "separate_full": {"estimator": "gae", "critic": "separate", "full_ft": True, "lr": 1e-3},
        "critic_checkpointed": {"estimator": "gae", "critic": "separate", "gradient_checkpointing": True},
        # DAC's layout: a LoRA per role, the planner on GAE, the answerer on GRPO: the answerer's
        # micro-batches compute critic values that never enter their loss
        "mixed": {
            "lora_per_role": True,
            "roles": ["answer", "plan"],
            "role_estimators": {"plan": {"estimator": "gae", "gamma": 0.9}},
        },
        "equivalence": {"steps": 1, "mini_batch_size": 6, "max_grad_norm": 1e6, "lr": 1e-2},
    }
    extra["shared_prefixes"] = extra["equivalence"] | {"share_prefixes": True}
    return TrainConfig(**(base | extra[scenario]))


class RecordingTrainer(Trainer):
    """Keeps the gradients (after DDP's reduction) of every optimizer step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.grads: list[dict[str, torch.Tensor]] = []
        step_if_finite = self.updater.step_if_finite

        def recording_step_if_finite(finite, grad_norm, optimizer) -> bool:
            named = dict(self.policy.named_parameters())
            self.grads.append(
                {
                    n: named[n].grad.detach().clone()
                    for n in self.policy._trainable
                    if named[n].grad is not None
                }
            )
            return step_if_finite(finite, grad_norm, optimizer)

        self.updater.step_if_finite = recording_step_if_finite


def warm_start(tok, rank: int) -> WarmStart:
    """One warm-start round: rank 0 collects two episodes, rank 1 six; all answer Paris and are kept."""

    def collect(round_index: int) -> list[Episode]:
        return [
            Episode(
                question=Question(id=f"w{rank}-{i}", question="capital of France?"),
                method="scripted",
                turns=[turn(tok, "answer", f"w{rank}-{i}", 0, "Paris")],
                answer="Paris",
            )
            for i in range(2 if rank == 0 else 6)
        ]

    cfg = WarmStartConfig(rounds=1, epochs=1, lr=1e-2, micro_batch_size=1, mini_batch_size=4)
    return WarmStart(cfg, collect, lambda episode: 1.0)


def build(scenario: str, out: Path, ranks: list[int]) -> RecordingTrainer:
    """The scenario's trainer; its rollouts are the episodes of `ranks` (this process's rank, or every
    rank's for the single-process reference of `equivalence` and `shared_prefixes`)."""
    tok = tokenizer()
    cfg = config(scenario)
    policy: Policy = build_policy(tiny_model(tok, tied=scenario != "separate_full"), tok, cfg)

    def rollout(step: int) -> list[Episode]:
        return [e for r in ranks for e in rank_episodes(tok, r, step, scenario)]

    stage = warm_start(tok, ranks[0]) if scenario == "shared" else None
    return RecordingTrainer(policy, rollout, lambda episodes: None, cfg, out, warm_start=stage)


def sync_with_one_server(out: Path, rank: int) -> None:
    """Two adapter syncs of a per-role policy against one (fake) vLLM server at $FAKE_VLLM_URL, as the
    rollouts of several processes do them: the main process loads, the others adopt its broadcast names."""
    from searchteam.llm.openai import OpenAIBackend
    from searchteam.train.rollout import broadcast_from_main, sync_adapters

    tok = tokenizer()
    cfg = config("per_role")
    make_accelerator(cfg, out)  # the process group
    policy = build_policy(tiny_model(tok), tok, cfg)
    engine = OpenAIBackend("base", os.environ["FAKE_VLLM_URL"], max_retries=0)
    served = []
    for _ in range(2):
        sync_adapters(policy, engine, out / "server" / "rank0", main=rank == 0, share=broadcast_from_main)
        served.append(dict(engine.served_adapters))
    torch.save({"served": served}, out / f"server-rank{rank}.pt")


def run(out: Path, scenario: str) -> None:
    rank = int(os.environ["RANK"])  # the trainer's accelerator sets the process group up, not this
    if scenario == "server":
        sync_with_one_server(out, rank)
        return
    trainer = build(scenario, out / scenario, [rank])
    records = trainer.train()
    result = {"weights": trainer.policy.trainable_state_dict(), "grads": trainer.grads, "records": records}
    torch.save(result, out / f"{scenario}-rank{rank}.pt")


if __name__ == "__main__":
    torch.set_num_threads(1)
    for name in sys.argv[2:]:
        run(Path(sys.argv[1]), name)
