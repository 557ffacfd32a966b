"""Teams from parts (`searchteam.methods.composed`): a team file composes registered methods as gatherers and
a reader into one episode; parts that cannot play their place are refused in one line; each trained part is
scored by its own method's scheme on its own turns and retrievals; a method folder made outside the package
composes without edits elsewhere."""

from __future__ import annotations

import asyncio
import sys
import textwrap
from pathlib import Path

import pytest

from searchteam.errors import ConfigError, ShipError
from searchteam.llm.base import GenerationRequest
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import build_reward_scheme, get_method, get_team
from searchteam.methods.composed import ComposedRecord, PartRecord
from searchteam.runtime import Sampling, make_backends, run_episodes
from searchteam.ship import adapters_folder
from searchteam.teams import TeamSettings
from searchteam.train.config import refuse_warm_start_only
from searchteam.types import Episode, Question, Retrieval
from tests.support.helpers import PASSAGES, TinyRetriever
from tests.support.reward_episodes import episode, question, retrieval, turn

QUESTION = Question(id="q", question="Which novelist was German?", golden_answers=["Thomas Mann"])


def team_file(folder: Path, text: str, name: str = "team") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def run(method: str, responder, question: Question = QUESTION) -> tuple[Episode, list[GenerationRequest]]:
    llm = ScriptedLLM(responder)
    backends = make_backends({"policy": llm}, TinyRetriever(PASSAGES))
    team = get_team(method)
    episodes, _ = asyncio.run(
        run_episodes(team.solve, method, [question], backends, Sampling(), progress=False)
    )
    assert episodes[0].error is None, episodes[0].error
    return episodes[0], llm.requests


def agent_then_reader(req: GenerationRequest) -> str:
    if req.role == "answer":
        return "Thomas Mann</answer>"
    if "<information>" not in req.continuation:
        return "<search> Paris capital </search>"
    return "<answer> Paris </answer>"


TOP2_THEN_SEARCH_R1 = """
    gatherers:
      - {method: naive_rag, top_k: 2}
      - {method: search_r1, new_passages_only: true, max_turns: 2}
    merge: {k: 10}
    reader: {method: naive_rag}
"""


def test_a_composed_episode_holds_every_part_and_the_reader_reads_the_merged_evidence(tmp_path):
    path = team_file(tmp_path, TOP2_THEN_SEARCH_R1)
    ep, requests = run(str(path), agent_then_reader)
    assert [t.role for t in ep.turns] == ["agent", "agent", "answer"]
    assert ep.answer == "Thomas Mann" and ep.meta["gatherer_answers"] == {"search_r1": "Paris"}
    top2, searched = ep.retrievals
    assert [p.id for p in top2.passages] == ["1", "2"]  # the question's own top-2
    assert [p.id for p in searched.passages] == ["3"]  # new passages only: the top-2 left out
    record = ComposedRecord.of(ep)
    assert record.evidence == ["1", "2", "3"]
    assert [(p.place, p.method, p.roles, p.passages, p.retrievals) for p in record.parts] == [
        ("gatherer", "naive_rag", [], ["1", "2"], (0, 1)),
        ("gatherer", "search_r1", ["agent"], ["3"], (1, 2)),
        ("reader", "naive_rag", ["answer"], [], (0, 0)),
    ]
    reader_prompt = requests[-1].messages[-1]["content"]
    assert (
        reader_prompt.index("Thomas Mann was")
        < reader_prompt.index("Guterson")
        < reader_prompt.index("Paris")
    )
    assert ep.states[-1]["evidence"] == ["1", "2", "3"]  # the trace shows the merge too


def test_the_merge_keeps_the_first_k_distinct_passages(tmp_path):
    path = team_file(
        tmp_path, TOP2_THEN_SEARCH_R1.replace("k: 10", "k: 2").replace(", new_passages_only: true", "")
    )
    ep, requests = run(str(path), agent_then_reader)
    assert ComposedRecord.of(ep).evidence == ["1", "2"]
    assert "Paris is the capital" not in requests[-1].messages[-1]["content"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "gatherers: [{method: direct}]\nreader: {method: naive_rag}",
            "direct cannot be a gatherer; those that can: naive_rag, ircot, static_pipeline, search_r1, "
            "mask, qagent, decor, dac, jade",
        ),
        (
            "gatherers: [{method: naive_rag}]\nreader: {method: search_r1}",
            "search_r1 cannot be a reader; those that can: naive_rag, ircot, qagent, dac",
        ),
        (
            "gatherers: [{method: qagent}, {method: search_r1}]\nreader: {method: naive_rag}",
            "qagent and search_r1 both call the role 'agent'; a composed episode keeps roles distinct, so "
            "compose parts whose roles differ",
        ),
        ("gatherers: []\nreader: {method: naive_rag}", "gatherers: List should have at least 1 item"),
        (
            "gatherers: [{method: naive_rag, k: 3}]\nreader: {method: naive_rag}",
            "gatherers.0.k: Extra inputs",
        ),
    ],
    ids=["not-a-gatherer", "not-a-reader", "same-role", "no-gatherer", "unknown-key"],
)
def test_a_part_that_cannot_play_its_place_is_refused_in_one_line(tmp_path, text, expected):
    path = team_file(tmp_path, text)
    with pytest.raises(ConfigError) as error:
        get_method(str(path))
    assert str(error.value).startswith(f"team file {path.resolve()}: {expected}")
    assert "\n" not in str(error.value)


