import asyncio

import pytest

from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team
from searchteam.methods.search_r1.team import parse_action
from searchteam.rl.warm_start.data import likelihood_samples
from searchteam.runtime import Context, Sampling, make_backends, run_episodes
from searchteam.teams import TeamSettings
from searchteam.teams.transcript import Transcript
from searchteam.types import Episode, Question
from tests.rl.test_trainer import tokenizer  # noqa: F401  (the fixture)
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = Question(id="q", question="Which novelist was German?", golden_answers=["Thomas Mann"])


def run(
    responder, settings: TeamSettings | None = None, sampling: Sampling | None = None, question=QUESTION
) -> Episode:
    return run_with_requests(responder, settings, sampling, question)[0]


def run_with_requests(
    responder, settings: TeamSettings | None = None, sampling: Sampling | None = None, question=QUESTION
) -> tuple[Episode, list[GenerationRequest]]:
    team = get_team("search_r1", settings)
    llm = ScriptedLLM(responder)
    backends = make_backends({"policy": llm}, TinyRetriever(PASSAGES))
    episodes, _ = asyncio.run(
        run_episodes(team.run, "search_r1", [question], backends, sampling or Sampling(), progress=False)
    )
    assert episodes[0].error is None, episodes[0].error
    return episodes[0], llm.requests


def search_then_answer(req: GenerationRequest) -> str:
    if "<information>" not in req.continuation:
        return "<think> I need to know who is German. </think>\n<search> German novelist </search> junk"
    return "<think> Thomas Mann was German. </think>\n<answer> Thomas Mann </answer> trailing"


def test_search_loop_appends_information_and_parses_the_answer():
    ep = run(search_then_answer)
    assert ep.answer == "Thomas Mann"
    assert [t.role for t in ep.turns] == ["agent", "agent"] and all(t.parsed_ok for t in ep.turns)
    assert [r.query for r in ep.retrievals] == ["German novelist"] and ep.retrievals[0].k == 3
    # the second call continues the same reply: first completion (cut at </search>) + the information block
    second = ep.turns[1]
    assert ep.turns[0].completion.endswith("</search>")
    assert "Doc 1(Title: Thomas Mann) Thomas Mann was a German novelist." in ep.meta["transcript"][1]["text"]
    assert second.continuation_chars == len(ep.turns[0].completion) + len(ep.meta["transcript"][1]["text"])
    assert [s["action"] for s in ep.states] == ["search", "answer"]
    assert ep.states[0]["passages"][0] == "1"


def test_information_is_marked_as_environment_text():
    ep = run(search_then_answer)
    segments = ep.meta["transcript"]
    assert [s["source"] for s in segments] == ["model", "env", "model"]
    assert [s.get("turn") for s in segments] == [0, None, 1]
    assert segments[1]["text"].startswith("\n\n<information>") and segments[1]["text"].endswith(
        "</information>\n\n"
    )
    # env spans index the continuation each call saw; the model's own text lies outside them
    continuation = segments[0]["text"] + segments[1]["text"]
    assert ep.turns[0].env_spans == []
    [[start, end]] = ep.turns[1].env_spans
    assert continuation[start:end] == segments[1]["text"]
    assert continuation[:start] == ep.turns[0].completion


async def test_transcript_spans_cover_every_environment_segment():
    llm = ScriptedLLM(["A", "", "BB", "C"])
    ctx = Context(Episode(question=QUESTION, method="t"), make_backends({"policy": llm}, None), Sampling())
    transcript = Transcript(ctx.episode)
    first = await transcript.generate(ctx, "agent", [], stop=())
    transcript.add_env("<e1>")
    empty = await transcript.generate(ctx, "agent", [], stop=())  # an empty completion adds no segment
    transcript.add_env("<env2>")
    await transcript.generate(ctx, "agent", [], stop=())
    last = await transcript.generate(ctx, "agent", [], stop=())
    assert transcript.text == "A<e1><env2>BBC" and llm.requests[-1].continuation == "A<e1><env2>BB"
    assert first.env_spans == [] and empty.env_spans == [[1, 5]]
    assert last.env_spans == [[1, 5], [5, 11]] and last.continuation_chars == 13
    assert ctx.episode.meta["transcript"] == [
        {"source": "model", "text": "A", "turn": 0},
        {"source": "env", "text": "<e1>"},
        {"source": "env", "text": "<env2>"},
        {"source": "model", "text": "BB", "turn": 2},
        {"source": "model", "text": "C", "turn": 3},
    ]
    await ctx.backends.llms["policy"].aclose()


def test_invalid_action_gets_search_r1_observation_and_uses_a_turn():
    def responder(req: GenerationRequest) -> str:
        if "invalid" not in req.continuation:
            return "I think the answer is somewhere."
        return "<answer>Thomas Mann</answer>"

    ep = run(responder)
    assert ep.answer == "Thomas Mann"
    assert not ep.turns[0].parsed_ok and "neither" in ep.turns[0].parse_error
    env = [s for s in ep.meta["transcript"] if s["source"] == "env"]
    assert env[0]["text"].startswith("\nMy previous action is invalid.")
    assert ep.states[0]["action"] == "invalid" and not ep.retrievals


