"""The command line's one surface: the run flags shared by ask, eval, serve and train, `--set`, a uniform
`--resume`, `recipes`, `ship-adapter`, `--version`, and an `ask` trace that lists turns and searches in the
order they ran (scripted LLM double and tiny retriever; a tiny real LoRA checkpoint for ship-adapter)."""

from __future__ import annotations

import json
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import typer
import yaml
from safetensors.torch import load_file
from typer.main import get_command
from typer.testing import CliRunner

import searchteam.factory as factory
from searchteam.cli import app
from searchteam.cli.flags import QUESTION_FLAGS, RUN_FLAGS
from searchteam.config import RunConfig, load_config, parse_settings
from searchteam.errors import ConfigError
from searchteam.factory import Components
from searchteam.llm.scripted import ScriptedLLM
from searchteam.methods import get_team, shipped_recipes
from searchteam.train.config import TrainRunConfig, load_train_run_config
from tests.support.helpers import PASSAGES, TinyRetriever

QUESTION = "Which novelist was German, David Guterson or Thomas Mann?"
WIDE = {"COLUMNS": "200"}


def params(command: str) -> dict[str, Any]:
    """The click parameters of `searchteam COMMAND` by name."""
    return {p.name: p for p in get_command(app).commands[command].params}  # type: ignore[attr-defined]


def trace_rows(output: str) -> list[tuple[str, str]]:
    """(step, role) of each row of the printed trace table; a wrapped cell's extra lines have no step."""
    rows = []
    for line in output.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 3 and cells[1].isdigit():
            rows.append((cells[1], cells[2]))
    return rows


def scripted_team(monkeypatch: pytest.MonkeyPatch, method: str, replies: list[str]) -> None:
    llm = ScriptedLLM(replies)
    parts = Components(get_team(method), {"policy": llm}, TinyRetriever(PASSAGES))
    monkeypatch.setattr(factory, "build_components", lambda config: parts)


# --- the trace -----------------------------------------------------------------------------------------


