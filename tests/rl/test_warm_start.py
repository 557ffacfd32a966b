"""The warm-start stage (rejection-sampling fine-tuning): the filter and statistics on constructed episodes,
and the stage on a tiny randomly initialised Llama with scripted rollouts (likelihood rises on the kept
turns, rounds are saved and resume, RL follows)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from searchteam.rl.config import TrainConfig, WarmStartConfig
from searchteam.rl.experience import collate
from searchteam.rl.policy import Policy, build_policy
from searchteam.rl.run_log import truncate_jsonl
from searchteam.rl.trainer import Trainer
from searchteam.rl.warm_start.data import (
    WarmStart,
    append_kept,
    finished_rounds,
    keep,
    keep_by_role,
    kept_turn_counts,
    likelihood_samples,
    read_kept,
    role_returns,
    round_stats,
    support_recall,
    titles_added,
)
from searchteam.train.plot import plot_run
from searchteam.types import Episode, Passage, Question, Retrieval, Turn
from tests.rl.test_trainer import tiny_model, tokenizer  # noqa: F401  (the tokenizer fixture)

WARM = WarmStartConfig(min_f1=0.5)


def make_episode(answer: str, parsed: tuple[bool, ...] = (True, True), qid: str = "q", **kw) -> Episode:
    turns = [
        Turn(
            role=role,
            step=i,
            messages=[{"role": "user", "content": f"{role}: capital of France? ({qid})"}],
            completion=text,
            parsed_ok=ok,
        )
        for i, (role, text, ok) in enumerate(
            zip(
                ("plan", "answer"),
                ("<plan>find the capital</plan>", f"<answer>{answer}</answer>"),
                parsed,
                strict=True,
            )
        )
    ]
    question = Question(id=qid, question="capital of France?", golden_answers=["Paris"])
    return Episode(question=question, method="scripted", turns=turns, answer=answer, **kw)


def test_keep_wants_a_correct_answer_from_parsed_policy_turns() -> None:
    assert keep(make_episode("Paris"), 1.0, WARM)
    assert not keep(make_episode("Lyon"), 0.0, WARM)
    assert keep(make_episode("Paris, France"), 0.5, WARM)  # F1 = 2·(1/2·1)/(1/2+1) = 0.667 ≥ 0.5 passes too
    assert not keep(make_episode("Paris", parsed=(False, True)), 1.0, WARM)
    assert keep(
        make_episode("Paris", parsed=(False, True)), 1.0, WARM.model_copy(update={"require_parsed": False})
    )
    assert keep(make_episode("Paris", parsed=(False, True)), 1.0, WARM, roles=["answer"])  # plan not trained
    assert not keep(make_episode("Paris", error="timeout"), 1.0, WARM)
    frozen = make_episode("Paris")
    for turn in frozen.turns:
        turn.model = "generator"
    assert not keep(frozen, 1.0, WARM)  # nothing the policy wrote


def searched(titles: list[str], supporting: list[str] | None) -> Episode:
    episode = make_episode("Paris")
    episode.question.meta["supporting_titles"] = supporting
    passages = [Passage(id=t, title=t, text="...") for t in titles]
    episode.retrievals = [
        Retrieval(query="q1", k=1, passages=passages[:1]),
        Retrieval(query="q2", k=9, passages=passages[1:]),
    ]
    return episode


def test_support_recall_keeps_episodes_whose_searches_found_the_supporting_titles() -> None:
    both, half = (
        searched(["Paris", "x", "France"], ["France", "Paris"]),
        searched(["Paris"], ["France", "Paris"]),
    )
    assert support_recall(both) == 1.0 and support_recall(half) == 0.5
    assert support_recall(searched(["Paris"], None)) is None
    recall = WARM.model_copy(update={"min_f1": 0.0, "min_support_recall": 1.0})
    assert keep(both, 0.0, recall) and not keep(half, 1.0, recall)
    assert not keep(searched(["Paris"], None), 1.0, recall)  # no supporting titles: nothing to check it by
    assert keep(half, 0.6, WARM)  # unset: the answer alone decides
    assert round_stats([both, half], [0.0, 1.0], [True, False])["support_recall/sampled"] == 0.75


def test_kept_turns_count_the_policy_turns_a_round_fine_tunes() -> None:
    read_by_another_model = make_episode("Paris")
    read_by_another_model.turns[1].model = "qwen2.5-coder-1.5b"  # a frozen reader on its own engine
    assert kept_turn_counts([make_episode("Paris"), read_by_another_model]) == {
        "kept_turns/plan": 2,
        "kept_turns/answer": 1,
    }


def test_titles_added_keeps_episodes_whose_later_searches_found_what_the_first_lacked() -> None:
    # the first search returns the first title; the second search returns the rest
    second_hop = searched(["Paris", "x", "France"], ["France", "Paris"])
    repeated = searched(["Paris", "Paris", "x"], ["France", "Paris"])
    first_had_both = searched(["Paris", "France"], ["Paris"])
    assert [titles_added(e) for e in (second_hop, repeated, first_had_both)] == [1, 0, 0]
    assert titles_added(searched(["Paris"], None)) is None
    assert titles_added(make_episode("Paris").model_copy(update={"question": second_hop.question})) == 0
    hop = WARM.model_copy(update={"min_f1": 0.0, "min_titles_added": 1})
    assert keep(second_hop, 0.0, hop) and not keep(repeated, 1.0, hop) and not keep(first_had_both, 1.0, hop)
    assert not keep(searched(["Paris", "France"], None), 1.0, hop)  # no supporting titles
    stats = round_stats([second_hop, repeated, searched(["Paris"], None)], [0.0] * 3, [True, False, False])
    assert stats["titles_added/sampled"] == 0.5  # of the two questions with supporting titles


BY_ROLE = WarmStartConfig(keep_by="role_reward", min_role_reward=1.0)


def rewarded(plan: float, answer: float, parsed: tuple[bool, ...] = (True, True), **kw) -> Episode:
    episode = make_episode("Lyon", parsed, **kw)
    episode.turns[0].reward, episode.turns[1].reward = plan, answer
    return episode


def test_keep_by_role_keeps_the_turns_of_each_credited_role_whatever_the_answer() -> None:
    kept = keep_by_role(rewarded(1.0, 0.0), BY_ROLE)
    assert kept is not None and [t.role for t in kept.turns] == ["plan"]  # the answer was wrong: plan only
    assert [t.role for t in keep_by_role(rewarded(1.0, 1.0), BY_ROLE).turns] == ["plan", "answer"]
    assert keep_by_role(rewarded(0.5, 0.0), BY_ROLE) is None
    assert keep_by_role(rewarded(1.0, 0.0, parsed=(False, True)), BY_ROLE) is None  # credited but malformed
    assert keep_by_role(rewarded(1.0, 0.0, error="timeout"), BY_ROLE) is None
    two_plans = rewarded(0.5, 0.0)
    two_plans.turns.append(two_plans.turns[0].model_copy(update={"step": 2}))
    assert role_returns(two_plans) == {"plan": 1.0, "answer": 0.0}  # a role's return sums its turns
    assert [t.role for t in keep_by_role(two_plans, BY_ROLE).turns] == ["plan", "plan"]


def test_dac_rewards_keep_a_searcher_that_found_the_answer_when_the_generator_missed_it() -> None:
    """DAC's r_S = 1[s ∧ ¬abstained], r_G = 1[EM ∨ (¬s ∧ abstained)] (dac.txt Eq. 1-2)."""
    from searchteam.methods import build_reward_scheme

    question = Question(id="q", question="Where was Orwell born?", golden_answers=["Motihari"])

    def dac_episode(passage: str, answer: str) -> Episode:
        turns = [
            Turn(role="searcher", step=0, messages=[], completion="<search> Orwell birthplace </search>"),
            Turn(role="searcher", step=1, messages=[], completion="<stop>"),
            Turn(role="generator", step=2, messages=[], completion=f"<answer> {answer} </answer>"),
        ]
        found = Retrieval(query="Orwell birthplace", k=1, step=0, passages=[Passage(id="1", text=passage)])
        return Episode(question=question, method="dac", turns=turns, retrievals=[found], answer=answer)

    found_missed = dac_episode("Orwell was born in Motihari, India.", "India")
    found_right = dac_episode("Orwell was born in Motihari, India.", "Motihari")
    not_found_guessed = dac_episode("Orwell wrote Animal Farm.", "Motihari")
    build_reward_scheme("dac", {})([found_missed, found_right, not_found_guessed])
    roles = [
        [t.role for t in kept.turns] if (kept := keep_by_role(e, BY_ROLE)) else []
        for e in (found_missed, found_right, not_found_guessed)
    ]
    assert roles == [["searcher", "searcher"], ["searcher", "searcher", "generator"], ["generator"]]


