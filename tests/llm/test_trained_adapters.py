"""The trained LoRA adapters shipped in the package (`searchteam.llm.models.TRAINED`, model cards in
docs/models.md): each is a checkpoint of a preset that every backend loads by name."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from searchteam.llm.models import PRESETS, TRAINED, checkpoint_of
from searchteam.llm.ov import ov_base_and_adapters
from searchteam.methods import METHODS, shipped_recipes

MAX_ADAPTER_BYTES = 12_000_000  # "a few MB": the package carries them
REPOSITORY = Path(__file__).resolve().parents[2]  # a composed team's part names its recipe's file here


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_a_shipped_adapter_is_a_small_checkpoint_of_its_preset(name: str) -> None:
    trained = TRAINED[name]
    assert trained.method in METHODS and trained.base in PRESETS
    assert trained.recipe in shipped_recipes() or (trained.team and (REPOSITORY / trained.recipe).is_file())
    assert checkpoint_of(name) == str(trained.path) and checkpoint_of(trained.base) == trained.base
    configs = sorted((trained.path / "policy" / "adapters").glob("*/adapter_config.json"))
    assert configs, f"{name} ships no adapter"
    for config in configs:
        assert json.loads(config.read_text())["base_model_name_or_path"] == trained.base
        assert (config.parent / "adapter_model.safetensors").stat().st_size < MAX_ADAPTER_BYTES
    assert ov_base_and_adapters(str(trained.path))[0] == trained.base


def test_models_lists_presets_and_trained_adapters() -> None:
    from typer.testing import CliRunner

    from searchteam.cli import app

    piped = CliRunner().invoke(app, ["models"], env={"COLUMNS": "80"})  # not a terminal: one line each
    assert piped.exit_code == 0, piped.output
    assert [line.split("\t")[0] for line in piped.output.splitlines()] == [*PRESETS, *TRAINED]
    listed = json.loads(CliRunner().invoke(app, ["models", "--json"]).output)
    assert [entry["model"] for entry in listed] == [*PRESETS, *TRAINED]
    assert listed[-1]["description"] == TRAINED[listed[-1]["model"]].description


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_a_shipped_adapter_starts_its_recipe_again(name: str) -> None:
    """`init_from: NAME` in the recipe the adapter came from loads it into the trained policy, so more
    training continues from it."""
    import torch
    from safetensors.torch import load_file

    from searchteam.rl.policy import load_policy
    from searchteam.train.config import initial_checkpoint, load_train_run_config

    trained = TRAINED[name]
    base = PRESETS[trained.base]
    if not all(importlib.util.find_spec(p) for p in base.packages):
        pytest.skip(f"the base model's weights are not installed: {base.install}")
    recipe = REPOSITORY / trained.recipe if trained.team else Path(trained.recipe)
    cfg = load_train_run_config(recipe, {"init_from": name})
    policy = load_policy(cfg.model, cfg.train, device="cpu", dtype="bfloat16")
    policy.load_initial(initial_checkpoint(cfg))
    params = dict(policy.model.named_parameters())
    shipped = sorted((trained.path / "policy" / "adapters").glob("*/adapter_model.safetensors"))
    for adapter in shipped:  # one adapter, or one per role
        state = load_file(adapter)
        some = sorted(state)[0]
        loaded = params[some.replace(".weight", f".{adapter.parent.name}.weight")]
        assert torch.equal(loaded.detach().to(state[some].dtype), state[some])


def test_an_adapter_brings_its_run_settings_to_its_own_method(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unset fields take the adapter's run settings, dicts merge with the run's keys winning, and another
    method or a plain preset gets none of them."""
    from searchteam.factory import load_run_config
    from searchteam.llm.models import TrainedAdapter

    options = {"mode": "submodule", "max_retries": 2}
    settings = {"options": options, "role_models": {"generator": "g"}, "top_k": 1}
    adapter = TrainedAdapter("q-test", "qagent", "qwen2.5-coder-0.5b", "qagent/qwen0.5b-cpu", "", settings)
    monkeypatch.setitem(TRAINED, "q-test", adapter)

    plain = load_run_config(None, {"method": "qagent", "model": "q-test"})
    assert plain.options == {"mode": "submodule", "max_retries": 2}
    assert plain.role_models == {"generator": "g"} and plain.top_k == 1

    run = {"method": "qagent", "model": "q-test", "options": {"max_retries": 0}, "top_k": 3}
    given = load_run_config(None, run)
    assert given.options == {"mode": "submodule", "max_retries": 0} and given.top_k == 3

    assert load_run_config(None, {"method": "naive_rag", "model": "q-test"}).options == {}
    assert load_run_config(None, {"method": "qagent", "model": "qwen2.5-coder-0.5b"}).role_models == {}


def test_a_composed_teams_part_brings_its_run_settings_to_that_team_only(monkeypatch: pytest.MonkeyPatch):
    from searchteam.factory import load_run_config
    from searchteam.llm.models import TrainedAdapter

    settings = {"role_models": {"answer": "qwen2.5-coder-1.5b"}}
    part = TrainedAdapter(
        "g-test", "search_r1", "qwen2.5-coder-0.5b", "", "", settings, team="search_r1-from-top5"
    )
    monkeypatch.setitem(TRAINED, "g-test", part)
    in_its_team = load_run_config(None, {"method": "search_r1-from-top5", "model": "g-test"})
    assert in_its_team.role_models == {"answer": "qwen2.5-coder-1.5b"}
    alone = load_run_config(None, {"method": "search_r1", "model": "g-test"})
    assert alone.role_models == {}  # Search-R1 alone has no `answer` role


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_a_shipped_adapter_runs_its_method_with_its_settings(name: str) -> None:
    """Its run settings are valid for its method (a composed team's part: for its team), and the role models
    they name are presets (nothing to download)."""
    from searchteam.factory import build_team, load_run_config

    trained = TRAINED[name]
    cfg = load_run_config(None, {"method": trained.team or trained.method, "model": name})
    assert cfg.role_models.items() >= trained.run_settings.get("role_models", {}).items()
    build_team(cfg)  # an option or role the method does not have is a ConfigError
    assert all(model in PRESETS for model in cfg.role_models.values())
