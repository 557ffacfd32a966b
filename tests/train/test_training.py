"""Training glue: shipped configs validate, deterministic per-step question batches, and two real steps."""

from pathlib import Path

import pytest

from searchteam.errors import ConfigError
from searchteam.methods import reward_methods, shipped_recipes
from searchteam.methods.qagent import frozen_generator
from searchteam.rl.config import TrainConfig
from searchteam.train.config import check_reward_placement, load_train_run_config
from searchteam.train.rollout import questions_for_step, resample_questions, sampling_seed


@pytest.mark.parametrize("name", sorted(shipped_recipes()))
def test_every_shipped_training_config_validates(name: str):
    cfg = load_train_run_config(Path(name), {})
    assert cfg.method in reward_methods() and (cfg.train.steps >= 1 or cfg.warm_start is not None)


def test_every_shipped_recipe_places_rewards_as_its_estimator_counts_them():
    from searchteam.methods import build_reward_scheme

    for name in sorted(shipped_recipes()):
        cfg = load_train_run_config(Path(name), {})
        placement = getattr(build_reward_scheme(cfg.method, cfg.reward).options, "placement", None)
        check_reward_placement(placement, cfg.train)


def test_every_turn_outcome_is_refused_where_returns_sum():
    """JADE with GAE γ = λ = 1 and the outcome on every turn: a 4-turn episode with R = 0.967 got returns
    3.87, 2.90, 1.93, 0.97. The trainer refuses that placement (and with merged continuation chains)."""
    with pytest.raises(ConfigError, match="last_turn"):
        check_reward_placement("every_turn", TrainConfig(estimator="gae", gamma=1.0))
    with pytest.raises(ConfigError, match="last_turn"):
        check_reward_placement("every_turn", TrainConfig(estimator="grpo", merge_continuations=True))
    with pytest.raises(ConfigError, match="every_turn"):
        check_reward_placement("last_turn", TrainConfig(estimator="grpo"))
    check_reward_placement("every_turn", TrainConfig(estimator="gae", gamma=0.0))  # per-transition returns
    check_reward_placement("last_turn", TrainConfig(estimator="gae"))
    jade = load_train_run_config(Path("jade/smollm135m-cpu"), {"reward": {"placement": "every_turn"}})
    with pytest.raises(ConfigError):
        check_reward_placement("every_turn", jade.train)


def test_a_method_without_config_trains_with_its_paper_recipe():
    cfg = load_train_run_config(None, {"method": "mask", "device": "cpu"})
    assert cfg.recipe and cfg.recipe.endswith("mask/smollm135m-cpu")
    assert cfg.train.estimator == "gae" and cfg.max_turns == 1
    generic = load_train_run_config(None, {"method": "ircot", "device": "cpu"})
    assert generic.recipe is None and generic.train.estimator == "grpo"


def test_qagent_stage_two_always_rewards_a_frozen_generator():
    cfg = load_train_run_config(
        Path("qagent/smollm135m-cpu"), {"reward": {"stage": 2}, "options": {"mode": "submodule"}}
    )
    assert frozen_generator(cfg) == {"generator": cfg.model}  # a separate copy, not the trained policy
    named = cfg.model_copy(update={"role_models": {"generator": "qwen2.5-coder-0.5b"}})
    assert frozen_generator(named) == {"generator": "qwen2.5-coder-0.5b"}
    with pytest.raises(ConfigError, match="submodule"):
        frozen_generator(cfg.model_copy(update={"options": {}}))


def test_questions_for_step_is_a_function_of_seed_and_step():
    qs = list(range(10))
    assert questions_for_step(qs, 3, 2, seed=1) == questions_for_step(qs, 3, 2, seed=1)
    epoch = [q for step in range(5) for q in questions_for_step(qs, step, 2, seed=1)]
    assert sorted(epoch) == qs


def test_each_process_rolls_out_its_own_share_with_its_own_seed():
    """Two processes split the step's 4 questions 2 + 2 (together: the single-process batch), and every
    (step, rank) samples with its own seed."""
    qs = list(range(20))
    whole = questions_for_step(qs, 3, 4, seed=1)
    shards = [questions_for_step(qs, 3, 4, seed=1, rank=r, world=2) for r in range(2)]
    assert len(shards[0]) == len(shards[1]) == 2 and not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == sorted(whole)
    with pytest.raises(ValueError, match="multiple of the number of processes"):
        questions_for_step(qs, 3, 3, seed=1, rank=0, world=2)
    seeds = {sampling_seed(1, step, rank) for step in range(3) for rank in range(4)}
    assert len(seeds) == 12 and sampling_seed(1, 2, 3) == sampling_seed(1, 2, 3)