def test_a_composed_team_refuses_run_level_part_settings(tmp_path):
    path = team_file(tmp_path, TOP2_THEN_SEARCH_R1)
    with pytest.raises(ConfigError, match=r"set top_k per part in .*team\.yaml, not for the run"):
        get_team(str(path), TeamSettings(top_k=3))


def test_run_options_reach_a_part_by_its_method_over_the_files_options(tmp_path):
    path = team_file(
        tmp_path, TOP2_THEN_SEARCH_R1.replace("max_turns: 2}", "max_turns: 2, options: {action_tokens: 9}}")
    )
    settings = TeamSettings(options={"search_r1": {"first_search": "question"}})
    team = get_team(str(path), settings)
    agent = team.gatherers[1]
    assert (agent.options.action_tokens, agent.options.first_search) == (9, "question")
    assert team.privileged_options() == []


@pytest.mark.parametrize("options", [{"dac": {"hard_positives": False}}, {"search_r1": "question"}])
def test_run_options_not_by_part_are_refused(tmp_path, options):
    path = team_file(tmp_path, TOP2_THEN_SEARCH_R1)
    with pytest.raises(ConfigError, match=r"composed team's options are by part.*naive_rag, search_r1"):
        get_team(str(path), TeamSettings(options=options))


def test_a_parts_privileged_option_is_refused_outside_a_warm_start(tmp_path):
    path = team_file(tmp_path, TOP2_THEN_SEARCH_R1)
    team = get_team(str(path), TeamSettings(options={"search_r1": {"bridge_hint": True}}))
    assert team.privileged_options() == ["search_r1.bridge_hint"]
    with pytest.raises(
        ConfigError, match=r"options.search_r1.bridge_hint is for a warm start's sampling only"
    ):
        refuse_warm_start_only(team)


def test_a_composed_runs_adapter_ships_to_its_trained_parts_method(tmp_path):
    path = team_file(tmp_path, TOP2_THEN_SEARCH_R1)
    gatherer = {"method": str(path), "reward": {"train": "gatherers"}}
    assert adapters_folder(gatherer) == get_method("search_r1").folder / "adapters"
    assert (
        adapters_folder({**gatherer, "reward": {"train": "reader"}})
        == get_method("naive_rag").folder / "adapters"
    )
    assert adapters_folder({"method": "dac"}) == get_method("dac").folder / "adapters"
    two = team_file(
        tmp_path, "gatherers: [{method: dac}, {method: search_r1}]\nreader: {method: naive_rag}", "two"
    )
    with pytest.raises(
        ShipError, match="two trained dac and search_r1: say where the adapter goes with --into"
    ):
        adapters_folder({"method": str(two), "reward": {"train": "gatherers"}})


def test_a_team_file_in_a_known_folder_is_found_by_its_name(tmp_path, monkeypatch):
    team_file(tmp_path, TOP2_THEN_SEARCH_R1, name="my-team")
    monkeypatch.setenv("SEARCHTEAM_TEAMS", str(tmp_path))
    method = get_method("my-team")
    assert method.name == "my-team" and method.team.roles == ("agent", "answer")
    with pytest.raises(KeyError, match="or a composed team's YAML file"):
        get_method("no-such-team")


# ---- a method folder made outside the package composes without edits elsewhere -----------------------------

THROWAWAY_TEAM = """
from searchteam.methods import register_method
from searchteam.teams.answering import answer_call
from searchteam.teams.base import Team, format_documents


class Throwaway(Team):
    name = "throwaway"
    description = "a method folder made by a test"
    roles = ("guesser",)

    async def run(self, q, ctx):
        return await self.read(q, ctx, await self.gather(q, ctx))

    async def gather(self, q, ctx):
        return await ctx.search("German novelist", k=1)

    async def read(self, q, ctx, passages):
        documents = format_documents(passages)
        return await answer_call(ctx, self, role="guesser", question=q.question, documents=documents)


register_method(Throwaway)
"""
THROWAWAY_PROMPTS = """
system: Answer from the documents.
user: "{documents}\\nQuestion: {question}"
"""


@pytest.fixture
def throwaway_method(tmp_path, monkeypatch):
    """A method folder `throwaway` beside the shipped ones, loaded as the registry loads them."""
    import searchteam.methods as methods

    folder = tmp_path / "throwaway"
    folder.mkdir()
    (folder / "__init__.py").write_text(THROWAWAY_TEAM, encoding="utf-8")
    (folder / "prompts.yaml").write_text(THROWAWAY_PROMPTS, encoding="utf-8")
    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))
    monkeypatch.setattr(methods, "__path__", [*methods.__path__, str(tmp_path)])
    monkeypatch.setattr(methods, "REGISTRY", methods._load_packages())
    yield "throwaway"
    sys.modules.pop("searchteam.methods.throwaway")


