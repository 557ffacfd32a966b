"""Reward schemes on hand-built episodes, with rewards computed by hand from the papers' equations."""

from __future__ import annotations

import logging

import pytest

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import build_reward_scheme, reward_methods
from searchteam.rewards.judge import judge_request, load_judge_prompts, parse_verdict
from searchteam.types import Episode, Passage, Question, Retrieval, Turn

F1_PARIS_FRANCE = 2 / 3  # F1("Paris France", ["Paris"]): precision 1/2, recall 1


def question(qid: str = "q1", golds: tuple[str, ...] = ("Paris",)) -> Question:
    return Question(id=qid, question="What is the capital of France?", golden_answers=list(golds))


def turn(role: str, step: int = 0, completion: str = "", ok: bool = True, **meta) -> Turn:
    return Turn(role=role, step=step, completion=completion, parsed_ok=ok, meta=meta)


def retrieval(step: int, *texts: str, query: str = "q") -> Retrieval:
    passages = [Passage(id=f"{step}-{i}", title="T", text=t) for i, t in enumerate(texts)]
    return Retrieval(query=query, k=len(texts), step=step, passages=passages)


def episode(method: str, turns: list[Turn], answer: str, qid: str = "q1", **fields) -> Episode:
    return Episode(question=question(qid), method=method, turns=turns, answer=answer, **fields)


def rewards(ep: Episode, role: str | None = None) -> list[float | None]:
    return [t.reward for t in ep.turns if role is None or t.role == role]


# ---- M-ASK ---------------------------------------------------------------------------------------------


def mask_iteration(t: int, answer: str | None = None, **turn_meta) -> list[Turn]:
    """Search, summary, update (and answer) of turn t, all at step t; `turn_meta` may add `turn=t`."""
    turns = [
        turn("search", t, action="search", **turn_meta),
        turn("summary", t, **turn_meta),
        turn("update", t, **turn_meta),
    ]
    if answer is not None:
        turns.append(turn("answer", t, turn=t, final=False, predicted_answer=answer))
    return turns


def test_mask_training_episode_turn_rewards():
    turns = [
        turn("plan", 0, turn=0, predicted_answer="Lyon"),
        *mask_iteration(1, "Paris France", turn=1),
        *mask_iteration(2, "Paris", turn=2),
        turn("search", 3, turn=3, action="end"),
    ]
    ep = episode("mask", turns, "Paris")
    build_reward_scheme("mask")([ep])
    assert rewards(ep, "plan") == [0.0]
    assert rewards(ep, "answer") == pytest.approx([F1_PARIS_FRANCE, 1.0])
    gain_1, gain_2 = F1_PARIS_FRANCE, 1.0 - F1_PARIS_FRANCE
    assert rewards(ep, "search") == pytest.approx([gain_1, gain_2, 0.0])
    assert rewards(ep, "summary") == rewards(ep, "update") == pytest.approx([gain_1, gain_2])
    assert ep.reward == 1.0
    assert ep.reward_terms["imputed_turns"] == 0.0


def test_mask_format_penalty_is_off_by_default_and_lowers_only_broken_turns():
    def scored(options: dict) -> Episode:
        turns = [
            turn("plan", 0, ok=False, turn=0, predicted_answer="Lyon"),
            turn("search", 1, turn=1, action="search"),
            turn("summary", 1, ok=False, turn=1),
            turn("update", 1, turn=1),
            turn("answer", 1, turn=1, final=False, predicted_answer="Paris"),
        ]
        ep = episode("mask", turns, "Paris")
        build_reward_scheme("mask", options)([ep])
        return ep

    paper = scored({})
    assert rewards(paper) == pytest.approx([0.0, 1.0, 1.0, 1.0, 1.0])  # Eq. 2-3 alone: formats do not count
    penalized = scored({"format_penalty": 1.0})
    assert rewards(penalized) == pytest.approx([-1.0, 1.0, 0.0, 1.0, 1.0])
    assert penalized.reward == 1.0 and penalized.reward_terms["format_errors"] == 2.0