def test_max_turns_caps_searches_then_forces_an_answer():
    def always_search(req: GenerationRequest) -> str:
        if req.continuation.endswith("<answer>"):
            assert req.sampling.stop == ("</answer>",)
            return " Thomas Mann </answer>"
        return "<think> more </think><search> novelist </search>"

    ep = run(always_search, TeamSettings(top_k=2, max_turns=3))
    assert len(ep.retrievals) == 3 and all(r.k == 2 for r in ep.retrievals)
    assert len(ep.turns) == 4 and ep.turns[-1].step == 3
    assert ep.answer == "Thomas Mann" and ep.turns[-1].parsed_ok
    assert ep.meta["transcript"][-2] == {"source": "env", "text": "<answer>"}
    assert ep.states[-1]["action"] == "forced_answer"


def test_forced_answer_left_open_is_flagged():
    def rambling(req: GenerationRequest) -> str:
        if req.continuation.endswith("<answer>"):
            return " Thomas Mann. He was a German writer"
        return "<search> novelist </search>"

    ep = run(rambling, TeamSettings(max_turns=1))
    assert ep.answer == "Thomas Mann" and "unclosed" in ep.turns[-1].parse_error


def test_forced_answer_that_reopens_the_tag_is_parsed_on_its_own():
    def reopening(req: GenerationRequest) -> str:
        return (
            "\n<answer> Thomas Mann </answer>"
            if req.continuation.endswith("<answer>")
            else "<search>x</search>"
        )

    ep = run(reopening, TeamSettings(max_turns=1))
    assert ep.answer == "Thomas Mann" and ep.turns[-1].parsed_ok


def test_parse_action():
    assert parse_action("<think>x</think><search> a b </search>").content == "a b"
    assert parse_action("<answer>y</answer><search>z</search>").kind == "answer"
    assert parse_action("<search> </search>").error == "empty <search> tag"
    assert parse_action("<search>open").kind == "invalid"


def test_agent_sees_only_the_instruction_example_and_question():
    ep = run(search_then_answer)
    messages = ep.turns[1].messages
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[-1]["content"] == f"Question: {QUESTION.question}"
    assert "call a search engine by <search> query </search>" in messages[0]["content"]


# Search-R1's make_prefix (scripts/data_process/nq_search.py, template_type "base"), copied by hand: the
# "your want" typo and the trailing newline are the paper's.
PAPER_PROMPT = (
    "Answer the given question. You must conduct reasoning inside <think> and </think> first every time you "
    "get new information. After reasoning, if you find you lack some knowledge, you can call a search engine "
    "by <search> query </search> and it will return the top searched results between <information> and "
    "</information>. You can search as many times as your want. If you find no further external knowledge "
    "needed, you can directly provide the answer inside <answer> and </answer>, without detailed "
    "illustrations. For example, <answer> Beijing </answer>. Question: {question}\n"
)


def test_paper_prompt_is_search_r1_template_as_one_user_message():
    question = Question(id="q", question="  who wrote the magic mountain ", golden_answers=["Thomas Mann"])
    ep = run(search_then_answer, TeamSettings(options={"prompt": "paper"}), question=question)
    want = [{"role": "user", "content": PAPER_PROMPT.format(question="who wrote the magic mountain?")}]
    assert [t.messages for t in ep.turns] == [want, want]
    assert ep.answer == "Thomas Mann"
    # a question that ends with '?' keeps it once
    ep = run(search_then_answer, TeamSettings(options={"prompt": "paper"}))
    assert ep.turns[0].messages[0]["content"].endswith("Question: Which novelist was German?\n")


def always_search_then_answer(req: GenerationRequest) -> str:
    if req.continuation.endswith("<answer>"):
        return " Thomas Mann </answer>"
    return "<search> novelist </search>"


def test_action_and_answer_budgets_are_options():
    options = {"action_tokens": 500, "answer_tokens": 40}
    _, requests = run_with_requests(always_search_then_answer, TeamSettings(max_turns=2, options=options))
    assert [r.sampling.max_new_tokens for r in requests] == [500, 500, 40]
    _, requests = run_with_requests(always_search_then_answer, TeamSettings(max_turns=2))
    assert [r.sampling.max_new_tokens for r in requests] == [128, 128, 32]
    # the run's per-role limit overrides both; its global max_new_tokens does not
    sampling = Sampling(max_new_tokens=512, max_new_tokens_per_role={"agent": 64})
    _, requests = run_with_requests(
        always_search_then_answer, TeamSettings(max_turns=1, options=options), sampling
    )
    assert [r.sampling.max_new_tokens for r in requests] == [64, 64]