def test_a_new_method_folder_composes_as_a_gatherer_and_as_a_reader(tmp_path, throwaway_method):
    as_gatherer = team_file(
        tmp_path,
        "gatherers: [{method: throwaway}, {method: naive_rag, top_k: 1}]\nreader: {method: dac}",
        "g",
    )
    ep, _ = run(str(as_gatherer), lambda req: "Thomas Mann</answer>")
    assert [p.method for p in ComposedRecord.of(ep).parts] == ["throwaway", "naive_rag", "dac"]
    assert [t.role for t in ep.turns] == ["generator"] and ep.answer == "Thomas Mann"

    as_reader = team_file(
        tmp_path, "gatherers: [{method: naive_rag, top_k: 2}]\nreader: {method: throwaway}", "r"
    )
    ep, requests = run(str(as_reader), lambda req: "Thomas Mann</answer>")
    assert [t.role for t in ep.turns] == ["guesser"] and ep.answer == "Thomas Mann"
    assert "David Guterson" in requests[0].messages[-1]["content"]


# ---- training one place at a time: each part's own scheme on its own view ---------------------------------


def composed_episode(answer: str, golds: tuple[str, ...]) -> Episode:
    """The question's top-1 (holds the gold "Paris"), then a DAC searcher whose own search found none; naive
    RAG's reader answered `answer`."""
    ep = episode(
        "composed",
        [turn("searcher", 0), turn("searcher", 1), turn("answer", 2)],
        answer,
        retrievals=[retrieval(0, "Paris is the capital of France."), retrieval(1, "Lyon is a city.")],
    )
    ep.question = question(golds=golds)
    parts = [
        PartRecord(place="gatherer", method="naive_rag", roles=[], retrievals=(0, 1)),
        PartRecord(place="gatherer", method="dac", roles=["searcher"], retrievals=(1, 2)),
        PartRecord(place="reader", method="naive_rag", roles=["answer"]),
    ]
    ComposedRecord(parts=parts).write(ep)
    return ep


@pytest.fixture
def composed_method(tmp_path):
    path = team_file(tmp_path, "gatherers: [{method: naive_rag}, {method: dac}]\nreader: {method: naive_rag}")
    return str(path)


def test_a_trained_gatherer_gets_its_own_papers_credit_on_its_own_retrievals(composed_method):
    ep = composed_episode("Paris", ("Paris",))
    build_reward_scheme(composed_method, {"train": "gatherers"})([ep])
    # DAC's r_S = 1[s ∧ ¬abstained] (Eq. 1) on its last searcher turn, 0 before it: s counts only the DAC
    # part's own search (Lyon), not the top-1 that holds Paris, so r_S = 0 though the reader was right.
    assert [t.reward for t in ep.turns_of("searcher")] == [0.0, 0.0]
    assert ep.turns_of("answer")[0].reward is None and ep.turns_of("answer")[0].frozen
    assert ep.reward_terms["dac/searcher"] == 0.0 and ep.reward == 1.0  # DAC's outcome: EM of the answer


def test_a_trained_gatherer_is_rewarded_by_the_readers_answer(composed_method):
    ep = composed_episode("Lyon", ("Lyon",))  # the DAC searcher's own passage holds the gold answer
    build_reward_scheme(composed_method, {"train": "gatherers"})([ep])
    assert [t.reward for t in ep.turns_of("searcher")] == [0.0, 1.0]  # r_S on the last searcher turn
    assert ep.reward_terms["dac/generator"] == 1.0  # r_G = EM of the reader's answer "Lyon"


def test_a_trained_reader_gets_its_own_outcome_and_the_gatherers_are_frozen(composed_method):
    ep = composed_episode("Paris France", ("Paris",))
    build_reward_scheme(composed_method, {"train": "reader", "part": {"metric": "f1"}})([ep])
    assert ep.turns_of("answer")[0].reward == pytest.approx(2 / 3)  # F1("Paris France", ["Paris"])
    assert all(t.frozen and t.reward is None for t in ep.turns_of("searcher"))


def test_training_a_place_needs_a_part_there_that_calls_a_model(tmp_path):
    path = team_file(tmp_path, "gatherers: [{method: naive_rag}]\nreader: {method: naive_rag}")
    frozen = get_method(str(path)).training_models
    config = type("Cfg", (), {"reward": {"train": "gatherers"}, "role_models": {}, "model": "m"})()
    with pytest.raises(ConfigError, match="no gatherers part calls a model, so there is nothing to train"):
        frozen(config)


def test_retrievals_keep_their_order_in_the_part_view(composed_method):
    from searchteam.methods.composed import part_view

    ep = composed_episode("Paris", ("Paris",))
    dac = ComposedRecord.of(ep).parts[1]
    view = part_view(ep, dac)
    assert [t.role for t in view.turns] == ["searcher", "searcher"] and view.turns[0] is ep.turns[0]
    assert [r.passages[0].text for r in view.retrievals] == ["Lyon is a city."]
    assert isinstance(view.retrievals[0], Retrieval) and view.answer == "Paris"