def test_mask_inference_episode_carries_answers_forward_and_uses_the_final_answer_last():
    turns = [
        turn("plan", 0, predicted_answer="Paris France"),
        *mask_iteration(1),
        *mask_iteration(2),
        turn("search", 3, action="end"),
        turn("answer", 2, turn=None, final=True, predicted_answer="Paris"),
    ]
    ep = episode("mask", turns, "Paris")
    build_reward_scheme("mask")([ep])
    assert rewards(ep, "search") == pytest.approx([0.0, 1.0 - F1_PARIS_FRANCE, 0.0])
    assert rewards(ep, "answer") == [1.0]
    assert ep.reward_terms["imputed_turns"] == 2.0


@pytest.mark.parametrize(
    ("a0", "per_turn", "final", "last_f1"),
    [
        ("Lyon", ["Paris France", "Lyon", "Paris"], "Paris", 1.0),
        ("Paris", ["Lyon", None, None], "Marseille", 0.0),
        ("Paris France", [None, "Paris", None], "Paris France", F1_PARIS_FRANCE),
    ],
)
def test_mask_iteration_rewards_telescope(a0, per_turn, final, last_f1):
    turns = [turn("plan", 0, predicted_answer=a0)]
    for t, answer in enumerate(per_turn, 1):
        turns += mask_iteration(t, answer)
    turns.append(turn("answer", len(per_turn), turn=None, final=True, predicted_answer=final))
    ep = episode("mask", turns, final)
    build_reward_scheme("mask")([ep])
    terms = ep.reward_terms
    assert terms["last_turn_f1"] == pytest.approx(last_f1)
    assert sum(rewards(ep, "search")) == pytest.approx(last_f1 - terms["plan_f1"])
    assert sum(rewards(ep, "summary")) == pytest.approx(terms["gain"])


# ---- QAgent --------------------------------------------------------------------------------------------


def test_qagent_stage1_needs_every_agent_turn_well_formed():
    ok = episode("qagent", [turn("agent", 0), turn("agent", 1)], "Paris")
    bad = episode("qagent", [turn("agent", 0, ok=False), turn("agent", 1)], "Paris", qid="q2")
    wrong = episode("qagent", [turn("agent", 0)], "Lyon", qid="q3")
    build_reward_scheme("qagent", {"stage": 1})([ok, bad, wrong])
    assert rewards(ok) == [1.0, 1.0]
    assert rewards(bad) == [0.0, 0.0]
    assert rewards(wrong) == [0.0]
    assert bad.reward_terms == {"stage": 1.0, "format_ok": 0.0, "agent_em": 1.0}


def test_qagent_stage1_in_submodule_mode_scores_the_agents_own_answer():
    answered = episode(
        "qagent", [turn("agent"), turn("generator", 1)], "Lyon", meta={"agent_answer": "Paris"}
    )
    silent = episode("qagent", [turn("agent"), turn("generator", 1)], "Paris", qid="q2")
    build_reward_scheme("qagent")([answered, silent])
    assert rewards(answered) == [1.0, None]
    assert rewards(silent) == [0.0, None]


def test_qagent_stage2_rewards_the_frozen_generator_plus_half_a_hit():
    gold_retrieved = episode(
        "qagent",
        [turn("agent", 0), turn("agent", 1), turn("generator", 2)],
        "It is Paris.",
        retrievals=[retrieval(0, "Paris is the capital of France.")],
    )
    only_in_trajectory = episode(
        "qagent",
        [turn("agent", 0), turn("generator", 1)],
        "Lyon",
        qid="q2",
        retrievals=[retrieval(0, "France is a country.")],
        meta={"transcript": [{"source": "model", "text": "<plan>maybe Paris</plan>"}]},
    )
    missed = episode("qagent", [turn("agent", 0), turn("generator", 1)], "Lyon", qid="q3")
    build_reward_scheme("qagent", {"stage": 2})([gold_retrieved, only_in_trajectory, missed])
    assert rewards(gold_retrieved) == [1.5, 1.5, None]
    assert rewards(only_in_trajectory) == [0.5, None]
    assert rewards(missed) == [0.0, None]
    assert gold_retrieved.reward_terms == {"stage": 2.0, "generator_score": 1.0, "hit": 1.0}