def test_a_role_reward_warm_start_fine_tunes_only_the_credited_turns(tokenizer, tmp_path: Path) -> None:  # noqa: F811
    torch.set_num_threads(1)
    policy = build_policy(tiny_model(tokenizer), tokenizer, rl_config())
    stage = scripted_stage(tokenizer, 1, [])
    stage.config = stage.config.model_copy(update={"keep_by": "role_reward", "epochs": 1})

    def plan_always_answer_if_right(episodes: list[Episode]) -> None:
        for episode in episodes:
            episode.turns[0].reward, episode.turns[1].reward = 1.0, float(episode.answer == "Paris")

    stage.reward = plan_always_answer_if_right
    (record,) = Trainer(policy, None, no_reward, rl_config(), tmp_path, warm_start=stage).run_warm_start()
    assert (record["kept"], record["kept_turns/plan"], record["kept_turns/answer"]) == (4, 4, 2)
    assert record["samples"] == 6
    kept = read_kept(tmp_path)
    assert sorted(len(e.turns) for e in kept) == [1, 1, 2, 2]


def test_round_stats_by_hand() -> None:
    episodes = [
        make_episode("Paris"),
        make_episode("Lyon", parsed=(False, True)),
        make_episode("x", (False, False)),
    ]
    stats = round_stats(episodes, [1.0, 0.0, 0.0], [True, False, False])
    assert stats["episodes"] == 3 and stats["kept"] == 1
    assert stats["kept_share"] == pytest.approx(1 / 3)
    assert stats["f1/sampled"] == pytest.approx(1 / 3)
    assert stats["format_error_rate/plan"] == pytest.approx(2 / 3)
    assert stats["format_error_rate/answer"] == pytest.approx(1 / 3)
    assert stats["response_chars/answer"] == pytest.approx(
        (22 + 21 + 18) / 3
    )  # 17 tag characters + the answer


