"""`searchteam train`: connects a team (rollouts through the batched runtime), its reward scheme and the
team-agnostic RL trainer. The only module that knows all three."""

from __future__ import annotations

import asyncio
import logging
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from accelerate import Accelerator
from accelerate.utils import broadcast_object_list
from pydantic import Field, field_validator, model_validator

from searchteam.config import RunConfig, load_config, recipe_name, resolve_config_path
from searchteam.data.benchmark import load_benchmark, load_questions
from searchteam.errors import ConfigError
from searchteam.eval.runner import effective_config
from searchteam.factory import build_run_retriever, build_sampling, build_team, secondary_llm
from searchteam.llm import build_llm, resolve_backend
from searchteam.llm.hf import HFBackend, pick_device
from searchteam.llm.models import TRAINED, checkpoint_of
from searchteam.methods import build_reward_scheme, get_method
from searchteam.metrics import answer_scores
from searchteam.rewards.base import RewardScheme
from searchteam.rl import Policy, TrainConfig, Trainer, load_policy
from searchteam.rl.config import WarmStartConfig
from searchteam.rl.distributed import make_accelerator
from searchteam.rl.warm_start import WarmStart, append_sampling, read_sampling, sampling_path
from searchteam.runtime import make_backends, run_episodes
from searchteam.teams import Team
from searchteam.tracking import TrackingSetup, check_installed, trackers_for
from searchteam.types import Episode, Question

log = logging.getLogger(__name__)

DEFAULT_TRAIN_DATASETS = ["nq", "hotpotqa"]  # the papers train on NQ + HotpotQA
WARM_START_SEED = 7919  # offsets the warm start's question order and sampling seeds from RL's


class TrainRunConfig(RunConfig):
    """A run config plus what training adds: group sampling, the reward scheme's options, the RL knobs."""

    split: str = "train"
    temperature: float = Field(
        1.0, ge=0.0, le=5.0, description="the rollouts' sampling temperature; the trainer scores the same"
    )
    group_size: int = Field(4, ge=1, description="rollouts per question (G of GRPO)")
    questions_per_step: int = Field(4, ge=1)
    reward: dict[str, Any] = Field(default_factory=dict, description="options of the method's reward scheme")
    judge_model: str | None = Field(None, description="LLM judge for reward schemes that use one (DECOR)")
    recipe: str | None = Field(
        None, description="the config the run started from: a shipped recipe's name, else its path"
    )
    warm_start: WarmStartConfig | None = Field(
        None, description="rejection-sampling fine-tuning before RL (expert iteration); off when unset"
    )
    init_from: str | None = Field(
        None,
        description="start the policy from trained weights: a checkpoint folder (RUN/checkpoints/step-N, "
        "RUN/warm_start/round-NN) or a shipped adapter's name (`searchteam models`); the critic starts fresh",
    )
    train: TrainConfig = Field(default_factory=TrainConfig)

    @field_validator("temperature")
    @classmethod
    def _sampled(cls, temperature: float) -> float:
        if temperature == 0:
            raise ValueError(
                "temperature 0 (greedy) cannot train: every rollout of a question is the same, so every "
                "advantage is 0; sample at a temperature > 0 (the papers use 1.0)"
            )
        return temperature

    @model_validator(mode="after")
    def _one_temperature_and_seed(self) -> TrainRunConfig:
        """The rollouts' temperature and seed are the trainer's: set once, at the top level."""
        for name in ("temperature", "seed"):
            mine, trainers = getattr(self, name), getattr(self.train, name)
            if name in self.train.model_fields_set and trainers != mine:
                raise ValueError(
                    f"train.{name} ({trainers}) differs from {name} ({mine}): set {name} once, at the top "
                    "level; the rollouts use it and so does the trainer"
                )
        self.train = self.train.model_copy(update={"temperature": self.temperature, "seed": self.seed})
        return self

    @field_validator("top_p")
    @classmethod
    def _untruncated(cls, top_p: float) -> float:
        """The trainer scores the whole temperature softmax; nucleus sampling would bias its gradient."""
        if top_p < 1.0:
            raise ValueError(
                f"training samples with top_p {top_p}, but the trainer scores the untruncated temperature "
                "softmax (a biased gradient): set top_p: 1"
            )
        return top_p


