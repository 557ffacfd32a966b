import asyncio

import pytest

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import build_reward_scheme, get_team
from searchteam.methods.dac.team import parse_searcher
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.teams.base import WITHDRAWN
from searchteam.types import Episode, Passage, Question
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = Question(id="q", question="Which novelist was German?", golden_answers=["Thomas Mann"])
ABSTAIN_SENTENCE = "simply answer unknown"


def is_generator(req: GenerationRequest) -> bool:
    return "knowledgeable assistant" in req.messages[0]["content"]


def scripted(searcher, answer: str = "<think> Doc 1 says so. </think>\n<answer> Thomas Mann </answer>"):
    """One model serving both roles, told apart by their system prompts."""
    return ScriptedLLM(lambda req: answer if is_generator(req) else searcher(req))


def search_once(req: GenerationRequest) -> str:
    if "<information>" in req.continuation:
        return "<think> Thomas Mann was German. </think>\n<stop> and more text"
    return "<think> Find German novelists. </think>\n<search> German novelist </search>"


def run(
    llm, settings: TeamSettings | None = None, training: bool = False, retriever=None, **extra_llms
) -> Episode:
    team = get_team("dac", settings)
    backends = make_backends({"policy": llm, **extra_llms}, retriever or TinyRetriever(PASSAGES))
    episodes, _ = asyncio.run(
        run_episodes(team.run, "dac", [QUESTION], backends, Sampling(), progress=False, training=training)
    )
    assert episodes[0].error is None, episodes[0].error
    return episodes[0]


def solve(llm, passages: list[Passage] = PASSAGES) -> Episode:
    backends = make_backends({"policy": llm}, TinyRetriever(passages))
    episodes, _ = asyncio.run(
        run_episodes(get_team("dac").solve, "dac", [QUESTION], backends, Sampling(), progress=False)
    )
    return episodes[0]


def test_a_copy_of_the_prompt_examples_answer_that_no_passage_holds_is_withdrawn_and_flagged():
    copy = "<think> No document says. </think>\n<answer> India </answer>"  # the generator example's answer
    copied = solve(scripted(search_once, copy))
    assert copied.answer == "" and copied.meta[WITHDRAWN] == "India"
    assert not copied.turns[-1].parsed_ok and "example" in copied.turns[-1].parse_error
    assert all(t.parsed_ok for t in copied.turns[:-1])
    india = Passage(id="4", title="Motihari", text="Motihari is a German novelist city in India.")
    supported = solve(scripted(search_once, copy), PASSAGES + [india])
    assert supported.answer == "India" and WITHDRAWN not in supported.meta
    assert solve(scripted(search_once)).answer == "Thomas Mann"  # any other answer passes untouched


def test_a_copy_of_an_example_entity_that_no_passage_holds_is_withdrawn():
    # the example's first hop: Search-R1's most frequent wrong answer on 100 dev questions
    copied = solve(scripted(search_once, "<think> The author. </think>\n<answer> George Orwell </answer>"))
    assert copied.answer == "" and copied.meta[WITHDRAWN] == "George Orwell"


def test_stop_ends_the_search_and_the_generator_answers_from_the_evidence():
    ep = run(scripted(search_once))
    assert [t.role for t in ep.turns] == ["searcher", "searcher", "generator"]
    assert ep.turns[1].completion.endswith("<stop>") and all(t.parsed_ok for t in ep.turns)
    assert [r.query for r in ep.retrievals] == ["German novelist"] and ep.retrievals[0].k == 3
    assert ep.answer == "Thomas Mann" and ep.turns[-1].step == 2
    assert [s["action"] for s in ep.states] == ["search", "stop"]
    assert ep.states[-1]["evidence"] == [p.id for p in ep.retrievals[0].passages]