def test_likelihood_samples_tokenize_the_text_with_the_students_tokenizer(tokenizer) -> None:  # noqa: F811
    episode = make_episode("Paris")
    episode.turns[1].completion_token_ids = [3, 1, 4]  # a teacher's ids (another vocabulary)
    episode.turns[1].prompt_token_ids = [2, 7]
    samples = likelihood_samples([episode], tokenizer)
    answer = samples[1]
    assert [s.role for s in samples] == ["plan", "answer"] and all(s.sft for s in samples)
    assert answer.completion_ids == tokenizer("<answer>Paris</answer>", add_special_tokens=False)["input_ids"]
    rendered = tokenizer.apply_chat_template(
        episode.turns[1].messages, tokenize=False, add_generation_prompt=True
    )
    assert answer.prompt_ids == tokenizer(rendered, add_special_tokens=False)["input_ids"]
    assert answer.loss_mask == [1] * len(answer.completion_ids) and answer.old_logprobs is None
    assert [s.role for s in likelihood_samples([episode], tokenizer, roles=["plan"])] == ["plan"]
    malformed_plan = make_episode("Paris", parsed=(False, True))  # kept with require_parsed: false
    assert [s.role for s in likelihood_samples([malformed_plan], tokenizer)] == ["answer"]


def test_kept_file_keeps_only_finished_rounds(tmp_path: Path) -> None:
    append_kept(tmp_path, 1, [make_episode("Paris", qid="a")])
    append_kept(tmp_path, 2, [make_episode("Paris", qid="b"), make_episode("Paris", qid="c")])
    with (tmp_path / "warm_start" / "kept.jsonl").open("a") as fh:
        fh.write('{"round": 2, "quest')  # killed mid-write
    truncate_jsonl(tmp_path / "warm_start" / "kept.jsonl", "round", 1)  # what a resumed stage does first
    assert [e.question.id for e in read_kept(tmp_path)] == ["a"]
    assert len((tmp_path / "warm_start" / "kept.jsonl").read_text().splitlines()) == 1
    assert finished_rounds(tmp_path) == 0


def scripted_stage(tokenizer, rounds: int, calls: list[int]) -> WarmStart:  # noqa: F811
    """Per round four episodes of two questions: two answer Paris (kept), two answer Lyon (dropped)."""

    def collect(round_index: int) -> list[Episode]:
        calls.append(round_index)
        return [make_episode(a, qid=f"r{round_index}-{i}") for i, a in enumerate(["Paris", "Lyon"] * 2)]

    def score(episode: Episode) -> float:
        return float(episode.answer == "Paris")

    cfg = WarmStartConfig(rounds=rounds, epochs=4, lr=1e-2, micro_batch_size=2, mini_batch_size=2)
    return WarmStart(cfg, collect, score)


