"""A training run's rollouts: the team's episodes with the current weights, on the engine the run names
(`Rollout`), and which questions and seeds each step and process samples."""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch
from accelerate.utils import broadcast_object_list

from searchteam.errors import ConfigError
from searchteam.factory import build_run_retriever, build_sampling, role_llms, secondary_llm
from searchteam.llm import build_llm, resolve_backend
from searchteam.llm.hf import HFBackend
from searchteam.rl.config import TrainConfig
from searchteam.rl.policy import Policy
from searchteam.runtime import make_backends, run_episodes
from searchteam.runtime.failures import TeamBugs
from searchteam.teams import Team
from searchteam.train.config import TrainRunConfig, check_equal_shares, training_models
from searchteam.types import Episode, Question


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


@runtime_checkable
class AdapterEngine(Protocol):
    """An engine that generates with adapters loaded from files (`ov`, `openai`): the policy's adapters
    are saved and loaded into it after every update."""

    def load_adapters(self, adapters: Mapping[str, Path]) -> object: ...


@runtime_checkable
class ServerEngine(AdapterEngine, Protocol):
    """An engine on a server that several training processes share (`openai`): it switches to token ids
    and namespaced adapter names for training, and the main process's loaded names serve the others."""

    def for_training(self, tokenizer: Any, namespace: str | None = None) -> None: ...

    def load_adapters(self, adapters: Mapping[str, Path]) -> dict[str, str]: ...

    def adopt_adapters(self, names: Mapping[str, str]) -> None: ...


@runtime_checkable
class SeededEngine(Protocol):
    """An engine whose sampling has its own random state (`ov`), seeded per step like torch's."""

    def reseed(self, seed: int) -> None: ...


class Rollout:
    """The team's episodes with the current weights: `rollout(step)`, or `rollout(step, attempt)` for a
    DAPO re-sampling round on fresh questions; each question runs `group_size` times with training=True.
    A team bug seen twice in the run, in any steps, stops it (`TeamBug`, see `runtime.failures`).

    With the hf engine the backend shares the policy model (per-role adapters are switched by role before
    each batch); an `AdapterEngine` first loads the adapters saved under `workdir` (timed in `timings` as
    `time/weight_sync`, which the trainer reads after each call). With `teacher`, that model generates
    instead of the policy (a warm start from another model's traces); `progress` shows a progress bar
    (the warm start's long collection rounds). Process `rank` of `world` rolls out its share of each
    step's questions (`questions_for_step`)."""

    def __init__(
        self,
        cfg: TrainRunConfig,
        team: Team,
        policy: Policy,
        questions: list[Question],
        workdir: Path,
        teacher: str | None = None,
        progress: bool = False,
        rank: int = 0,
        world: int = 1,
    ) -> None:
        self.cfg, self.team, self.policy, self.questions = cfg, team, policy, questions
        self.progress, self.rank, self.world = progress, rank, world
        self.engine = "teacher" if teacher else rollout_engine(cfg)
        self.backend = secondary_llm(cfg, teacher) if teacher else self._policy_backend()
        self.extra = role_llms(cfg, training_models(cfg))
        self.retriever = build_run_retriever(cfg) if team.uses_retrieval else None
        self.sampling = build_sampling(cfg)
        self.timings: dict[str, float] = {}
        self.bugs = TeamBugs(cfg.method)  # over the whole run: a bug that repeats stops it
        # processes on one server: the main process loads the adapters, the others adopt its served names
        self.shared = world > 1 and isinstance(self.backend, ServerEngine)
        self.adapter_dir = workdir / f"rank{0 if self.shared else rank}"

    def _policy_backend(self) -> Any:
        """The engine that generates with the policy's weights (`rollout_engine`); the teacher is built by
        the factory, on the run's server or beside its engine, never a second one."""
        cfg, policy = self.cfg, self.policy
        if self.engine == "hf":
            return HFBackend(
                cfg.model,
                model=policy.model,
                tokenizer=policy.tokenizer,
                logprobs=cfg.train.old_logprobs == "rollout",  # otherwise the trainer recomputes π_old
                activate=policy.activate if cfg.train.lora_per_role else None,
                autocast=compute_dtype(cfg.train),  # full fine-tuning keeps fp32 master weights
            )
        return build_llm(
            cfg.model,
            backend=self.engine,
            base_url=cfg.base_url,
            seed=cfg.seed,
            ov_precision=cfg.ov_precision,
            server=cfg.server,
        )

    def __call__(
        self,
        step: int,
        attempt: int = 0,
        *,
        done: Sequence[Episode] = (),
        on_episode: Callable[[Episode], None] | None = None,
    ) -> list[Episode]:
        """Step `step`'s episodes; `done` holds episodes of this batch sampled before (a resumed warm-start
        round), which are kept and not sampled again; `on_episode` sees each new one as it finishes."""
        cfg = self.cfg
        self.timings.clear()
        policy_engine = self.engine != "teacher" and isinstance(self.backend, AdapterEngine)
        if policy_engine and attempt == 0:  # the weights changed in the last update
            share = broadcast_from_main if self.shared else None
            self.timings["time/weight_sync"] = sync_adapters(
                self.policy, self.backend, self.adapter_dir, main=self.rank == 0, share=share
            )
        shard = {"rank": self.rank, "world": self.world}
        if attempt:
            batch = resample_questions(
                self.questions, step, attempt, cfg.questions_per_step, cfg.seed, **shard
            )
        else:
            batch = questions_for_step(self.questions, step, cfg.questions_per_step, cfg.seed, **shard)
        seed = sampling_seed(cfg.seed, step, self.rank, attempt)
        torch.manual_seed(seed)
        if isinstance(self.backend, SeededEngine):
            self.backend.reseed(seed)
        position = {q.id: i for i, q in enumerate(batch)}  # each question's group together, in batch order
        done = [e for e in done if e.question.id in position]  # another batch's episodes are not this one's
        copies = unsampled(batch, cfg.group_size, done)
        backends = make_backends(
            {"policy": self.backend, **self.extra}, self.retriever, max_batch=cfg.batch_size
        )
        self.policy.model.eval()
        episodes, _ = asyncio.run(
            run_episodes(
                self.team.solve,
                cfg.method,
                copies,
                backends,
                self.sampling,
                model_name=cfg.model,
                concurrency=cfg.concurrency,
                progress=self.progress,
                training=True,
                on_episode=on_episode,
                bugs=self.bugs,
            )
        )
        for episode in episodes:
            episode.group_id = episode.question.id
        return sorted([*done, *episodes], key=lambda e: position[e.question.id])

    def close(self) -> None:
        """Unload the engine's adapters (an engine that holds none has nothing to close)."""
        close = getattr(self.backend, "close", None)
        if close is not None:
            close()


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
    engine: AdapterEngine,
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
    from searchteam.llm.vllm_adapters import run_namespace

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
    if isinstance(engine, ServerEngine):
        engine.for_training(policy.tokenizer, run_namespace(root))
    if share is not None and isinstance(engine, ServerEngine):
        names = save_and_load(engine.load_adapters) if main else None
        shared = share(names)
        if not main:
            engine.adopt_adapters(shared)
    else:
        save_and_load(engine.load_adapters)
    return time.perf_counter() - start