def test_generator_sees_only_the_question_and_the_deduplicated_documents():
    def twice(req: GenerationRequest) -> str:
        if req.continuation.count("<information>") == 2:
            return "<think> enough </think><stop>"
        return "<think> secret reasoning </think><search> German novelist </search>"

    ep = run(scripted(twice))
    generator = ep.turns[-1].messages
    assert [m["role"] for m in generator] == ["system", "user", "assistant", "user"]
    prompt = generator[-1]["content"]
    assert prompt.startswith(f"Question: {QUESTION.question}\nDocuments:\n")
    assert prompt.count("Thomas Mann was a German novelist.") == 1 and prompt.count("Doc ") == 3
    assert "secret reasoning" not in prompt and "<search>" not in prompt and "<information>" not in prompt


def test_search_cap_is_four_searches_of_three_passages():
    ep = run(scripted(lambda req: "<think> more </think><search> novelist </search>"))
    assert len(ep.retrievals) == 4 and all(r.k == 3 and len(r.passages) == 3 for r in ep.retrievals)
    assert [t.role for t in ep.turns] == ["searcher"] * 4 + ["generator"]
    assert [s["step"] for s in ep.states] == [0, 1, 2, 3]


def test_information_blocks_are_environment_spans():
    ep = run(scripted(search_once))
    segments = ep.meta["transcript"]
    assert [s["source"] for s in segments] == ["model", "env", "model"]
    continuation = segments[0]["text"] + segments[1]["text"]
    [[start, end]] = ep.turns[1].env_spans
    assert continuation[start:end].startswith("\n\n<information>Doc 1(Title: Thomas Mann)")
    assert continuation[:start] == ep.turns[0].completion and end == len(continuation)
    assert not ep.turns[-1].env_spans  # the generator's prompt has no environment segments


def test_invalid_searcher_output_is_flagged_and_corrected():
    def responder(req: GenerationRequest) -> str:
        return "<think> ok </think><stop>" if "invalid" in req.continuation else "<answer> Paris </answer>"

    ep = run(scripted(responder))
    assert not ep.turns[0].parsed_ok and "<stop>" in ep.meta["transcript"][1]["text"]
    assert [s["action"] for s in ep.states] == ["invalid", "stop"] and not ep.retrievals
    assert "(no documents were retrieved)" in ep.turns[-1].messages[-1]["content"]


def test_abstention_prompt_only_in_training_or_when_asked():
    test_time = run(scripted(search_once))
    training = run(scripted(search_once), training=True)
    asked = run(scripted(search_once), TeamSettings(options={"abstain": True}))
    off_in_training = run(scripted(search_once), TeamSettings(options={"abstain": False}), training=True)
    assert ABSTAIN_SENTENCE not in test_time.turns[-1].messages[0]["content"]
    assert ABSTAIN_SENTENCE in training.turns[-1].messages[0]["content"]
    assert ABSTAIN_SENTENCE in asked.turns[-1].messages[0]["content"]
    assert ABSTAIN_SENTENCE not in off_in_training.turns[-1].messages[0]["content"]
    # the prompts differ by exactly the abstention sentence
    on, off = training.turns[-1].messages, test_time.turns[-1].messages
    assert on[1:] == off[1:] and on[0]["content"].startswith(off[0]["content"].rstrip("."))
    assert test_time.meta["abstention"] is False and training.meta["abstention"] is True


def test_unknown_is_accepted_only_when_abstention_is_on():
    abstaining = "<think> The documents do not say. </think><answer> Unknown. </answer>"
    on = run(scripted(search_once, abstaining), training=True)
    assert on.answer == "Unknown." and on.turns[-1].parsed_ok and on.meta["abstained"] is True
    off = run(scripted(search_once, abstaining))
    assert (
        off.answer == "" and not off.turns[-1].parsed_ok and "abstention is off" in off.turns[-1].parse_error
    )
    assert off.meta["abstained"] is False


def test_roles_on_their_own_models_record_them_and_the_others_use_the_policy():
    searcher = ScriptedLLM(search_once, name="searcher-adapter")
    generator = ScriptedLLM(lambda req: "<answer>Thomas Mann</answer>", name="generator-adapter")
    policy = ScriptedLLM(lambda req: pytest.fail("the policy should not be called"))
    ep = run(policy, searcher=searcher, generator=generator)
    assert [t.model for t in ep.turns] == ["searcher-adapter", "searcher-adapter", "generator-adapter"]
    assert len(searcher.requests) == 2 and len(generator.requests) == 1
    shared = run(scripted(search_once))
    assert {t.model for t in shared.turns} == {"policy"}