def rl_config(**overrides) -> TrainConfig:
    base = dict(
        steps=1, lr=1e-3, micro_batch_size=2, lora_r=4, lora_alpha=8, lora_targets=["q_proj", "v_proj"]
    )
    return TrainConfig(**(base | overrides))


def kept_nll(policy: Policy, tokenizer) -> float:  # noqa: F811
    samples = likelihood_samples([make_episode("Paris", qid="r1-0")], tokenizer)
    batch = collate(samples, tokenizer.pad_token_id or 0)
    with torch.no_grad():
        logprobs, _, _ = policy(batch.input_ids, batch.attention_mask, batch.target_index, batch.value_index)
    return float(-(logprobs * batch.loss_mask).sum() / batch.loss_mask.sum())


def no_reward(episodes: list[Episode]) -> None:
    for episode in episodes:
        for turn in episode.turns:
            turn.reward = float(episode.answer == "Paris")


def test_warm_start_raises_the_likelihood_of_kept_turns_then_rl_runs(tokenizer, tmp_path: Path) -> None:  # noqa: F811
    torch.set_num_threads(1)
    full = rl_config(full_ft=True)  # a tiny random model's logits barely move through LoRA alone
    policy = build_policy(tiny_model(tokenizer), tokenizer, full)
    before = kept_nll(policy, tokenizer)
    calls: list[int] = []
    stage = scripted_stage(tokenizer, 2, calls)
    rollout = lambda step: stage.collect(step + 1)  # noqa: E731
    trainer = Trainer(policy, rollout, no_reward, full, tmp_path, warm_start=stage)
    records = trainer.train()
    assert calls == [1, 2, 1]  # two warm-start rounds, then RL step 1's rollout
    assert kept_nll(policy, tokenizer) < before - 0.5
    log = [json.loads(line) for line in (tmp_path / "warm_start" / "log.jsonl").read_text().splitlines()]
    assert [r["round"] for r in log] == [1, 2]
    assert [r["kept"] for r in log] == [2, 2] and [r["samples"] for r in log] == [
        4,
        8,
    ]  # kept so far × 2 turns
    assert log[1]["updates"] == 4 * 4 and log[0]["sft_loss"] > log[1]["sft_loss"]
    assert len((tmp_path / "warm_start" / "kept.jsonl").read_text().splitlines()) == 4
    assert (tmp_path / "warm_start" / "round-02" / "policy" / "model").is_dir()
    assert [r["step"] for r in records] == [1]
    plot_run(tmp_path)
    assert (tmp_path / "plots" / "warm_start_curves.png").read_bytes()[:4] == b"\x89PNG"


def test_a_killed_warm_start_resumes_at_its_next_round_and_rl_skips_it(tokenizer, tmp_path: Path) -> None:  # noqa: F811
    torch.set_num_threads(1)
    first = build_policy(tiny_model(tokenizer), tokenizer, rl_config())
    Trainer(
        first, None, no_reward, rl_config(), tmp_path, warm_start=scripted_stage(tokenizer, 1, [])
    ).run_warm_start()

    calls: list[int] = []
    policy = build_policy(tiny_model(tokenizer), tokenizer, rl_config())
    trainer = Trainer(
        policy, None, no_reward, rl_config(), tmp_path, warm_start=scripted_stage(tokenizer, 2, calls)
    )
    assert trainer.resume() == 0
    trainer.run_warm_start()  # round 2 starts from round 1's weights and its kept episodes
    assert calls == [2]
    log = [json.loads(line) for line in (tmp_path / "warm_start" / "log.jsonl").read_text().splitlines()]
    assert [(r["round"], r["samples"]) for r in log] == [(1, 4), (2, 8)]

    trainer.step = 1
    trainer.save_checkpoint()  # as if RL had reached a checkpoint
    later = Trainer(
        policy,
        lambda step: [],
        no_reward,
        rl_config(steps=1),
        tmp_path,
        warm_start=scripted_stage(tokenizer, 3, calls),
    )
    assert later.resume() == 1
    later.train()
    assert calls == [2]  # RL had begun: no further warm-start round