@pytest.mark.parametrize(
    "options",
    [{"prompt": "papers"}, {"action_tokens": 0}, {"answer_tokens": "500"}, {"action_tokens": True}],
)
def test_bad_options_are_refused(options):
    with pytest.raises(ValueError, match="search_r1 option"):
        get_team("search_r1", TeamSettings(options=options))


def test_run_config_options_reach_the_team():
    from searchteam.config import RunConfig
    from searchteam.factory import build_team

    team = build_team(RunConfig(method="search_r1", options={"prompt": "paper", "action_tokens": 500}))
    assert team.prompt == "paper" and team.action_tokens == 500 and team.answer_tokens == 32


def test_first_search_question_starts_from_the_questions_own_passages():
    def answer_after_reading(req: GenerationRequest) -> str:
        assert req.continuation.startswith(f"<search> {QUESTION.question} </search>\n\n<information>")
        return "<think> read </think>\n<answer> Thomas Mann </answer>"

    ep = run(answer_after_reading, TeamSettings(options={"first_search": "question"}))
    assert ep.answer == "Thomas Mann" and [r.query for r in ep.retrievals] == [QUESTION.question]
    assert [s["source"] for s in ep.meta["transcript"]] == ["env", "model"]
    assert ep.turns[0].env_spans == [[0, ep.turns[0].continuation_chars]]  # none of it is the model's


def test_new_passages_only_leaves_out_what_earlier_searches_returned():
    def same_query(req: GenerationRequest) -> str:
        if req.continuation.count("<information>") == 2:
            return "<answer> Thomas Mann </answer>"
        return "<search> German novelist </search>"

    team = get_team("search_r1", TeamSettings(top_k=1, new_passages_only=True))
    backends = make_backends({"policy": ScriptedLLM(same_query)}, TinyRetriever(PASSAGES))
    episodes, _ = asyncio.run(
        run_episodes(team.solve, "search_r1", [QUESTION], backends, Sampling(), progress=False)
    )
    first, second = ([p.id for p in r.passages] for r in episodes[0].retrievals)
    assert first == ["1"] and second and second[0] != "1"
    plain = run(same_query, TeamSettings(top_k=1))
    assert [p.id for r in plain.retrievals for p in r.passages] == ["1", "1"]


BRIDGE = Question(
    id="b",
    question="Which German novelist visited Paris?",
    golden_answers=["Thomas Mann"],
    meta={"supporting_titles": ["Thomas Mann", "Paris"]},
)


def test_bridge_hint_writes_the_search_for_a_missing_title_the_agent_has_read():
    settings = TeamSettings(top_k=1, options={"bridge_hint": True})
    ep, requests = run_with_requests(search_then_answer, settings, question=BRIDGE)
    # the agent's search found Thomas Mann; "Paris" is missing and named in the question: the environment
    # searches for it in the agent's name, once, and the agent answers from both
    assert [r.query for r in ep.retrievals] == ["German novelist", "Paris"]
    searched, written, answered = ep.turns
    assert written.meta == {"written": True} and written.role == "agent" and written.model == "policy"
    assert (
        written.completion == "<think> I still need to know about Paris. </think>\n<search> Paris </search>"
    )
    assert not written.prompt_token_ids and written.logprobs is None
    assert written.continuation == searched.completion + ep.meta["transcript"][1]["text"]
    assert [s.get("turn") for s in ep.meta["transcript"]] == [0, None, 1, None, 2]
    assert len(requests) == 2 and ep.answer == "Thomas Mann" and "written" not in answered.meta


def test_a_written_search_is_a_likelihood_sample_of_the_student(tokenizer):  # noqa: F811
    ep = run(search_then_answer, TeamSettings(top_k=1, options={"bridge_hint": True}), question=BRIDGE)
    samples = likelihood_samples([ep], tokenizer)
    written = ep.turns[1]
    assert len(samples) == 3 and all(s.sft for s in samples)
    ids = tokenizer(written.completion, add_special_tokens=False)["input_ids"]
    assert samples[1].completion_ids == ids and samples[1].loss_mask == [1] * len(ids)
    # its prompt holds what the agent had read: its own search and the information block
    assert tokenizer.decode(samples[1].prompt_ids).endswith(written.continuation)


def test_no_search_is_written_for_a_title_that_is_the_answer():
    # searching for the answer's own title would teach the agent to answer with what it searched
    answer_is_paris = BRIDGE.model_copy(update={"golden_answers": ["Paris"]})
    ep = run(
        search_then_answer, TeamSettings(top_k=1, options={"bridge_hint": True}), question=answer_is_paris
    )
    assert [r.query for r in ep.retrievals] == ["German novelist"]


def test_without_bridge_hint_the_agent_alone_acts():
    ep = run(search_then_answer, TeamSettings(top_k=1), question=BRIDGE)
    assert [r.query for r in ep.retrievals] == ["German novelist"]