def test_two_training_steps_with_the_real_default_model(tmp_path, monkeypatch):
    """`searchteam train` end to end on the embedded model, retriever and train split: one warm-start round
    (every sampled episode kept; its turns that parsed are fine-tuned), then two GRPO
    steps of the Search-R1 agent (short generations so CI stays fast), a log line per step and a loadable
    checkpoint holding the LoRA adapter. A first run dies after the round's first sampled episode: each is
    kept the moment it finishes (`warm_start/sampling-NN-rankR.jsonl`), so the resumed run samples only the
    other three, and the round's collected file holds the first unchanged."""
    import json

    import yaml
    from typer.testing import CliRunner

    from searchteam.cli import app
    from searchteam.llm import build_llm
    from searchteam.llm.base import GenerationRequest, SamplingParams
    from searchteam.train import build as training

    config = tmp_path / "tiny.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "method": "search_r1",
                "max_turns": 1,
                "top_k": 1,
                "max_new_tokens": 24,
                "concurrency": 1,  # one episode at a time: the first run dies with one sampled
                "group_size": 2,
                "questions_per_step": 1,
                "limit": 8,
                "warm_start": {
                    "questions_per_round": 2,
                    "samples_per_question": 2,
                    "min_f1": 0.0,
                    "require_parsed": False,
                    "epochs": 1,
                },
                "train": {"estimator": "grpo", "micro_batch_size": 4, "gradient_checkpointing": True},
            }
        )
    )
    run, sampled = tmp_path / "run", []
    args = ["train", "--config", str(config), "--steps", "2", "--out", str(run), "--device", "cpu"]
    append = training.append_sampling

    def counted(path, episode):
        append(path, episode)
        sampled.append(path)

    def dies_after_one(path, episode):
        counted(path, episode)
        raise RuntimeError("killed")

    monkeypatch.setattr(training, "append_sampling", dies_after_one)
    assert CliRunner().invoke(app, args).exit_code != 0
    (path,) = sampled
    (before,) = path.read_text().splitlines()
    monkeypatch.setattr(training, "append_sampling", counted)
    result = CliRunner().invoke(app, [*args, "--resume"])
    assert result.exit_code == 0, result.output
    assert len(sampled) == 4 and not path.exists()  # the resumed run sampled the other three
    collected = (run / "warm_start" / "collected-01.jsonl").read_text().splitlines()
    assert json.loads(before) in [
        {k: v for k, v in json.loads(line).items() if k != "score"} for line in collected
    ]
    assert "warm-start round 1" in result.output
    (warm,) = [json.loads(line) for line in (run / "warm_start" / "log.jsonl").read_text().splitlines()]
    assert warm["episodes"] == 4 and warm["kept"] == 4
    kept = [json.loads(line) for line in (run / "warm_start" / "kept.jsonl").read_text().splitlines()]
    parsed = sum(t["parsed_ok"] for e in kept for t in e["turns"] if t["model"] == "policy")
    assert warm["samples"] == parsed and (warm["updates"] >= 1) == (parsed > 0)  # only parsed turns teach
    assert (run / "warm_start" / "round-01" / "policy" / "adapters" / "policy").is_dir()
    records = [json.loads(line) for line in (run / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["episodes"] == 2 and r["samples/agent"] >= 2 and r["skipped_updates"] == 0
        assert r["time/rollout"] > 0 and r["time/update"] > 0
        assert r["time/weight_sync"] > 0  # rollouts ran in OpenVINO with the adapters of the last update
    assert len(list((run / "rollout_adapters" / "rank0").iterdir())) == 1  # older syncs are deleted
    resolved = yaml.safe_load((run / "config.yaml").read_text())
    assert resolved["top_k"] == 1 and resolved["max_turns"] == 1
    checkpoint = run / "checkpoints" / "step-000002"
    adapter_config = json.loads(
        (checkpoint / "policy" / "adapters" / "policy" / "adapter_config.json").read_text()
    )
    assert adapter_config["base_model_name_or_path"] == "smollm2-135m"  # the preset, not this machine's cache
    request = GenerationRequest([{"role": "user", "content": "Hi"}], SamplingParams(max_new_tokens=4))
    for backend in ("auto", "hf"):  # ov, and transformers + peft
        trained = build_llm(str(checkpoint), backend=backend, device="cpu")
        assert trained.generate([request])[0].completion_tokens > 0


def test_resampling_rounds_draw_fresh_questions_with_fresh_seeds():
    from searchteam.types import Question

    qs = [Question(id=f"q{i}", question="?") for i in range(20)]
    step_ids = {q.id for q in questions_for_step(qs, 3, 4, seed=1)}
    first, second = (resample_questions(qs, 3, a, 4, seed=1) for a in (1, 2))
    assert len(first) == len(second) == 4
    assert not step_ids & {q.id for q in first + second} and not {q.id for q in first} & {
        q.id for q in second
    }
    assert resample_questions(qs, 3, 1, 4, seed=1) == first
    assert len({sampling_seed(1, 3, 0, a) for a in range(3)}) == 3


def test_shipped_recipes_follow_their_papers():
    """DECOR Eq. 4 averages over sequences; DAC B.1 pairs a GAE searcher (γ = λ = 1) with a GRPO generator
    (G = 5); Search-R1 trains on EM; QAgent Eq. 1 has β = 0.001; JADE Eq. 8 rewards the terminal turn."""
    for recipe in ("decor/smollm135m-cpu", "decor/qwen0.5b-cpu"):
        decor = load_train_run_config(Path(recipe), {})
        assert decor.train.ratio_level == "sequence" and decor.train.loss_agg == "seq_mean"
        assert (decor.train.clip_low, decor.train.clip_high, decor.reward["alpha"]) == (3e-4, 4e-4, 0.6)
    for recipe in ("dac/smollm135m-cpu", "dac/qwen0.5b-cpu"):
        dac = load_train_run_config(Path(recipe), {})
        searcher, generator = (dac.train.estimator_of(r) for r in ("searcher", "generator"))
        assert (searcher.estimator, searcher.gamma, searcher.lam) == ("gae", 1.0, 1.0)
        assert generator.estimator == "grpo" and dac.group_size == 5 and dac.train.lora_per_role
    for search_r1 in ("search_r1/smollm135m-cpu", "search_r1/qwen0.5b-cpu"):
        assert load_train_run_config(Path(search_r1), {}).reward["metric"] == "em"
    assert load_train_run_config(Path("qagent/smollm135m-cpu"), {}).train.kl_coef == 0.001
    assert load_train_run_config(Path("jade/smollm135m-cpu"), {}).reward["placement"] == "last_turn"
    gpu = load_train_run_config(Path("mask/qwen7b-gpu"), {})
    assert gpu.top_k == 5 and gpu.train.critic == "separate" and gpu.train.gamma == 0.0


def test_init_from_names_a_checkpoint_or_a_shipped_adapter_of_the_same_model(tmp_path):
    from searchteam.llm.models import TRAINED
    from searchteam.train.config import initial_checkpoint

    cfg = load_train_run_config(Path("jade/smollm135m-cpu"), {})
    assert initial_checkpoint(cfg) is None
    (tmp_path / "step-000003" / "policy").mkdir(parents=True)
    assert initial_checkpoint(cfg.model_copy(update={"init_from": str(tmp_path / "step-000003")})) == (
        tmp_path / "step-000003"
    )
    with pytest.raises(ConfigError, match="neither a shipped adapter nor a checkpoint"):
        initial_checkpoint(cfg.model_copy(update={"init_from": str(tmp_path)}))
    name = "qwen2.5-coder-0.5b-jade"
    with pytest.raises(ConfigError, match="trained on qwen2.5-coder-0.5b, not on smollm2-135m"):
        initial_checkpoint(cfg.model_copy(update={"init_from": name}))
    qwen = cfg.model_copy(update={"init_from": name, "model": "qwen2.5-coder-0.5b"})
    assert initial_checkpoint(qwen) == TRAINED[name].path


def test_the_warm_start_rolls_out_with_its_own_team_options():
    """DAC's qwen recipe samples its warm start without hard positives or probes; RL keeps the paper's."""
    from searchteam.factory import build_team
    from searchteam.train.config import warm_start_run_config

    cfg = load_train_run_config(Path("dac/qwen0.5b-cpu"), {})
    warm = warm_start_run_config(cfg)
    assert cfg.options == {} and warm.options == {"hard_positives": False, "difference_rewards": False}
    assert warm.group_size == cfg.warm_start.samples_per_question and warm.seed != cfg.seed
    assert build_team(warm).settings.options == warm.options
    typo_options = cfg.warm_start.model_copy(update={"options": {"abstian": 0}})
    typo = cfg.model_copy(update={"warm_start": typo_options})
    with pytest.raises(ConfigError, match="unknown option 'abstian'.*did you mean"):
        build_team(warm_start_run_config(typo))


def test_a_composed_teams_warm_start_options_merge_per_part():
    from searchteam.train.config import options_over

    run = {"search_r1": {"action_tokens": 64, "first_search": "question"}, "naive_rag": {"x": 1}}
    over = {"search_r1": {"bridge_hint": True, "action_tokens": 32}}
    assert options_over(run, over) == {
        "search_r1": {"action_tokens": 32, "first_search": "question", "bridge_hint": True},
        "naive_rag": {"x": 1},
    }
    assert options_over({"hard_positives": True}, {"hard_positives": False}) == {"hard_positives": False}


def test_the_qagent_reader_recipe_trains_only_an_unfrozen_generator():
    from searchteam.factory import build_team

    cfg = load_train_run_config(Path("qagent/qwen0.5b-cpu-reader"), {})
    team = build_team(cfg)
    assert team.mode == "submodule" and team.frozen_generator is False and cfg.train.roles == ["generator"]
    assert cfg.init_from == "runs/qagent-submodule/warm_start/round-02"  # the submodule recipe's agent
    assert not cfg.role_models  # the policy reads


def test_a_privileged_option_is_refused_outside_the_warm_start():
    from searchteam.train.config import plan_training

    bridge = Path("search_r1/qwen0.5b-cpu-bridge")
    plan = plan_training(load_train_run_config(bridge, {}))  # under warm_start.options: accepted
    assert plan.warm is not None and plan.warm[1].options.bridge_hint and not plan.team.options.bridge_hint
    with pytest.raises(ConfigError, match="warm_start.options"):
        plan_training(load_train_run_config(bridge, {"options": {"bridge_hint": True}}))
