"""searchteam's RL step beside TRL's GRPOTrainer on the same single-call task, in one run on this CPU.

The task is naive RAG's answer call: the question and its top-5 BM25 passages in, a short answer out, the
reward its token F1 against the gold answers. Both train qwen2.5-coder-0.5b (the dtype `auto` picks) with
the same LoRA (r 8, alpha 16, q_proj and v_proj), group size, new-token limit, temperature, learning rate,
one optimizer step per step over all of its samples in one forward pass, gradient checkpointing, no KL term.

searchteam runs first: `searchteam train`'s own trainer on naive RAG's 0.5B recipe with these settings
(OpenVINO GenAI rollouts, GRPO, `--share-prefixes` as given). Its answer prompts (chat template and the
`<answer>` the team opens the reply with) and the questions' gold answers are then TRL's dataset, so TRL
trains on the same prompts: GRPOTrainer on the CPU, generating with transformers' `generate` (its path
without vLLM). Prints per framework the wall seconds of each step, the part spent generating (TRL: with its
scoring of the completions), and the update seconds per sample (the rest of the step).

    python benchmarks/bench_vs_trl.py [--steps 2 --questions 2 --group-size 4 --max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from searchteam.metrics import f1_score
from searchteam.rl.experience import continuation_of
from searchteam.types import Episode

ANSWER_CLOSE = "</answer>"


def searchteam_steps(args, run_dir: Path) -> tuple[list[dict], list[Episode]]:
    """`args.steps` steps of `searchteam train` on naive RAG: each step's log record, and its episodes."""
    from searchteam.methods import get_method
    from searchteam.train.build import build_trainer
    from searchteam.train.config import load_train_run_config

    settings = {
        "warm_start": None,
        "group_size": args.group_size,
        "questions_per_step": args.questions,
        "max_new_tokens": args.max_new_tokens,
        "temperature": 1.0,
        "train.steps": args.steps,
        "train.lr": args.lr,
        "train.dynamic_sampling": False,
        "train.mini_batch_size": None,
        "train.micro_batch_size": args.questions * args.group_size,
        "train.gradient_checkpointing": True,
        "train.share_prefixes": args.share_prefixes,
        "train.save_rollout_prompts": True,
        "report_to": ["none"],
    }
    recipe = get_method("naive_rag").recipe_path("cpu")
    cfg = load_train_run_config(recipe, {"train.steps": args.steps}, settings)
    trainer = build_trainer(cfg, run_dir)
    records = []
    for _ in range(args.steps):
        start = time.perf_counter()
        records.append(trainer.train_step() | {"wall": time.perf_counter() - start})
    trainer.finish_tracking()
    with (run_dir / "rollouts.jsonl").open() as lines:
        episodes = [Episode.model_validate_json(line) for line in lines]
    return records, episodes


def trl_dataset(episodes: list[Episode], tokenizer):
    """One row per question of `episodes`: its answer prompt as the team sent it, and its gold answers."""
    from datasets import Dataset

    rows = {}
    for episode in episodes:
        turn = next(t for t in episode.turns if t.role == "answer")
        text = tokenizer.apply_chat_template(turn.messages, tokenize=False, add_generation_prompt=True)
        rows[episode.question.id] = {
            "prompt": text + continuation_of(turn),
            "golds": list(episode.question.golden_answers),
        }
    return Dataset.from_list(list(rows.values()))


def answer_f1(completions: list[str], golds: list[list[str]], **_) -> list[float]:
    """The token F1 of each completion's answer (up to `</answer>`)."""
    return [f1_score(c.split(ANSWER_CLOSE)[0].strip(), g) for c, g in zip(completions, golds, strict=True)]


def trl_steps(args, dataset, model_path: str, dtype: torch.dtype, run_dir: Path) -> list[dict]:
    """`args.steps` GRPOTrainer steps on `dataset`: per step its wall and generation seconds and samples."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    class Timed(GRPOTrainer):
        generating = 0.0

        def _generate_and_score_completions(self, *a, **kw):
            start = time.perf_counter()
            try:
                return super()._generate_and_score_completions(*a, **kw)
            finally:
                Timed.generating += time.perf_counter() - start

    steps: list[dict] = []

    class StepClock(TrainerCallback):
        def on_step_begin(self, *_, **__):
            self.start, Timed.generating = time.perf_counter(), 0.0

        def on_step_end(self, *_, **__):
            steps.append({"wall": time.perf_counter() - self.start, "generation": Timed.generating})

    samples = args.questions * args.group_size
    config = GRPOConfig(
        output_dir=str(run_dir),
        use_cpu=True,
        max_steps=args.steps,
        per_device_train_batch_size=samples,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        learning_rate=args.lr,
        beta=0.0,
        gradient_checkpointing=True,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=0,
        bf16=dtype == torch.bfloat16,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    trainer = Timed(
        model=model,
        reward_funcs=answer_f1,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        peft_config=lora,
        callbacks=[StepClock()],
    )
    trainer.train()
    return [s | {"samples": samples} for s in steps]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--questions", type=int, default=2, help="questions per step")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--share-prefixes", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    from transformers import AutoTokenizer

    from searchteam.llm.hf import pick_dtype
    from searchteam.llm.models import resolve_model

    model_path = str(resolve_model("qwen2.5-coder-0.5b"))
    dtype = pick_dtype("auto", "cpu", training=True)
    print(f"qwen2.5-coder-0.5b ({dtype}), {torch.get_num_threads()} threads, {json.dumps(vars(args))}")
    with tempfile.TemporaryDirectory() as tmp:
        ours, episodes = searchteam_steps(args, Path(tmp) / "searchteam")
        dataset = trl_dataset(episodes, AutoTokenizer.from_pretrained(model_path))
        theirs = trl_steps(args, dataset, model_path, dtype, Path(tmp) / "trl")
    print("framework   step samples  wall s generation s update s/sample")
    for i, r in enumerate(ours):
        row = (r["samples"], r["wall"], r["time/rollout"], r["time/update"] / r["samples"])
        print("searchteam  {:4d} {:7d} {:7.1f} {:12.1f} {:15.2f}".format(i, *row))
    for i, s in enumerate(theirs):
        row = (s["samples"], s["wall"], s["generation"], (s["wall"] - s["generation"]) / s["samples"])
        print("TRL         {:4d} {:7d} {:7.1f} {:12.1f} {:15.2f}".format(i, *row))


if __name__ == "__main__":
    main()
