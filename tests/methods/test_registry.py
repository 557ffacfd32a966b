"""One package per method, one registry; recipes by name; the typed fields teams, rewards and the trainer
share, and older results files that kept them in `meta`."""

from __future__ import annotations

from pathlib import Path

import pytest

from searchteam.errors import ConfigError
from searchteam.methods import (
    METHODS,
    REGISTRY,
    build_reward_scheme,
    get_method,
    get_team,
    register_method,
    resolve_config_path,
    shipped_recipes,
)
from searchteam.methods.naive_rag.team import NaiveRAG
from searchteam.rl.experience import samples_from_episodes
from searchteam.teams import Team, TeamSettings
from searchteam.types import Episode, Question, Turn

PACKAGE = Path(REGISTRY["mask"].folder).parent


def test_every_method_folder_is_one_registered_method_with_its_files():
    folders = sorted(p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists())
    assert folders == sorted(METHODS)
    for name, method in REGISTRY.items():
        assert method.folder == PACKAGE / name and method.team.name == name
        assert (method.folder / "team.py").is_file() and (method.folder / "prompts.yaml").is_file()
        assert method.purpose == method.team.description and method.reward is not None
        for kind in method.recipes:
            assert method.recipe_path(kind).is_file()  # type: ignore[union-attr]
    assert list(METHODS)[:2] == ["direct", "naive_rag"]  # listings follow the registered positions


def test_every_team_answers_through_team_solve():
    """eval, train and serve run `team.solve` (the answer, a copied prompt example withdrawn): a team's own
    method of that name would take its place and fail every episode (JADE's executors once did)."""
    for name, team in METHODS.items():
        assert team.solve is Team.solve, f"{name} overrides Team.solve"


def test_a_method_registers_once_and_names_only_recipes_it_ships():
    with pytest.raises(ValueError, match="registered twice"):
        register_method(NaiveRAG, position=99)
    missing = type("Missing", (NaiveRAG,), {"name": "missing_method"})
    with pytest.raises(ValueError, match="does not exist"):
        register_method(missing, position=99, recipes={"cpu": "no-such-recipe"})
    assert "missing_method" not in REGISTRY