def test_qagent_stage2_refuses_end_to_end_episodes():
    with pytest.raises(ValueError, match="mode=submodule"):
        build_reward_scheme("qagent", {"stage": 2})([episode("qagent", [turn("agent")], "Paris")])


# ---- DECOR ---------------------------------------------------------------------------------------------


def decor_episode(answer: str, evidence: str, qid: str = "q1", *, filter_ok: bool = True) -> Episode:
    """Planner searches, filter keeps `evidence`, compressor (frozen), planner stops, answerer answers."""
    turns = [
        turn("planner", 1, "<think>t</think><search>capital of France</search>", query="capital of France"),
        turn("filter", 1, f"<think>t</think><filter>{evidence}</filter>", ok=filter_ok, evidence=evidence),
        turn("compressor", 1, "<facts>x</facts>", frozen=True),
        turn("planner", 2, "<think>t</think><search>None</search>", query=None),
        turn("answerer", 2, f"<think>t</think><answer>{answer}</answer>"),
    ]
    return episode(
        "decor",
        turns,
        answer,
        qid=qid,
        retrievals=[retrieval(1, "Paris is the capital of France.", query="capital of France")],
        states=[{"step": 1, "memory": [{"query": "capital of France", "evidence": evidence}]}],
    )


def test_decor_proxy_rewards_without_a_judge(caplog):
    good = decor_episode("Paris France", "Paris is the capital of France.")
    lazy = decor_episode("Lyon", "No relevant information.", qid="q2")
    scheme = build_reward_scheme("decor")
    with caplog.at_level(logging.WARNING):
        scheme([good, lazy])
        scheme([decor_episode("Paris", "Paris.")])
    assert sum("no judge configured" in r.message for r in caplog.records) == 1
    team = 0.5 * F1_PARIS_FRANCE + 0.5 * 1.0  # λ·F1 + (1−λ)·cover-EM proxy of the answer judge
    assert rewards(good) == pytest.approx([0.6 * team + 0.4] * 2 + [None] + [0.6 * team + 0.4] * 2)
    # lazy: team reward 0; the filter dropped the gold the documents had (−1); the memory lacks the answer,
    # so the wrong answerer is not blamed (+1); the STOP planner stopped on a memory without it (−1).
    assert rewards(lazy) == pytest.approx([0.4, -0.4, None, -0.4, 0.4])
    assert good.reward == pytest.approx(team)
    assert lazy.reward_terms["role_planner"] == 0.0


def test_decor_format_gate_gives_every_trained_turn_minus_one():
    ep = decor_episode("Paris", "Paris is the capital.", filter_ok=False)
    judge = ScriptedLLM(lambda r: "<verdict>YES</verdict>")
    build_reward_scheme("decor", judge=judge)([ep])
    assert rewards(ep) == [-1.0, -1.0, None, -1.0, -1.0]
    assert ep.reward == -1.0 and ep.reward_terms["format_ok"] == 0.0
    assert judge.requests == []


def test_decor_batches_every_judge_call_of_a_batch_into_one_generate_call():
    def verdicts(request: GenerationRequest) -> str:
        system = request.messages[0]["content"]
        if "planner agent" in system:
            return "I think it is fine."  # unparseable: the proxy decides
        if "expert evaluation model" in system:
            return "NO</verdict>"  # the reply continues the prefilled "<verdict>"
        return "YES</verdict>"

    judge = ScriptedLLM(verdicts)
    episodes = [
        decor_episode("Paris France", "Paris is the capital of France.", qid="q1"),
        decor_episode("Lyon", "No relevant information.", qid="q2"),
        decor_episode("Paris", "Paris.", qid="q3", filter_ok=False),
    ]
    build_reward_scheme("decor", {"alpha": 0.5, "lam": 0.4}, judge=judge)(episodes)
    assert judge.batch_sizes == [10]  # 2 judged episodes × (answer + 2 planners + filter + answerer)
    good, lazy, gated = episodes
    team = 0.4 * F1_PARIS_FRANCE  # the answer judge said NO
    assert rewards(good) == pytest.approx([0.5 * team + 0.5] * 2 + [None] + [0.5 * team + 0.5] * 2)
    # lazy: planners fall back to the proxy (+1, −1); the judge accepts the filter and the answerer
    assert rewards(lazy) == pytest.approx([0.5, 0.5, None, -0.5, 0.5])
    assert lazy.reward_terms["judge_unparsed"] == 2.0
    assert lazy.reward_terms["judge_calls"] == 5.0
    assert rewards(gated) == [-1.0, -1.0, None, -1.0, -1.0]
    first = judge.requests[0]
    assert "Paris France" in first.messages[1]["content"] and first.sampling.temperature == 0.0