def default_recipe(method: str, device: str | None = None) -> Path | None:
    """The recipe `method` registers for the device at hand (its `gpu` recipe on CUDA when it has one, else
    its `cpu` recipe), or None when the method registers none."""
    kinds = ("gpu", "cpu") if pick_device(device).startswith("cuda") else ("cpu",)
    found = [get_method(method).recipe_path(kind) for kind in kinds]
    return next((p for p in found if p is not None), None)


def load_train_run_config(
    path: Path | None, overrides: dict[str, Any], settings: dict[str, Any] | None = None
) -> TrainRunConfig:
    """A training config from `path`, else the method's paper recipe (`default_recipe`), else the generic
    defaults; then the `--set` settings, then the CLI overrides. `recipe` names what the run started from."""
    train_overrides = {k: overrides.pop(k) for k in ("steps",) if overrides.get(k) is not None}
    given = {**(settings or {}), **{k: v for k, v in overrides.items() if v is not None}}
    if path is None and given.get("method"):
        path = default_recipe(given["method"], given.get("device"))
    cfg = load_config(path, overrides, TrainRunConfig, settings)
    assert isinstance(cfg, TrainRunConfig)
    if path is not None:
        cfg.recipe = recipe_name(resolve_config_path(path)) or str(path)
    if train_overrides:
        cfg.train = TrainConfig.model_validate({**cfg.train.model_dump(), **train_overrides})
    if cfg.train.steps == 0 and cfg.warm_start is None:
        raise ConfigError("steps: 0 trains nothing without a warm_start section")
    return cfg


def check_reward_placement(placement: str | None, train: TrainConfig) -> None:
    """Refuse reward placements that the estimator would miscount. GAE with γ > 0 and merged continuation
    chains sum the rewards of later turns, so an outcome repeated on every turn (`every_turn`) would be
    counted once per remaining turn (JADE: a 4-turn episode with R = 0.967 got returns 3.87 … 0.97). Group
    estimators score a trajectory by the mean reward of its turns, so `last_turn` would divide the outcome
    by the number of turns."""
    if placement == "every_turn" and train.sums_returns:
        why = "merge_continuations" if train.merge_continuations else "GAE with gamma > 0"
        raise ConfigError(
            f"reward placement 'every_turn' with {why} counts the outcome once per remaining turn: "
            "set reward.placement: last_turn"
        )
    group_only = not train.uses_critic and not train.merge_continuations
    if placement == "last_turn" and group_only:
        raise ConfigError(
            f"reward placement 'last_turn' with estimator '{train.estimator}' scores a trajectory by the "
            "mean of its turn rewards, i.e. the outcome divided by its turns: "
            "set reward.placement: every_turn"
        )


def training_models(cfg: TrainRunConfig) -> dict[str, str]:
    """The run's extra models, plus any its method adds for training (`register_method(training_models=)`:
    QAgent stage 2's frozen generator); the method's hook refuses a config it cannot train."""
    hook = get_method(cfg.method).training_models
    return hook(cfg) if hook is not None else dict(cfg.extra_models)


def training_questions(cfg: TrainRunConfig) -> list[Question]:
    if cfg.questions is not None:
        return load_questions(cfg.questions, skip_bad_lines=cfg.skip_bad_lines)[: cfg.limit]
    return load_benchmark(cfg.datasets or DEFAULT_TRAIN_DATASETS, cfg.split, cfg.limit)