# ---- training: §3.4 probes on partial evidence, §3.3 hard positives -------------------------------------

MANN, GUTERSON, PARIS = PASSAGES
FILLERS = [Passage(id=f"f{i}", title=f"Filler {i}", text=f"Filler passage number {i}.") for i in range(1, 6)]


class RankedRetriever(TinyRetriever):
    """TinyRetriever, except that the original question gets a fixed ranking (for the top-15 pool)."""

    RANKING = [MANN, *FILLERS, GUTERSON, PARIS]

    def search(self, queries: list[str], k: int) -> list[list[Passage]]:
        found = super().search(queries, k)
        return [
            self.RANKING[:k] if q == QUESTION.question else f for q, f in zip(queries, found, strict=True)
        ]


def searching(*queries: str):
    """A searcher that issues `queries` in order (one per call), then stops."""

    def respond(req: GenerationRequest) -> str:
        done = req.continuation.count("<information>")
        if done < len(queries):
            return f"<think> search </think><search> {queries[done]} </search>"
        return "<think> enough </think><stop>"

    return respond


def answering(req: GenerationRequest) -> str:
    """A generator that answers iff the Thomas Mann passage is among its documents, else abstains."""
    if MANN.text in req.messages[-1]["content"]:
        return "<think> Doc says so. </think><answer> Thomas Mann </answer>"
    return "<think> Not there. </think><answer> unknown </answer>"


def train_run(searcher, generator=answering, **options) -> Episode:
    llm = ScriptedLLM(lambda req: generator(req) if is_generator(req) else searcher(req))
    settings = TeamSettings(top_k=1, options=options)
    return run(llm, settings, training=True, retriever=RankedRetriever(PASSAGES + FILLERS))


# the second search finds the evidence; or the first one does and the second adds nothing
@pytest.mark.parametrize(
    ("queries", "searcher_rewards"),
    [
        (("Paris capital", "German novelist"), [0.0, 1.0, 0.0]),
        (("German novelist", "Paris capital"), [1.0, 0.0, 0.0]),
    ],
)
def test_training_probes_the_generator_on_partial_evidence_and_rewards_telescope(queries, searcher_rewards):
    ep = train_run(searching(*queries), hard_positives=False)
    assert [t.role for t in ep.turns] == ["searcher", "searcher", "generator", "searcher", "generator"]
    probe, final = ep.turns_of("generator")
    assert probe.meta == {"probe": True, "evidence_step": 0} and probe.frozen
    first_docs = ep.retrievals[0].passages[0].text
    assert first_docs in probe.messages[-1]["content"] and probe.step == 1
    assert ep.retrievals[1].passages[0].text not in probe.messages[-1]["content"]  # E≤0 only
    first, second, stop = ep.turns_of("searcher")
    assert first.meta["partial_abstained"] is (queries[0] == "Paris capital")  # G(Q, E≤0)
    assert second.meta["partial_abstained"] is False  # G(Q, E≤1) is the final generator call
    assert "partial_abstained" not in stop.meta and ep.answer == "Thomas Mann"
    build_reward_scheme("dac")([ep])
    assert [t.reward for t in ep.turns_of("searcher")] == searcher_rewards
    assert sum(searcher_rewards) == ep.reward_terms["searcher"] == 1.0  # Σ_t r_t = r_S
    assert probe.reward is None and final.reward == 1.0