# ---- DAC -----------------------------------------------------------------------------------------------


def dac_episode(answer: str, abstained: bool, searcher_meta: list[dict], qid: str = "q1") -> Episode:
    """Searcher turns at steps 0..n−1 (the last one stops); step 0 retrieves no gold, step 1 retrieves it."""
    turns = [turn("searcher", t, **meta) for t, meta in enumerate(searcher_meta)]
    turns.append(turn("generator", len(searcher_meta), f"<answer>{answer}</answer>"))
    return episode(
        "dac",
        turns,
        answer,
        qid=qid,
        retrievals=[retrieval(0, "France is in Europe."), retrieval(1, "Paris is the capital of France.")],
        meta={"abstention": True, "abstained": abstained},
    )


def test_dac_cross_verification_rewards_on_the_outcome():
    correct = dac_episode("Paris", False, [{}, {}, {}])
    abstained_on_sufficient = dac_episode("unknown", True, [{}, {}, {}], qid="q2")
    build_reward_scheme("dac")([correct, abstained_on_sufficient])
    assert rewards(correct) == [0.0, 0.0, 1.0, 1.0]
    assert rewards(abstained_on_sufficient) == [0.0, 0.0, 0.0, 0.0]
    assert correct.reward_terms["sufficient"] == 1.0


def test_dac_rewards_a_correct_abstention_on_insufficient_evidence():
    ep = dac_episode("unknown", True, [{}])  # only step 0 searched: its passage lacks the gold answer
    ep.retrievals = ep.retrievals[:1]
    build_reward_scheme("dac")([ep])
    assert rewards(ep) == [0.0, 1.0]
    assert ep.reward_terms["sufficient"] == 0.0


def test_dac_difference_rewards_from_partial_rewards_telescope():
    ep = dac_episode(
        "Paris", False, [{"partial_reward": 0.0}, {"partial_reward": 1.0}, {"partial_reward": 1.0}]
    )
    build_reward_scheme("dac")([ep])
    assert rewards(ep, "searcher") == [0.0, 1.0, 0.0]
    assert sum(rewards(ep, "searcher")) == ep.reward_terms["searcher"] == 1.0


@pytest.mark.parametrize("final_abstained", [False, True])
def test_dac_difference_rewards_from_partial_abstentions_telescope(final_abstained):
    searcher = [{"partial_abstained": False}, {"partial_abstained": False}, {}]
    ep = dac_episode("unknown" if final_abstained else "Paris", final_abstained, searcher)
    build_reward_scheme("dac")([ep])
    # R(E≤0) = 0 (no gold yet), R(E≤1) = 1 (gold retrieved at step 1, accepted), last = final r_S
    final = 0.0 if final_abstained else 1.0
    assert rewards(ep, "searcher") == [0.0, 1.0, final - 1.0]
    assert sum(rewards(ep, "searcher")) == ep.reward_terms["searcher"] == final


def test_dac_probe_generator_calls_are_not_rewarded_and_differences_telescope():
    # the team's layout (§3.4): G(Q, E≤0) probed before search 1 (a frozen generator call), the final call's
    # abstention recorded on the last search turn, nothing on the <stop> turn
    searcher = [{"partial_abstained": True}, {"partial_abstained": False}, {}]
    ep = dac_episode("Paris", False, searcher)
    probe = turn("generator", 1, "<answer>unknown</answer>", probe=True, frozen=True, evidence_step=0)
    ep.turns.insert(2, probe)
    build_reward_scheme("dac")([ep])
    assert rewards(ep) == [0.0, 1.0, None, 0.0, 1.0]  # s(0) = 0, s(1) = 1 = r_S; r_G = EM = 1
    assert sum(rewards(ep, "searcher")) == ep.reward_terms["searcher"] == 1.0
    assert ep.reward_terms["hard_positives"] == 0.0