def test_a_resume_before_any_checkpoint_drops_the_rl_steps_logged_after_the_warm_start(
    tokenizer,  # noqa: F811
    tmp_path: Path,
) -> None:
    torch.set_num_threads(1)
    policy = build_policy(tiny_model(tokenizer), tokenizer, rl_config())
    stage = scripted_stage(tokenizer, 1, [])
    Trainer(policy, None, no_reward, rl_config(), tmp_path, warm_start=stage).run_warm_start()
    (tmp_path / "train_log.jsonl").write_text('{"step": 1}\n{"step": 2, "lo')  # killed before a checkpoint
    trainer = Trainer(policy, None, no_reward, rl_config(), tmp_path, warm_start=stage)
    assert trainer.resume() == 0
    assert (tmp_path / "train_log.jsonl").read_text() == ""  # step 1 is run again, not logged twice


def test_a_resumed_log_drops_later_records_and_a_torn_line(tmp_path: Path) -> None:
    log = tmp_path / "train_log.jsonl"
    log.write_text('{"step": 1}\n{"step": 2}\n{"step": 3}\n{"step": 4, "lo')
    truncate_jsonl(log, "step", 2)
    assert log.read_text() == '{"step": 1}\n{"step": 2}\n'
    log.write_text('{"step": 1}\n{"st')
    truncate_jsonl(log, "step", 5)
    assert log.read_text() == '{"step": 1}\n'


def test_a_round_killed_before_it_was_saved_leaves_no_kept_episodes_behind(tokenizer, tmp_path: Path) -> None:  # noqa: F811
    torch.set_num_threads(1)
    append_kept(tmp_path, 1, [make_episode("Paris", qid="stale")])  # killed before round-01 was saved
    policy = build_policy(tiny_model(tokenizer), tokenizer, rl_config())
    Trainer(
        policy, None, no_reward, rl_config(), tmp_path, warm_start=scripted_stage(tokenizer, 1, [])
    ).run_warm_start()
    kept = [json.loads(line)["question"]["id"] for line in (tmp_path / "warm_start" / "kept.jsonl").open()]
    assert kept == ["r1-0", "r1-2"]


def test_zero_rl_steps_run_the_warm_start_only(tmp_path):
    """`steps: 0` is a warm-start-only run; without a warm_start section it would train nothing."""
    from searchteam.errors import ConfigError
    from searchteam.train.config import load_train_run_config

    with pytest.raises(ConfigError, match="warm_start"):
        load_train_run_config(None, {"method": "jade", "train.steps": 0})
    recipe = tmp_path / "ws.yaml"
    recipe.write_text("method: jade\nwarm_start: {rounds: 2}\n")
    cfg = load_train_run_config(recipe, {"train.steps": 0})
    assert cfg.train.steps == 0 and cfg.warm_start is not None and cfg.warm_start.rounds == 2


def test_a_round_killed_while_fine_tuning_resumes_from_its_saved_samples(tokenizer, tmp_path: Path) -> None:  # noqa: F811
    torch.set_num_threads(1)
    policy = build_policy(tiny_model(tokenizer), tokenizer, rl_config())
    stage = scripted_stage(tokenizer, 1, [])
    killed = Trainer(policy, None, no_reward, rl_config(), tmp_path, warm_start=stage)

    def kill(*args, **kwargs):
        raise KeyboardInterrupt

    killed.updater.optimizer_step = kill
    with pytest.raises(KeyboardInterrupt):
        killed.run_warm_start()
    assert finished_rounds(tmp_path) == 0

    calls: list[int] = []
    resumed = Trainer(
        policy, None, no_reward, rl_config(), tmp_path, warm_start=scripted_stage(tokenizer, 1, calls)
    )
    assert resumed.resume() == 0  # --resume: no checkpoint and no finished round, but saved samples
    (record,) = resumed.run_warm_start()
    assert calls == []  # the round's samples were read back, not drawn again
    assert (record["episodes"], record["kept"], record["samples"]) == (4, 2, 4)
    assert finished_rounds(tmp_path) == 1


def test_a_warm_start_only_run_plots_its_rounds(tmp_path: Path) -> None:
    record = {"round": 1, "kept_share": 0.05, "f1/sampled": 0.1, "format_error_rate/ds": 0.4, "sft_loss": 0.2}
    (tmp_path / "warm_start").mkdir()
    (tmp_path / "warm_start" / "log.jsonl").write_text(json.dumps(record) + "\n")
    curves = plot_run(tmp_path)  # no train_log.jsonl: `steps: 0`
    assert curves == tmp_path / "plots" / "warm_start_curves.png" and curves.read_bytes()[:4] == b"\x89PNG"