def test_a_final_abstention_takes_back_the_credit_of_an_earlier_search():
    def abstains_on_two_documents(req: GenerationRequest) -> str:
        two = req.messages[-1]["content"].count("Doc ") == 2
        return "<answer> unknown </answer>" if two else answering(req)

    ep = train_run(
        searching("German novelist", "Paris capital"), abstains_on_two_documents, hard_positives=False
    )
    assert ep.meta["abstained"] is True and ep.turns_of("searcher")[1].meta["partial_abstained"] is True
    build_reward_scheme("dac")([ep])
    rewards = [t.reward for t in ep.turns_of("searcher")]
    assert rewards == [1.0, -1.0, 0.0] and sum(rewards) == ep.reward_terms["searcher"] == 0.0


def test_hard_positive_adds_three_distractors_in_reverse_rank_order():
    ep = train_run(searching("Paris capital", "German novelist"), difference_rewards=False)
    assert [t.role for t in ep.turns] == ["searcher"] * 3 + ["generator"] * 2
    final, hard = ep.turns_of("generator")
    pool = ep.retrievals[-1]
    assert pool.query == QUESTION.question and pool.k == 15
    assert pool.step == hard.step == final.step > max(t.step for t in ep.turns_of("searcher"))
    documents = hard.messages[-1]["content"].split("Documents:\n")[1].splitlines()
    # E = [Paris, Mann]; the pool minus E ranks f1..f5, Guterson: the three lowest-ranked, lowest first
    titles = ["Paris", "Thomas Mann", "David Guterson", "Filler 5", "Filler 4"]
    assert [d.split(")")[0] for d in documents] == [f"Doc {i} (Title: {t}" for i, t in enumerate(titles, 1)]
    assert hard.meta == {"hard_positive": True, "answer": "Thomas Mann", "abstained": False}
    assert hard.subgroup == "hard_positive"
    assert final.messages[-1]["content"].count("Doc ") == 2 and "hard_positive" not in final.meta


def test_hard_positive_neither_changes_the_answer_nor_counts_toward_sufficiency():
    def distracted(req: GenerationRequest) -> str:  # never abstains, misled by the fillers
        misled = "Filler" in req.messages[-1]["content"]
        return f"<answer> {'Filler' if misled else 'Thomas Mann'} </answer>"

    ep = train_run(searching("Paris capital", "German novelist"), distracted)
    probe, final, hard = ep.turns_of("generator")
    assert hard.meta["answer"] == "Filler" and ep.answer == "Thomas Mann" and ep.meta["abstained"] is False
    assert MANN in ep.retrievals[-1].passages  # the top-15 pool holds the gold passage, ...
    build_reward_scheme("dac")([ep])
    # ... but only the searcher's retrievals count: E≤0 = [Paris] is insufficient though G(Q, E≤0) answered
    assert [t.reward for t in ep.turns_of("searcher")] == [0.0, 1.0, 0.0]
    assert (probe.reward, final.reward, hard.reward) == (None, 1.0, 0.0)
    assert ep.reward_terms["hard_positives"] == 1.0

    insufficient = train_run(searching("Paris capital"), distracted)
    assert len(insufficient.retrievals) == 1 and len(insufficient.turns_of("generator")) == 1


def test_no_probes_or_hard_positives_at_inference_or_when_switched_off():
    llm = ScriptedLLM(
        lambda req: (
            answering(req) if is_generator(req) else searching("Paris capital", "German novelist")(req)
        )
    )
    ep = run(llm, TeamSettings(top_k=1), retriever=RankedRetriever(PASSAGES + FILLERS))
    assert [t.role for t in ep.turns] == ["searcher"] * 3 + ["generator"]
    assert len(ep.retrievals) == 2 and not any("partial_abstained" in t.meta for t in ep.turns)
    off = train_run(
        searching("Paris capital", "German novelist"), difference_rewards=False, hard_positives=False
    )
    assert [t.role for t in off.turns] == ["searcher"] * 3 + ["generator"] and len(off.retrievals) == 2


def test_parse_searcher():
    assert parse_searcher("<think>x</think><search> a </search>").query == "a"
    assert parse_searcher("<think>x</think>\n<STOP>").kind == "stop"
    assert parse_searcher("<search></search>").error == "empty <search> tag"
    assert parse_searcher("<answer>x</answer>").kind == "invalid"