def test_dac_ignores_retrievals_after_the_searcher_and_scores_hard_positives_with_s_1():
    ep = dac_episode("unknown", True, [{}])
    ep.retrievals[1].step = 5  # e.g. distractors fetched for a hard positive after the search loop
    ep.turns.append(turn("generator", 1, "<answer>Paris</answer>", hard_positive=True))
    ep.turns.append(turn("generator", 1, "", hard_positive=True, answer="unknown", abstained=True))
    build_reward_scheme("dac", {"difference_rewards": False})([ep])
    assert rewards(ep) == [0.0, 1.0, 1.0, 0.0]


def test_dac_hard_positive_that_fails_where_the_clean_answer_succeeded_gets_an_sft_target():
    """Appendix D, Eq. 7: D_SFT = {(Q, E′, G(Q, E)) : a(Q, G(Q, E)) = 1, a(Q, G(Q, E′)) = 0}."""
    ep = dac_episode("Paris", False, [{}, {}])
    ep.turns.append(turn("generator", 2, "<answer>Lyon</answer>", hard_positive=True, answer="Lyon"))
    ep.turns.append(turn("generator", 2, "<answer>Paris</answer>", hard_positive=True, answer="Paris"))
    build_reward_scheme("dac")([ep])
    clean, wrong, right = ep.turns_of("generator")
    assert wrong.sft_target == clean.completion == "<answer>Paris</answer>"
    assert right.sft_target is None and clean.sft_target is None
    ep.answer = "Rome"  # the clean answer is wrong: no pseudo-target
    build_reward_scheme("dac")([ep])
    assert all(t.sft_target is None for t in ep.turns)


# ---- JADE ----------------------------------------------------------------------------------------------


def jade_episode(**meta) -> Episode:
    turns = [turn("planner", 1), turn("qr", 1, ok=False), turn("ag", 1), turn("as", 2)]
    return episode("jade", turns, "Paris", meta=meta)


def test_jade_cost_terms_and_format_penalty_shared_by_every_turn():
    ep = jade_episode(jade_rounds=2, jade_retrievals=4)
    build_reward_scheme("jade", {"alpha": 0.3, "beta": 0.6, "placement": "every_turn"})([ep])
    expected = 1.0 - (0.3 * 2 / 3 + 0.6 * 1.0)  # N_ret/3 is capped at 1
    assert rewards(ep) == pytest.approx([expected, -1.0, expected, expected])
    assert ep.reward == pytest.approx(expected)
    assert ep.reward_terms["format_errors"] == 1.0


def test_jade_default_is_eq_8_global_reward_on_the_terminal_step_only():
    ep = jade_episode(jade_rounds=1, jade_retrievals=1)
    build_reward_scheme("jade")([ep])
    expected = 1.0 - (0.05 / 3 + 0.05 / 3)  # R_global = 0.9667
    assert rewards(ep) == pytest.approx([0.0, -1.0, 0.0, expected])  # r_format + 1[terminal]·R_global


def test_jade_default_returns_count_the_global_reward_once():
    # the example: 4 turns, R_global = 0.967; γ = 1 returns are 0.967 each by default, while
    # every_turn placement sums it once per remaining turn (3.87, 2.90, 1.93, 0.97)
    def returns(placement: str | None) -> list[float]:
        turns = [turn("planner", 1), turn("qr", 1), turn("ag", 1), turn("as", 2)]
        ep = episode("jade", turns, "Paris", meta={"jade_rounds": 1, "jade_retrievals": 1})
        build_reward_scheme("jade", {"placement": placement} if placement else None)([ep])
        return [sum(rewards(ep)[i:]) for i in range(4)]

    r_global = 1.0 - 0.1 / 3
    assert returns(None) == pytest.approx([r_global] * 4)
    assert returns("every_turn") == pytest.approx([4 * r_global, 3 * r_global, 2 * r_global, r_global])