def test_ask_trace_puts_naive_rags_search_above_the_answer_it_fed(monkeypatch: pytest.MonkeyPatch):
    scripted_team(monkeypatch, "naive_rag", ["Thomas Mann"])
    result = CliRunner().invoke(app, ["ask", QUESTION, "--method", "naive_rag"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert trace_rows(result.output) == [("0", "search"), ("0", "answer")]
    assert result.output.rstrip().endswith("Answer: Thomas Mann")


def test_ask_trace_puts_a_search_after_the_turn_that_wrote_its_query(monkeypatch: pytest.MonkeyPatch):
    replies = ["<search>German novelist Thomas Mann</search>", "<answer>Thomas Mann</answer>"]
    scripted_team(monkeypatch, "search_r1", replies)
    result = CliRunner().invoke(app, ["ask", QUESTION, "--method", "search_r1"], env=WIDE)
    assert result.exit_code == 0, result.output
    assert trace_rows(result.output) == [("0", "agent"), ("0", "search"), ("1", "agent")]

    scripted_team(monkeypatch, "search_r1", replies)
    result = CliRunner().invoke(app, ["ask", QUESTION, "--method", "search_r1", "--json"])
    trace = json.loads(result.output)
    assert [s["after_turns"] for s in trace["searches"]] == [1]  # JSON readers can interleave the same way


def test_ask_trace_shows_model_text_with_brackets_verbatim(monkeypatch: pytest.MonkeyPatch):
    scripted_team(monkeypatch, "naive_rag", ["1[format] Thomas Mann"])
    result = CliRunner().invoke(app, ["ask", QUESTION, "--method", "naive_rag"], env=WIDE)
    assert "│ 1[format] Thomas Mann" in result.output
    assert result.output.rstrip().endswith("Answer: 1[format] Thomas Mann")


# --- shared flags ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ask", "eval", "serve", "train"])
def test_run_flags_are_offered_by_every_command_that_runs_a_team(command: str):
    assert set(RUN_FLAGS) <= set(params(command))


@pytest.mark.parametrize("command", ["eval", "train"])
def test_question_flags_and_resume_are_the_same_on_eval_and_train(command: str):
    assert set(QUESTION_FLAGS) <= set(params(command))
    resume = params(command)["resume"]
    assert resume.opts == ["--resume"] and resume.secondary_opts == ["--no-resume"]
    assert resume.default is None  # not given: the config's `resume`, whose default is False
    assert RunConfig().resume is False


def captured_eval(monkeypatch: pytest.MonkeyPatch) -> dict[str, RunConfig]:
    """`searchteam eval` stopping right after its config is built, which it leaves in the returned dict."""
    import searchteam.eval.runner as runner

    seen: dict[str, RunConfig] = {}

    def evaluate(config: RunConfig) -> None:
        seen["config"] = config
        raise typer.Exit(0)

    monkeypatch.setattr(runner, "evaluate", evaluate)
    return seen


def test_set_applies_after_the_config_file_and_before_the_flags(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    config = tmp_path / "run.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "temperature": 0.5,
                "top_p": 0.9,
                "role_models": {"planner": "plan-model"},
                "engine": {"max_num_seqs": 8, "enforce_eager": True},
            }
        )
    )
    seen = captured_eval(monkeypatch)
    args = ["eval", "--config", str(config), "--set", "temperature=0.7", "--set", "top_p=0.8"]
    args += ["--set", "engine.max_num_seqs=16", "--set", "datasets=[nq, hotpotqa]", "--temperature", "0.2"]
    args += ["--set", "role_models.generator=gen-model"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cfg = seen["config"]
    assert cfg.temperature == 0.2 and cfg.top_p == 0.8  # flag over --set over the file
    assert cfg.engine.max_num_seqs == 16 and cfg.engine.enforce_eager  # a nested field; its section stays
    assert cfg.datasets == ["nq", "hotpotqa"]
    assert cfg.role_models == {"planner": "plan-model", "generator": "gen-model"}


def test_a_misspelled_set_key_gets_the_did_you_mean_error(monkeypatch: pytest.MonkeyPatch):
    captured_eval(monkeypatch)
    for item, hint in [("tmperature=0.3", "'temperature'"), ("engine.max_num_seq=4", "'max_num_seqs'")]:
        result = CliRunner().invoke(app, ["eval", "--set", item])
        assert result.exit_code == 2
        assert f"did you mean {hint}?" in result.stderr and "Traceback" not in result.output
    result = CliRunner().invoke(app, ["eval", "--set", "temperature"])
    assert result.exit_code == 2 and "expected KEY=VALUE" in result.stderr


def test_set_reaches_nested_training_fields_of_a_recipe():
    recipe = Path("qagent/smollm135m-cpu")
    base = load_train_run_config(recipe, {})
    settings = parse_settings(["train.lr=0.00002", "reward.stage=2", "train.steps=7", "group_size=3"])
    cfg = load_train_run_config(recipe, {"train.steps": 5}, settings)
    assert cfg.train.lr == 2e-5 and cfg.group_size == 3
    assert cfg.train.steps == 5  # --steps over --set train.steps
    assert cfg.reward == {**base.reward, "stage": 2}
    assert cfg.train.estimator == base.train.estimator  # the recipe's other training fields stay
    with pytest.raises(ConfigError, match="field 'train.lrr'.*did you mean 'lr'"):
        load_train_run_config(recipe, {}, parse_settings(["train.lrr=1"]))


def test_set_refuses_a_field_of_a_plain_value():
    with pytest.raises(ConfigError, match="cannot set 'model.name': 'model' is 'x', not a section"):
        load_config(None, {}, RunConfig, parse_settings(["model=x", "model.name=y"]))
    with pytest.raises(ConfigError, match="field 'model': Input should be a valid string"):
        load_config(None, {}, RunConfig, parse_settings(["model.name=y"]))


def test_set_reads_values_as_yaml():
    assert parse_settings(["a=true", "b=null", "c=3", "d=[x, y]", "e=", "f=a=b"]) == {
        "a": True,
        "b": None,
        "c": 3,
        "d": ["x", "y"],
        "e": "",
        "f": "a=b",
    }


class FakeTrainer:
    """What the `train` command drives, recording whether it resumed and trained."""

    def __init__(self, run_dir: Path) -> None:
        self.log_path = run_dir / "train_log.jsonl"
        self.accelerator = SimpleNamespace(is_main_process=True)
        self.calls: list[str] = []

    def resume(self) -> int:
        self.calls.append("resume")
        return 3

    def train(self) -> None:
        self.calls.append("train")


@pytest.fixture
def fake_training(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    import searchteam.train.build as training
    import searchteam.train.plot as plot

    seen: dict[str, Any] = {}

    def build_trainer(cfg: TrainRunConfig, run_dir: Path, on_step: Any) -> FakeTrainer:
        seen.update(config=cfg, run_dir=run_dir, trainer=FakeTrainer(run_dir))
        return seen["trainer"]

    monkeypatch.setattr(training, "build_trainer", build_trainer)
    monkeypatch.setattr(plot, "curves_after_training", lambda run_dir: run_dir / "curves.png")
    return seen


def test_train_resume_means_what_it_means_for_eval(fake_training: dict[str, Any], tmp_path: Path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "train_log.jsonl").write_text('{"step": 1}\n')
    args = ["train", "--method", "naive_rag", "--device", "cpu", "--out", str(out)]
    for given in ([], ["--no-resume"]):
        result = CliRunner().invoke(app, [*args, *given])
        assert result.exit_code == 2 and "pass --resume" in result.stderr
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert fake_training["trainer"].calls == ["resume", "train"] and "resuming at step 3" in result.output

    config = tmp_path / "resume.yaml"
    config.write_text("method: naive_rag\nresume: true\n")
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--out", str(out)])
    assert result.exit_code == 0 and fake_training["trainer"].calls == ["resume", "train"]
    result = CliRunner().invoke(app, ["train", "--config", str(config), "--out", str(out), "--no-resume"])
    assert result.exit_code == 2 and "pass --resume" in result.stderr


def test_train_takes_the_shared_run_flags(fake_training: dict[str, Any], tmp_path: Path):
    args = ["train", "--method", "naive_rag", "--device", "cpu", "--out", str(tmp_path / "t")]
    args += ["--top-k", "2", "--temperature", "0.9", "--batch-size", "5", "--set", "train.lr=0.001"]
    args += ["--dataset", "nq", "--limit", "4"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    cfg = fake_training["config"]
    assert (cfg.top_k, cfg.temperature, cfg.batch_size, cfg.train.lr) == (2, 0.9, 5, 0.001)
    assert cfg.datasets == ["nq"] and cfg.limit == 4 and fake_training["run_dir"] == tmp_path / "t"


# --- recipes, version ----------------------------------------------------------------------------------


def test_recipes_lists_every_shipped_recipe_with_its_purpose():
    recipes = shipped_recipes()
    assert recipes and all(purpose for _, purpose in recipes.values())
    result = CliRunner().invoke(app, ["recipes"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    for name, (path, purpose) in recipes.items():
        assert path.is_file()
        assert any(name in line and purpose in line for line in result.output.splitlines()), name


def test_every_listed_recipe_name_is_a_train_config():
    for name in shipped_recipes():
        assert isinstance(load_train_run_config(Path(name), {}), TrainRunConfig)


def test_version_prints_the_installed_version():
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.output.strip() == f"searchteam {version('searchteam')}"


# --- ship-adapter --------------------------------------------------------------------------------------


def test_ship_adapter_copies_a_checkpoints_role_adapters_in_fp16(tmp_path: Path):
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model
    from searchteam.rl.policy import build_policy
    from tests.rl.test_trainer import config, tiny_model

    tokenizer = AutoTokenizer.from_pretrained(resolve_model("smollm2-135m"))
    settings = config(lora_per_role=True, roles=["planner", "ag"])
    policy = build_policy(tiny_model(tokenizer), tokenizer, settings)
    for p in policy.parameters():
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.02)
    checkpoint = tmp_path / "run" / "checkpoints" / "step-000002"
    policy.save(checkpoint / "policy")
    shipped_root = tmp_path / "adapters"

    result = CliRunner().invoke(
        app, ["ship-adapter", str(checkpoint), "tiny-team", "--into", str(shipped_root)]
    )
    assert result.exit_code == 0, result.output
    shipped = shipped_root / "tiny-team"
    roles = sorted(p.name for p in (shipped / "policy" / "adapters").iterdir())
    assert roles == ["ag", "planner"]
    for role in roles:
        source = load_file(checkpoint / "policy" / "adapters" / role / "adapter_model.safetensors")
        copied = load_file(shipped / "policy" / "adapters" / role / "adapter_model.safetensors")
        assert set(copied) == set(source) and all(t.dtype == torch.float16 for t in copied.values())
        assert all(torch.equal(copied[k], source[k].to(torch.float16)) for k in source)
    assert not (shipped / "policy" / "trainable.pt").exists()  # adapters only: what a shipped model holds

    fresh = build_policy(tiny_model(tokenizer, seed=1), tokenizer, settings)
    fresh.load_initial(shipped)  # loads like `--init-from` a shipped adapter
    assert not (shipped / "adapter.yaml").exists()  # no run config beside the checkpoint: no card

    run_config = {"method": "jade", "model": "smollm2-135m", "recipe": "jade/qwen0.5b-cpu"}
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(run_config))
    result = CliRunner().invoke(
        app, ["ship-adapter", str(checkpoint), "tiny-team", "--into", str(shipped_root)]
    )
    assert result.exit_code == 0, result.output
    card = yaml.safe_load((shipped / "adapter.yaml").read_text())
    assert card == {"base": "smollm2-135m", "recipe": "jade/qwen0.5b-cpu", "description": ""}

    part = {"method": "search_r1-from-top5", "model": "smollm2-135m", "reward": {"train": "gatherers"}}
    (tmp_path / "run" / "config.yaml").write_text(yaml.safe_dump(part))
    result = CliRunner().invoke(
        app, ["ship-adapter", str(checkpoint), "tiny-team", "--into", str(shipped_root)]
    )
    assert result.exit_code == 0, result.output
    card = yaml.safe_load((shipped / "adapter.yaml").read_text())
    assert card["team"] == "search_r1-from-top5"  # its runs of that team take the card's settings


def test_ship_adapter_refuses_a_folder_without_adapters_and_a_path_as_name(tmp_path: Path):
    result = CliRunner().invoke(app, ["ship-adapter", str(tmp_path), "x", "--into", str(tmp_path / "a")])
    assert result.exit_code == 2 and "holds no LoRA adapters" in result.stderr
    result = CliRunner().invoke(app, ["ship-adapter", str(tmp_path), "../x", "--into", str(tmp_path / "a")])
    assert result.exit_code == 2 and "plain folder name" in result.stderr
    adapters = tmp_path / "checkpoint" / "policy" / "adapters" / "policy"
    adapters.mkdir(parents=True)
    (adapters / "adapter_config.json").write_text("{}")
    (adapters / "adapter_model.safetensors").write_bytes(b"")
    result = CliRunner().invoke(app, ["ship-adapter", str(tmp_path / "checkpoint"), "x"])
    assert result.exit_code == 2 and "not in a run folder" in result.stderr
