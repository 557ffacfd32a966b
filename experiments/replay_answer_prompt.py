"""Replay the static pipeline's answer call (`ag`) of a finished eval run with another answer prompt.

Greedy decoding makes the rewriter's and selector's calls, and so the documents the generator sees,
the same whatever its prompt; only the generator's call is rerun, with the question and the selected
documents of each recorded `ag` turn put into a candidate prompt. For choosing a prompt cheaply (one
call a question instead of three); a chosen prompt is then reported with a real `searchteam eval`.

    python experiments/replay_answer_prompt.py RUN CANDIDATES.yaml NAME OUT.jsonl [--limit N]

CANDIDATES.yaml maps a name to `{system, user}` (the user text has `{question}` and `{documents}`).
Rows are appended to OUT.jsonl as they finish; a rerun skips the ids already there.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from statistics import mean

import yaml

from searchteam.config import RunConfig
from searchteam.factory import build_team
from searchteam.llm import GenerationRequest, SamplingParams, build_llm
from searchteam.methods.static_pipeline.team import ANSWER_TOKENS
from searchteam.metrics import exact_match, f1_score
from searchteam.teams.answering import ANSWER_OPEN, ANSWER_STOP
from searchteam.teams.base import Team
from searchteam.types import Turn

BATCH = 8


def recorded_inputs(row: dict) -> tuple[str, str]:
    """The question and the numbered documents of the row's answer call (documents before or after the
    question line)."""
    ag = next(t for t in row["turns"] if t["role"] == "ag")
    user = ag["messages"][-1]["content"]
    start = user.find("Document0 (")
    if start < 0:
        return row["question"], ""
    documents = user[start:]
    for end in ("\n\nQuestion:", "\n\nNow,"):
        documents = documents.split(end, 1)[0]
    return row["question"], documents


def pipeline_with_answer_prompt(prompt: dict | None = None) -> Team:
    """The static pipeline, its `ag` prompt replaced by `prompt` (`{system, user}`) when given."""
    team = build_team(RunConfig(method="static_pipeline"))
    if prompt is not None:
        team.prompts = {**team.prompts, "ag": prompt}
    return team


def request(team: Team, question: str, documents: str) -> GenerationRequest:
    """The team's answer call, greedy, as `StaticPipeline.run` makes it."""
    sampling = SamplingParams(max_new_tokens=ANSWER_TOKENS, temperature=0.0, stop=ANSWER_STOP)
    messages = team.chat("ag", question=question, documents=documents)
    return GenerationRequest(messages=messages, sampling=sampling, continuation=ANSWER_OPEN, role="ag")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run", type=Path)
    parser.add_argument("candidates", type=Path)
    parser.add_argument("name")
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int)
    args = parser.parse_args()
    team = pipeline_with_answer_prompt(yaml.safe_load(args.candidates.read_text())[args.name])
    rows = [json.loads(line) for line in (args.run / "results.jsonl").open()][: args.limit]
    done = {json.loads(line)["id"] for line in args.out.open()} if args.out.exists() else set()
    todo = [r for r in rows if r["id"] not in done]
    config = yaml.safe_load((args.run / "config.yaml").read_text())
    llm = build_llm(config["model"], backend=config["backend"], ov_precision=config["ov_precision"])
    for start in range(0, len(todo), BATCH):
        batch = todo[start : start + BATCH]
        completions = llm.generate([request(team, *recorded_inputs(r)) for r in batch])
        with args.out.open("a") as out:
            for row, completion in zip(batch, completions, strict=True):
                turn = Turn(role="ag", completion=completion.text)
                answer = Team.answer_from(turn, prefill=ANSWER_OPEN)
                result = {
                    "id": row["id"],
                    "prediction": answer,
                    "format_ok": turn.parsed_ok,
                    "f1": f1_score(answer, row["golden_answers"]),
                    "em": exact_match(answer, row["golden_answers"]),
                    "recorded_prediction": row["prediction"],
                    "recorded_f1": row["f1"],
                }
                out.write(json.dumps(result) + "\n")
        print(f"{start + len(batch)}/{len(todo)}", flush=True)
    replayed = [json.loads(line) for line in args.out.open()]
    print(
        f"F1 {mean(r['f1'] for r in replayed):.3f} replayed, {mean(r['recorded_f1'] for r in replayed):.3f} "
        f"recorded, on {len(replayed)} questions"
    )


if __name__ == "__main__":
    main()