def questions_for_step(
    questions: list[Question], step: int, per_step: int, seed: int, *, rank: int = 0, world: int = 1
) -> list[Question]:
    """Process `rank`'s share of step `step`'s `per_step` questions. The step's batches are epoch-wise
    shuffled and depend only on (seed, step), so a resumed run sees the same data; each of the `world`
    processes takes every `world`-th question of the batch, so no two roll out the same question and all
    of a question's group stays on one process."""
    check_equal_shares("questions_per_step", per_step, world)
    epoch_len = max(1, len(questions) // per_step)
    epoch, index = divmod(step, epoch_len)
    order = list(range(len(questions)))
    random.Random(f"{seed}:{epoch}").shuffle(order)
    return [questions[i] for i in order[index * per_step : (index + 1) * per_step][rank::world]]


def resample_questions(
    questions: list[Question],
    step: int,
    attempt: int,
    per_step: int,
    seed: int,
    *,
    rank: int = 0,
    world: int = 1,
) -> list[Question]:
    """Fresh questions for DAPO's re-sampling round `attempt` (≥ 1) of `step`: the `attempt`-th batch of a
    shuffle (fixed by seed and step) of the questions outside the step's own batch, sharded like it."""
    taken = {q.id for q in questions_for_step(questions, step, per_step, seed)}
    rest = [q for q in questions if q.id not in taken]
    random.Random(f"{seed}:{step}:resample").shuffle(rest)
    return rest[(attempt - 1) * per_step : attempt * per_step][rank::world]


def sampling_seed(seed: int, step: int, rank: int, attempt: int = 0) -> int:
    """The torch seed of process `rank`'s rollouts at `step` (and re-sampling round `attempt`): distinct per
    process and round (no duplicated samples) and reproducible per step (a resumed run samples as the
    straight one did)."""
    key = f"{seed}:{step}:{rank}" + (f":{attempt}" if attempt else "")
    return random.Random(key).getrandbits(63)


def compute_dtype(train: TrainConfig):
    """The dtype rollouts compute in when full fine-tuning holds fp32 weights under mixed precision."""
    half = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(train.mixed_precision)
    return half if train.full_ft else None


def rollout_engine(cfg: TrainRunConfig) -> str:
    """What generates the rollouts. `hf` shares the policy model itself. `ov` (OpenVINO GenAI; what `auto`
    picks on the CPU for a LoRA policy of a preset) and `openai` (a vLLM server with runtime LoRA) load the
    policy's adapters after every update; their logprobs are never used (`old_logprobs: recompute`)."""
    auto = cfg.backend == "auto"
    engine = resolve_backend(cfg.backend, cfg.model, cfg.device)
    if engine == "vllm":
        if auto:
            return "hf"
        raise ConfigError(
            "rollouts go to a vLLM server, not an in-process vLLM: start `vllm serve MODEL --enable-lora` "
            "with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True and set backend: openai and base_url"
        )
    if engine in ("ov", "openai"):
        why = None
        if cfg.train.full_ft:
            why = "full fine-tuning (an engine loads LoRA adapters, not new weights)"
        elif cfg.train.old_logprobs == "rollout":
            why = "old_logprobs: rollout (an engine's logprobs are not the training model's)"
        if why and auto:
            return "hf"
        if why:
            raise ConfigError(f"backend '{engine}' cannot generate rollouts with {why}: use backend: hf")
    return engine


def make_rollout(
    cfg: TrainRunConfig,
    team: Team,
    policy: Policy,
    questions: list[Question],
    workdir: Path,
    teacher: str | None = None,
    progress: bool = False,
    rank: int = 0,
    world: int = 1,
) -> Callable[..., list[Episode]]:
    """Rollouts with the current weights (`rollout(step)`, or `rollout(step, attempt)` for a DAPO
    re-sampling round on fresh questions). With the hf engine the backend shares the policy model (per-role
    adapters are switched by role before each batch); another engine first loads the adapters saved under
    `workdir` (timed as `time/weight_sync`). Each question runs `group_size` times with training=True.
    With `teacher`, that model generates instead of the policy (a warm start from another model's traces);
    `progress` shows a progress bar over the rollouts (the warm start's long collection rounds). Process
    `rank` of `world` rolls out its share of each step's questions (`questions_for_step`)."""
    engine = "teacher" if teacher else rollout_engine(cfg)
    if teacher:
        backend = secondary_llm(cfg, teacher)  # on the run's server or beside its engine, never a second one
    elif engine == "hf":
        backend = HFBackend(
            cfg.model,
            model=policy.model,
            tokenizer=policy.tokenizer,
            logprobs=cfg.train.old_logprobs == "rollout",  # otherwise the trainer recomputes π_old
            activate=policy.activate if cfg.train.lora_per_role else None,
            autocast=compute_dtype(cfg.train),  # full fine-tuning keeps fp32 master weights
        )
    else:
        backend = build_llm(
            cfg.model,
            backend=engine,
            base_url=cfg.base_url,
            seed=cfg.seed,
            ov_precision=cfg.ov_precision,
            server=cfg.server,
        )
    extra = {name: secondary_llm(cfg, model) for name, model in training_models(cfg).items()}
    retriever = build_run_retriever(cfg) if team.uses_retrieval else None
    sampling = build_sampling(cfg)
    timings: dict[str, float] = {}

    # processes on one server: the main process loads the adapters, the others adopt its served names
    shared = world > 1 and hasattr(backend, "adopt_adapters")
    share = broadcast_from_main if shared else None

    def rollout(
        step: int,
        attempt: int = 0,
        *,
        done: Sequence[Episode] = (),
        on_episode: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        timings.clear()
        if engine not in ("hf", "teacher") and attempt == 0:  # the weights changed in the last update
            timings["time/weight_sync"] = sync_adapters(
                policy, backend, workdir / f"rank{0 if shared else rank}", main=rank == 0, share=share
            )
        per_step, shard = cfg.questions_per_step, {"rank": rank, "world": world}
        if attempt:
            batch = resample_questions(questions, step, attempt, per_step, cfg.seed, **shard)
        else:
            batch = questions_for_step(questions, step, per_step, cfg.seed, **shard)
        seed = sampling_seed(cfg.seed, step, rank, attempt)
        torch.manual_seed(seed)
        if hasattr(backend, "reseed"):
            backend.reseed(seed)
        position = {q.id: i for i, q in enumerate(batch)}  # each question's group together, in batch order
        done = [e for e in done if e.question.id in position]  # another batch's episodes are not this one's
        copies = unsampled(batch, cfg.group_size, done)
        backends = make_backends({"policy": backend, **extra}, retriever, max_batch=cfg.batch_size)
        policy.model.eval()
        episodes, _ = asyncio.run(
            run_episodes(
                team.solve,
                cfg.method,
                copies,
                backends,
                sampling,
                model_name=cfg.model,
                concurrency=cfg.concurrency,
                progress=progress,
                training=True,
                on_episode=on_episode,
            )
        )
        for episode in episodes:
            episode.group_id = episode.question.id
        return sorted([*done, *episodes], key=lambda e: position[e.question.id])

    rollout.timings = timings  # type: ignore[attr-defined]  # read by the trainer after each call
    rollout.close = getattr(backend, "close", lambda: None)  # type: ignore[attr-defined]  # unloads adapters
    return rollout


def unsampled(batch: list[Question], group_size: int, done: Sequence[Episode]) -> list[Question]:
    """`group_size` copies of each question of `batch`, less the episodes of it `done` already holds."""
    left = Counter(e.question.id for e in done)
    copies = []
    for q in batch:
        skip = min(left[q.id], group_size)
        left[q.id] -= skip
        copies += [q.model_copy() for _ in range(group_size - skip)]
    return copies


def broadcast_from_main(value: Any) -> Any:
    """The main process's `value`, on every process (a collective: every process must call it)."""
    return broadcast_object_list([value])[0]


def sync_adapters(
    policy: Policy,
    engine,
    root: Path,
    *,
    main: bool = True,
    share: Callable[[dict[str, str] | None], dict[str, str]] | None = None,
) -> float:
    """Save the policy's adapters into a fresh folder under `root`, have `engine` load them, then delete
    the older folders (an engine may read its adapter files until it has the new ones). Returns seconds.

    A server engine (`openai`) first switches to training: prompts rendered with the policy's tokenizer
    and sent as token ids, token ids required back, adapter names in the namespace of `root` (stable over
    a resume, whose stale names it unloads). With several processes on one server pass `share`, a
    collective call that hands every process the main process's `{role: served name}` (its argument there;
    None elsewhere), e.g. accelerate's `broadcast_object_list`: then only the main process (`main`) saves
    and loads, and the others adopt its names without a call to the server. In-process engines (`ov`)
    ignore `share` and load on every process."""
    from searchteam.llm.openai import run_namespace

    def save_and_load(load: Callable[[dict[str, Path]], Any]) -> Any:
        root.mkdir(parents=True, exist_ok=True)
        folder = Path(tempfile.mkdtemp(prefix="step-", dir=root))
        folder.chmod(0o755)  # mkdtemp makes it owner-only; a server running as another user reads it
        loaded = load(policy.save_adapters(folder))
        for old in root.iterdir():
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
        return loaded

    start = time.perf_counter()
    if hasattr(engine, "for_training"):
        engine.for_training(policy.tokenizer, run_namespace(root))
    if share is not None and hasattr(engine, "adopt_adapters"):
        names = save_and_load(engine.load_adapters) if main else None
        shared = share(names)
        if not main:
            engine.adopt_adapters(shared)
    else:
        save_and_load(engine.set_adapters)
    return time.perf_counter() - start


def build_trainer(
    cfg: TrainRunConfig,
    out: Path,
    accelerator: Accelerator | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> Trainer:
    """The trainer of a run, in this process: under several processes (`torchrun`, `accelerate launch`)
    the accelerator joins the process group first, then this process loads the policy on its device and
    rolls out its share of the questions; only the main process writes the run's files."""
    team = build_team(cfg)
    warm_cfg = warm_start_run_config(cfg) if cfg.warm_start else None
    warm_team = build_team(warm_cfg) if warm_cfg else None  # validates the stage's own options
    reward = build_reward_scheme(cfg.method, cfg.reward)  # validates the options before loading models
    check_reward_placement(getattr(getattr(reward, "options", None), "placement", None), cfg.train)
    training_models(cfg)  # e.g. refuses a QAgent stage-2 run without submodule mode before any model loads
    initial = initial_checkpoint(cfg)
    check_installed(trackers_for(cfg.report_to))  # a named tracker that is missing, before any model loads
    resolved = effective_config(cfg, team)
    tracked = TrackingSetup(cfg.report_to, cfg.tracker_project, resolved)
    accelerator = accelerator or make_accelerator(cfg.train, out, tracked, device=cfg.device)
    shard = {"rank": accelerator.process_index, "world": accelerator.num_processes}
    check_shardable(cfg, shard["world"])
    # the main process fills the caches first (converted models, engine exports, indexes): transformers
    # writes no weights from a process of rank > 0
    with accelerator.main_process_first():
        policy = load_policy(cfg.model, cfg.train, device=accelerator.device, dtype=cfg.dtype)
        if initial is not None:
            policy.load_initial(initial)
        if cfg.judge_model:
            reward = build_reward_scheme(cfg.method, cfg.reward, judge=secondary_llm(cfg, cfg.judge_model))
        out.mkdir(parents=True, exist_ok=True)
        questions = training_questions(cfg)
        rollout = make_rollout(cfg, team, policy, questions, out / "rollout_adapters", **shard)
    warm = None
    if warm_cfg and warm_team:
        warm = warm_start_stage(warm_cfg, warm_team, policy, questions, out, reward, **shard)
    if accelerator.is_main_process:
        (out / "config.yaml").write_text(yaml.safe_dump(resolved, sort_keys=False))
    return Trainer(
        policy,
        rollout,
        reward,
        cfg.train,
        out,
        accelerator=accelerator,
        on_step=on_step,
        warm_start=warm,
        tracking_setup=tracked,
    )


def initial_checkpoint(cfg: TrainRunConfig) -> Path | None:
    """The folder `init_from` names, checked before any model loads: it must hold a `policy/`, and a
    shipped adapter must have been trained on the run's model."""
    if cfg.init_from is None:
        return None
    trained = TRAINED.get(cfg.init_from)
    if trained is not None and trained.base != cfg.model:
        raise ConfigError(f"init_from: {trained.name} was trained on {trained.base}, not on {cfg.model}")
    folder = Path(checkpoint_of(cfg.init_from))
    if not (folder / "policy").is_dir():
        raise ConfigError(
            f"init_from: {cfg.init_from} is neither a shipped adapter nor a checkpoint folder with a policy/ "
            "(RUN/checkpoints/step-N or RUN/warm_start/round-NN)"
        )
    return folder


def warm_start_run_config(cfg: TrainRunConfig) -> TrainRunConfig:
    """The run config of the warm start's rollouts: its own seeds, sample count, questions per round,
    temperature and team options (over the run's)."""
    ws = cfg.warm_start
    assert ws is not None
    return cfg.model_copy(
        update={
            "seed": cfg.seed + WARM_START_SEED,
            "group_size": ws.samples_per_question,
            "questions_per_step": ws.questions_per_round,
            "temperature": ws.temperature,
            "options": {**cfg.options, **ws.options},
        }
    )


def launch_processes(num_processes: int, argv: list[str]) -> int:
    """Run the command `searchteam ARGV...` in `num_processes` processes on this machine through torch's
    elastic launcher (what `accelerate launch --multi_gpu` runs too; gloo on the CPU, where
    `accelerate launch --cpu` starts one process); returns the launcher's exit code."""
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={num_processes}",
    ]
    return subprocess.call([*command, "-m", "searchteam.cli", *argv])


def check_shardable(cfg: TrainRunConfig, world: int) -> None:
    """Refuse, before any model loads, question counts that `world` processes cannot share equally."""
    counts = {"questions_per_step": cfg.questions_per_step}
    if cfg.warm_start is not None:
        counts["warm_start.questions_per_round"] = cfg.warm_start.questions_per_round
    for name, count in counts.items():
        check_equal_shares(name, count, world)


def check_equal_shares(name: str, count: int, world: int) -> None:
    """Refuse a question count (`name`) that `world` processes cannot share equally."""
    if count % world:
        raise ConfigError(
            f"{name} ({count}) must be a multiple of the number of processes ({world}): each process "
            "rolls out an equal share of the questions"
        )


def warm_start_stage(
    warm_cfg: TrainRunConfig,
    team: Team,
    policy: Policy,
    questions: list[Question],
    out: Path,
    reward: RewardScheme | None = None,
    rank: int = 0,
    world: int = 1,
) -> WarmStart:
    """The warm start's rollouts: `samples_per_question` samples of `questions_per_round` questions per
    round at its temperature, by the policy (through the run's engine) or by the teacher; question order
    and seeds apart from RL's. `warm_cfg` is `warm_start_run_config` of the run and `team` is built from it
    (the stage's own options); `reward`, the run's reward scheme, credits roles for `keep_by: role_reward`.
    The engine (or teacher model) is built at the first round, so a run whose warm start already finished
    never loads it."""
    ws = warm_cfg.warm_start
    assert ws is not None
    rollout: list[Callable[..., list[Episode]]] = []

    def collect(round_index: int) -> list[Episode]:
        if not rollout:
            workdir = out / "rollout_adapters" / "warm_start"
            rollout.append(
                make_rollout(
                    warm_cfg,
                    team,
                    policy,
                    questions,
                    workdir,
                    ws.teacher,
                    progress=rank == 0,
                    rank=rank,
                    world=world,
                )
            )
        # every episode is kept the moment it is sampled, so a run killed mid-round samples only the rest
        path = sampling_path(out, round_index, rank)
        done = read_sampling(path)
        if done:
            log.warning("warm-start round %d resumes: %d episodes sampled before", round_index, len(done))
        episodes = rollout[0](round_index - 1, done=done, on_episode=lambda e: append_sampling(path, e))
        if round_index == ws.rounds:
            rollout[0].close()  # type: ignore[attr-defined]
            rollout.clear()  # frees the stage's engine (or teacher) before RL builds its own
        return episodes

    def score(episode: Episode) -> float:
        return answer_scores(episode.answer, episode.question.golden_answers)["f1"]

    return WarmStart(ws, collect, score, reward)