def test_jade_counts_turns_and_retrievals_when_the_team_did_not_record_them():
    ep = jade_episode()
    ep.retrievals = [retrieval(1, "a"), retrieval(1, "b"), retrieval(2, "c")]
    build_reward_scheme("jade", {"alpha": 0.3, "beta": 0.3})([ep])
    assert ep.reward_terms["rounds"] == 1.0 and ep.reward_terms["retrievals"] == 3.0
    assert ep.reward == pytest.approx(1.0 - 0.3 / 3 - 0.3)


# ---- outcome baselines ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("method", "options", "expected"),
    [
        ("search_r1", None, 0.0),
        ("static_pipeline", None, F1_PARIS_FRANCE),
        ("ircot", None, 0.0),
        ("naive_rag", {"metric": "cover_em"}, 1.0),
        ("direct", {"metric": "f1"}, F1_PARIS_FRANCE),
    ],
)
def test_outcome_reward_on_every_turn(method, options, expected):
    ep = episode(method, [turn("a", 0), turn("b", 1)], "Paris France")
    build_reward_scheme(method, options)([ep])
    assert rewards(ep) == pytest.approx([expected, expected])
    assert ep.reward_terms["cover_em"] == 1.0


def test_outcome_reward_on_the_last_turn_only():
    ep = episode("search_r1", [turn("agent", 0), turn("agent", 1), turn("agent", 2)], "paris")
    build_reward_scheme("search_r1", {"placement": "last_turn"})([ep])
    assert rewards(ep) == [0.0, 0.0, 1.0]


# ---- registry and judge plumbing -----------------------------------------------------------------------


def test_registry_errors_name_what_was_wrong():
    assert {"mask", "qagent", "decor", "dac", "jade", "search_r1"} <= set(reward_methods())
    with pytest.raises(ValueError, match="known methods: .*decor"):
        build_reward_scheme("nope")
    with pytest.raises(ValueError, match="beta.*Allowed options: alpha, lam"):
        build_reward_scheme("decor", {"beta": 0.4})
    with pytest.raises(ValueError, match="alpha"):
        build_reward_scheme("decor", {"alpha": 1.5})
    with pytest.raises(ValueError, match="stage"):
        build_reward_scheme("qagent", {"stage": 3})
    with pytest.raises(ValueError, match="metric"):
        build_reward_scheme("search_r1", {"metric": "bleu"})


def test_a_judge_given_to_a_scheme_without_one_is_reported(caplog):
    with caplog.at_level(logging.WARNING):
        build_reward_scheme("mask", judge=ScriptedLLM([]))
    assert "uses no judge" in caplog.text


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ("<verdict>YES</verdict>", True),
        ("reasoning... <verdict> no </verdict>", False),
        ("<verdict>NO</verdict> then <verdict>Yes", True),
        ("YES.", True),
        ("no", False),
        ("Yes, because the answer is right", None),
        ("", None),
    ],
)
def test_parse_verdict(text, verdict):
    assert parse_verdict(text) is verdict


def test_judge_prompts_ask_for_a_verdict_tag_and_fill_their_fields():
    prompts = load_judge_prompts("decor_judge")
    assert set(prompts) == {"answer", "planner", "filter", "answerer"}
    assert all("<verdict>YES</verdict>" in p["system"] for p in prompts.values())
    request = judge_request("decor_judge", "answer", {"question": "Q?", "prediction": "P", "references": "R"})
    assert "Prediction: P" in request.messages[1]["content"] and request.sampling.stop == ("</verdict>",)
    assert request.continuation == "<verdict>"
    with pytest.raises(ValueError, match="needs field"):
        judge_request("decor_judge", "answer", {"question": "Q?"})
    with pytest.raises(ValueError, match="no 'critic' prompt"):
        judge_request("decor_judge", "critic", {})


def test_an_unknown_judge_prompt_file_is_refused_when_the_scheme_is_built():
    with pytest.raises(ValueError, match="no judge prompt file nope.yaml"):
        build_reward_scheme("decor", {"judge_prompts": "nope"}, judge=ScriptedLLM([]))
