"""`searchteam export` and `export-questions`: real eval runs (the 135M model, the shipped corpus and BM25)
become a Parquet dataset whose token ids are the ones the engine saw, and whose views TRL reads."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from searchteam.cli import app
from searchteam.config import RunConfig
from searchteam.data.benchmark import load_benchmark
from searchteam.errors import ExportError
from searchteam.eval import runner
from searchteam.factory import Components, build_team
from searchteam.integrations.export import export_runs
from searchteam.integrations.views import dpo_rows, stepwise_rows
from searchteam.llm.scripted import ScriptedLLM
from searchteam.rl.run_log import rollout_line
from searchteam.types import Episode, Question, Turn

datasets = pytest.importorskip("datasets")


def view_file(folder: Path, name: str) -> Path:
    (path,) = folder.glob(f"{name}-*.parquet")
    return path


def eval_run(tmp: Path, method: str, llm, retriever, *, limit: int = 2) -> Path:
    """A real `evaluate` of the first `limit` HotpotQA dev questions into tmp/METHOD."""
    config = RunConfig(
        method=method, model="smollm2-135m", datasets=["hotpotqa"], split="dev", limit=limit,
        max_new_tokens=24, max_turns=2, out=tmp / method,
    )  # fmt: skip
    runner.evaluate(config, Components(build_team(config), {"policy": llm}, retriever), progress=False)
    return tmp / method


@pytest.fixture(scope="module")
def real_runs(tmp_path_factory, default_llm, bm25):
    """naive RAG (a prefilled answer) and Search-R1 (turns that continue their message after retrieved
    text), run by the real 135M model; with the episodes as the engine recorded them (token ids included),
    which results.jsonl leaves out."""
    tmp = tmp_path_factory.mktemp("runs")
    seen: list[Episode] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            runner, "result_row", lambda episode, row=runner.result_row: seen.append(episode) or row(episode)
        )
        runs = [eval_run(tmp, m, default_llm, bm25) for m in ("naive_rag", "search_r1")]
    out = tmp / "dataset"
    report = export_runs(runs, out, min_f1=0.0)
    return runs, seen, out, report


def test_token_ids_are_the_ones_the_engine_saw(real_runs):
    _, seen, out, _ = real_runs
    turns = datasets.load_dataset("parquet", data_files=str(view_file(out, "turns")), split="train")
    recorded = [t for e in seen for t in e.turns]
    assert len(turns) == len(recorded) > 0
    assert any(t.continuation for t in recorded)  # the prefill and the continued Search-R1 message
    exported = sorted(turns, key=lambda r: (r["run"] != "naive_rag", r["episode"], r["turn"]))
    by_question = {(e.method, e.question.id): e for e in seen}
    for row in exported:
        turn = by_question[(row["method"], row["question_id"])].turns[row["turn"]]
        assert row["prompt_ids"] == turn.prompt_token_ids
        assert row["completion_ids"] == turn.completion_token_ids
        assert row["logprobs"] == pytest.approx(turn.logprobs)
        assert row["loss_mask"] == [1] * len(turn.completion_token_ids)
        assert row["tokenizer"] == "smollm2-135m" and len(row["chat_template_sha256"]) == 64
        assert not row["tokens_recorded"]  # results.jsonl keeps the prompt as messages: ids rebuilt from them


def test_rows_carry_identity_task_passages_and_a_card(real_runs):
    runs, seen, out, report = real_runs
    rows = pq.read_table(view_file(out, "turns")).to_pylist()
    first = rows[0]
    identity = (first["run"], first["source"], first["method"], first["model"], first["adapter"])
    assert identity == ("naive_rag", "eval", "naive_rag", "smollm2-135m", "")
    episode = next(e for e in seen if e.method == "naive_rag" and e.question.id == first["question_id"])
    assert first["prompt"] == episode.turns[0].messages
    assert first["golden_answers"] == episode.question.golden_answers
    assert first["passage_ids"] == [p.id for p in episode.retrieved_passages()]
    assert first["passage_titles"] == [p.title for p in episode.retrieved_passages()]
    assert first["passage_texts"] == [p.text for p in episode.retrieved_passages()]
    card = (out / "README.md").read_text()
    assert "CC BY-SA 4.0" in card and "hotpotqa" in card and "Apache-2.0 (SmolLM2)" in card
    assert report.counts["turns"] == len(rows)
    loaded = datasets.load_dataset(str(out), "turns", split="train")  # the card's configs name the files
    assert len(loaded) == len(rows)
    assert all(
        r["prompt"] and not r["continuation"] for r in rows if r["run"] == "search_r1" and r["turn"] == 0
    )


def test_turns_continued_after_retrieved_text_stay_out_of_chat_views_and_in_stepwise(real_runs):
    _, seen, out, report = real_runs
    continued = sum(1 for e in seen for t in e.turns if t.env_spans)
    kto = pq.read_table(view_file(out, "kto")).num_rows
    stepwise = pq.read_table(view_file(out, "stepwise")).num_rows
    assert stepwise == report.counts["turns"] and kto == stepwise - continued
    parsed = sum(1 for e in seen for t in e.turns if t.parsed_ok and not t.env_spans)
    assert report.counts.get("sft", 0) == parsed  # min_f1 0: every well-formed chat turn


def test_no_passages_and_no_tokens(real_runs, tmp_path):
    runs, _, _, _ = real_runs
    report = export_runs(runs[:1], tmp_path / "lean", views=(), passages=False, tokens=False)
    rows = pq.read_table(view_file(tmp_path / "lean", "turns")).to_pylist()
    assert report.counts == {"turns": len(rows)}
    assert all(r["passage_texts"] is None and r["passage_titles"] and r["prompt_ids"] is None for r in rows)


def scripted_run(tmp: Path, answers: dict[str, str], bm25) -> Path:
    """naive RAG answering each question with `answers[question]`."""

    def reply(request) -> str:
        asked = request.messages[-1]["content"]
        return next(a for q, a in answers.items() if q in asked) + "</answer>"

    return eval_run(tmp, "naive_rag", ScriptedLLM(reply), bm25)


def test_dpo_pairs_the_same_prompt_across_runs(tmp_path, bm25):
    questions = load_benchmark(["hotpotqa"], "dev", 2)
    right = scripted_run(tmp_path / "right", {q.question: q.golden_answers[0] for q in questions}, bm25)
    # the same questions and retrieval, so the same answer prompts, answered wrong
    wrong = scripted_run(tmp_path / "wrong", {q.question: "Nowhere" for q in questions}, bm25)
    out = tmp_path / "ds"
    report = export_runs([right, wrong], out, views=("sft", "dpo", "kto"))
    kto = pq.read_table(view_file(out, "kto")).to_pylist()
    assert all(r["completion"][0]["content"].startswith("<answer>") for r in kto)  # the prefill, in the reply
    sft = datasets.load_dataset(str(out), "sft", split="train")
    assert len(sft) == report.counts["sft"] == len(questions)  # the right run's answers
    assert sft[0]["completion"][0]["role"] == "assistant" and sft[0]["f1"] == 1.0
    pairs = pq.read_table(view_file(out, "dpo")).to_pylist()
    assert sorted(p["question_id"] for p in pairs) == sorted(q.id for q in questions)
    for pair in pairs:
        gold = next(q.golden_answers[0] for q in questions if q.id == pair["question_id"])
        # the reply starts with the `<answer>` prefill the call continued
        assert pair["chosen"] == [{"role": "assistant", "content": f"<answer>{gold}</answer>"}]
        assert pair["rejected"] == [{"role": "assistant", "content": "<answer>Nowhere</answer>"}]
        assert pair["run"] == "right/naive_rag"
        assert pair["score_chosen"] == 1.0 and pair["score_rejected"] == 0.0


def rollout_episode(question: str, answer: str, reward: float) -> Episode:
    messages = [{"role": "user", "content": f"Q: {question}"}]
    turn = Turn(role="agent", messages=messages, completion=f"<answer>{answer}</answer>", reward=reward)
    return Episode(
        question=Question(id=question, question=question, golden_answers=["Paris"]),
        method="search_r1",
        turns=[turn],
        answer=answer,
        reward=reward,
    )


def training_run(tmp: Path, whole: bool) -> Path:
    run = tmp / ("whole" if whole else "traces")
    run.mkdir(exist_ok=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"method": "search_r1", "model": "smollm2-135m"}))
    episodes = [rollout_episode("capital of France", a, r) for a, r in (("Paris", 1.0), ("Lyon", 0.0))]
    lines = [json.dumps({"step": 3, **rollout_line(e, whole)}) for e in episodes]
    (run / "rollouts.jsonl").write_text("\n".join(lines) + "\n")
    return run


def test_training_rollouts_export_with_their_step_and_pair_within_the_group(tmp_path):
    report = export_runs([training_run(tmp_path, whole=True)], tmp_path / "ds")
    rows = pq.read_table(view_file(tmp_path / "ds", "turns")).to_pylist()
    assert [(r["source"], r["training_step"], r["turn_reward"]) for r in rows] == [
        ("rollout", 3, 1.0), ("rollout", 3, 0.0)
    ]  # fmt: skip
    assert report.counts["dpo"] == 1 and report.counts["sft"] == 1 and report.counts["stepwise"] == 2


def test_a_re_export_under_the_same_folder_name_loads_its_own_rows(tmp_path):
    """`datasets` caches a folder's configs by folder and file names: content-named files keep a new export
    under an old name from loading the old rows."""
    first, second = tmp_path / "a" / "data", tmp_path / "b" / "data"
    export_runs([training_run(tmp_path, whole=True)], first, views=())
    export_runs([training_run(tmp_path, whole=False)], second, views=())
    assert datasets.load_dataset(str(first), "turns", split="train")[0]["prompt"]
    assert not datasets.load_dataset(str(second), "turns", split="train")[0]["prompt"]


def test_rollout_traces_without_prompts_say_how_to_keep_them(tmp_path):
    report = export_runs([training_run(tmp_path, whole=False)], tmp_path / "ds")
    assert report.counts["sft"] == report.counts["stepwise"] == 0
    assert any("train.save_rollout_prompts" in note for note in report.notes)


def test_views_are_pure_functions_of_rows():
    base = {"run": "r", "question_id": "q", "group": "q", "role": "a",
            "prompt": [{"role": "user", "content": "x"}], "continuation": None, "env_spans": [],
            "trained": True, "parsed_ok": True, "episode": 0, "prompt_ids": [1],
            "loss_mask": [1], "logprobs": None, "episode_reward": None}  # fmt: skip
    rows = [
        {**base, "completion": "a", "turn_reward": None, "f1": 0.5, "turn": 0, "completion_ids": [2]},
        {**base, "completion": "b", "turn_reward": 0.2, "f1": 1.0, "turn": 1, "completion_ids": [3]},
        {**base, "completion": "c", "turn_reward": None, "f1": 0.3, "turn": 2, "completion_ids": []},
    ]
    # turn 1's own reward (0.2) counts, not its episode's F1: 0.5 beats it
    (pair,) = dpo_rows(rows)
    assert (pair["chosen"][0]["content"], pair["rejected"][0]["content"]) == ("a", "b")
    assert [r["is_last_turn"] for r in stepwise_rows(rows)] == [False, True]


def test_bad_exports_are_refused_with_one_line(tmp_path):
    with pytest.raises(ExportError, match="no config.yaml"):
        export_runs([tmp_path], tmp_path / "out")
    (tmp_path / "config.yaml").write_text("method: naive_rag\nmodel: smollm2-135m\n")
    with pytest.raises(ExportError, match="holds no episodes"):
        export_runs([tmp_path], tmp_path / "out")
    result = CliRunner().invoke(
        app, ["export", str(tmp_path), "--out", str(tmp_path / "o"), "--views", "sftt"]
    )
    assert result.exit_code == 2 and "unknown view sftt" in result.output


def test_export_questions_for_verl_and_skyrl(tmp_path):
    for fmt, reward in (("verl", "reward_model"), ("skyrl", "reward_spec")):
        args = ["export-questions", "--format", fmt, "--method", "mask", "--dataset", "hotpotqa", "--split",
                "dev", "--limit", "2", "--out", str(tmp_path / fmt)]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        rows = datasets.load_dataset("parquet", data_files=str(tmp_path / fmt / "dev.parquet"), split="train")
        assert len(rows) == 2
        row = rows[0]
        assert row["prompt"][0]["role"] == "user" and row["extra_info"]["method"] == "mask"
        assert row[reward]["ground_truth"]["target"] == row["extra_info"]["golden_answers"]
    assert rows[0]["env_class"] == "searchteam"


def test_the_cards_licences_are_the_benchmark_readmes():
    from searchteam.data.benchmark import BENCHMARK_DIR
    from searchteam.data.licenses import DATASET_LICENSES

    table = (BENCHMARK_DIR / "README.md").read_text().split("## Licences and attribution")[1]
    for name, licence in DATASET_LICENSES.items():
        row = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
        assert ("UNKNOWN" if licence.startswith("unknown") else licence) in row, name