def test_a_new_method_is_one_folder_whose_tests_and_declarations_the_generic_suites_find(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A method added as one folder (here in a temporary folder that the registry also reads) is registered
    with its recipe and its trained adapter, and the generic suites find what its tests/contract.py
    declares."""
    import sys

    import searchteam.llm.models as models
    import searchteam.methods as methods
    from tests.support.contracts import fuzz_targets, option_branches

    folder = tmp_path / "echo_method"
    (folder / "tests").mkdir(parents=True)
    (folder / "recipes").mkdir()
    (folder / "__init__.py").write_text(
        "from searchteam.methods import register_method\n"
        "from searchteam.methods.echo_method.team import Echo\n"
        "register_method(Echo, recipes={'cpu': 'tiny-cpu'})\n"
    )
    (folder / "team.py").write_text(
        "from searchteam.methods.naive_rag.team import NaiveRAG\n"
        "class Echo(NaiveRAG):\n    name = 'echo_method'\n    description = 'naive RAG under another name'\n"
    )
    (folder / "recipes" / "tiny-cpu.yaml").write_text("# a throwaway recipe\nmethod: echo_method\n")
    (folder / "tests" / "__init__.py").write_text("")
    (folder / "tests" / "contract.py").write_text(
        "from tests.support.contracts import FuzzTarget, check_optional_text\n"
        "FUZZ_TARGETS = [FuzzTarget('echo.strip', str.strip, ('echo',), check_optional_text)]\n"
        "OPTION_BRANCHES = [({'x': 1}, 'QDS')]\n"
    )
    shipped = folder / "adapters" / "echo-adapter"
    (shipped / "policy" / "adapters" / "policy").mkdir(parents=True)
    (shipped / "adapter.yaml").write_text(
        "base: smollm2-135m\nrecipe: echo_method/tiny-cpu\ndescription: echo\n"
    )
    monkeypatch.setattr(models, "TRAINED", dict(models.TRAINED))
    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))
    monkeypatch.setattr(methods, "__path__", [*methods.__path__, str(tmp_path)])
    monkeypatch.setattr(methods, "REGISTRY", methods._load_packages())
    try:
        echo = methods.get_method("echo_method")
        assert echo.folder == folder and type(get_team("echo_method")).__name__ == "Echo"
        assert list(methods.REGISTRY)[-1] == "echo_method"  # no position given: listed after the shipped ones
        assert shipped_recipes()["echo_method/tiny-cpu"] == (
            folder / "recipes" / "tiny-cpu.yaml",
            "a throwaway recipe",
        )
        assert "echo.strip" in [t.name for t in fuzz_targets()]
        assert option_branches(echo) == [({"x": 1}, "QDS")]
        adapter = models.TRAINED["echo-adapter"]
        assert (adapter.method, adapter.base, adapter.description) == ("echo_method", "smollm2-135m", "echo")
        assert models.checkpoint_of("echo-adapter") == str(shipped)
    finally:
        for name in [m for m in sys.modules if m.startswith("searchteam.methods.echo_method")]:
            del sys.modules[name]


def test_every_method_s_own_tests_are_collected() -> None:
    """A method's tests sit in its folder's tests/, which the test run collects (pytest's testpaths)."""
    import tomllib

    root = PACKAGE.parent.parent.parent
    testpaths = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"][
        "testpaths"
    ]
    for method in REGISTRY.values():
        tests = method.folder / "tests"
        assert not tests.exists() or any(tests.is_relative_to(root / path) for path in testpaths)


def test_shipped_recipes_are_named_by_method_model_and_device():
    recipes = shipped_recipes()
    assert {"mask/qwen0.5b-cpu", "qagent/qwen0.5b-cpu-reader", "search_r1/qwen3b-gpu"} <= set(recipes)
    for name, (path, purpose) in recipes.items():
        method, _ = name.split("/")
        assert method in METHODS and path.parent == PACKAGE / method / "recipes"
        assert purpose and "searchteam train --config " + name in path.read_text(encoding="utf-8")
        assert resolve_config_path(Path(name)) == path == resolve_config_path(Path(name + ".yaml"))
    assert get_method("mask").recipe_path("gpu") == recipes["mask/qwen7b-gpu"][0]


def test_an_unknown_recipe_name_lists_the_shipped_ones_in_one_line():
    with pytest.raises(ConfigError) as caught:
        resolve_config_path(Path("mask/qwen05b-cpu"))
    message = str(caught.value)
    assert "\n" not in message and "did you mean 'mask/qwen0.5b-cpu'?" in message
    assert "shipped recipes: " in message and "jade/smollm135m-cpu" in message


def test_the_typed_fields_decide_what_is_trained():
    tokens = {"Paris": [5], "Lyon": [6], "<answer>Paris</answer>": [7, 5, 8]}

    class Tokenizer:
        def __call__(self, text: str, add_special_tokens: bool = False) -> dict[str, list[int]]:
            return {"input_ids": tokens.get(text, [1, 2])}

    question = Question(id="q", question="?", golden_answers=["Paris"])
    turns = [
        Turn(role="generator", completion="Paris", prompt_token_ids=[3], frozen=True),
        Turn(role="generator", completion="Lyon", prompt_token_ids=[3], subgroup="hp", sft_target="Paris"),
    ]
    episode = Episode(question=question, method="dac", turns=turns)
    samples = samples_from_episodes([episode], Tokenizer(), sft_targets=True)
    assert [(s.turn_index, s.subgroup, s.sft, s.completion_ids) for s in samples] == [
        (1, "hp", False, [6]),
        (1, "hp", True, [5]),
    ]


def test_a_reward_scheme_writes_the_episode_reward_fields_and_skips_frozen_turns():
    question = Question(id="q", question="?", golden_answers=["Paris"])
    turns = [Turn(role="answer", completion="x"), Turn(role="answer", completion="y", frozen=True)]
    episode = Episode(question=question, method="naive_rag", turns=turns, answer="Paris")
    build_reward_scheme("naive_rag")([episode])
    assert episode.reward == 1.0 and episode.reward_terms["em"] == 1.0 and "reward" not in episode.meta
    assert [t.reward for t in episode.turns] == [1.0, None]


def test_team_options_are_typed_and_never_coerced():
    """The string "false" is not a bool and "3" is not a number: each is refused, naming what it takes."""
    given = {
        "dac": {"abstain": "false"},
        "decor": {"truncate_on_format_error": "false"},
        "qagent": {"mode": "submodule", "frozen_generator": "false"},
    }
    for method, options in given.items():
        with pytest.raises(ConfigError, match=f"{method} option '.*' must be true or false, not 'false'"):
            get_team(method, TeamSettings(options=options))
    with pytest.raises(ConfigError, match="ircot option 'max_passages': input should be a valid integer"):
        get_team("ircot", TeamSettings(options={"max_passages": "3"}))
    with pytest.raises(ConfigError, match="unknown option 'max_querys' .* did you mean 'max_queries'"):
        get_team("static_pipeline", TeamSettings(options={"max_querys": 2}))
    team = get_team("dac", TeamSettings(options={"abstain": False}))
    assert team.options.abstain is False and team.options.hard_positives is None
    assert REGISTRY["qagent"].team.option_names == ("mode", "max_retries", "frozen_generator")


def test_a_record_is_written_and_read_through_its_typed_fields() -> None:
    """The team → reward contract (`types.Record`): only the fields given are written, a field not written
    reads as its default, and a value of the wrong type is an error rather than a silent default."""
    from pydantic import ValidationError

    from searchteam.types import Record

    class Recorded(Record):
        rounds: int | None = None
        query: str | None = None

    turn = Turn(role="planner", meta={"other": 1})
    Recorded(query=None).write(turn)
    assert turn.meta == {"other": 1, "query": None}
    assert Recorded.of(turn) == Recorded()
    Recorded(rounds=3).write(turn)
    assert Recorded.of(turn).rounds == 3
    with pytest.raises(ValidationError):
        Recorded.of(Turn(role="planner", meta={"rounds": "three"}))
