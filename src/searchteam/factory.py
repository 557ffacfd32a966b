"""Turn a RunConfig into the pieces of a run, for eval, train and serve alike: its questions, the team and
the settings it actually uses, its LLM backends and its retriever."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchteam.config import RunConfig, load_config
from searchteam.data.benchmark import benchmark_corpus, load_benchmark, load_questions, per_dataset_lines
from searchteam.errors import ConfigError
from searchteam.llm import LLM, build_llm, resolve_backend, secondary_backend
from searchteam.llm.models import TRAINED, preset_params
from searchteam.methods import get_method, get_team, resolve_config_path
from searchteam.retrieval.base import Retriever
from searchteam.runtime import Sampling
from searchteam.teams import Team, TeamSettings
from searchteam.teams.base import check_names
from searchteam.types import Question


@dataclass
class Components:
    team: Team
    llms: dict[str, LLM]
    retriever: Retriever | None


def load_run_config(
    path: Path | None,
    overrides: dict[str, Any],
    schema: type[RunConfig] = RunConfig,
    settings: Mapping[str, Any] | None = None,
) -> RunConfig:
    """`config.load_config` for a run: `path` may name a shipped recipe (`methods.shipped_recipes`), and a
    trained adapter named as `model` or a composed team brings its run settings (`with_run_defaults`)."""
    path = resolve_config_path(path) if path is not None else None
    return load_config(path, overrides, schema, settings, complete=with_run_defaults)


def with_run_defaults(data: dict[str, Any], schema: type[RunConfig]) -> dict[str, Any]:
    """`data` completed with the run settings its model and its method bring: those of the trained adapter
    it names as `model`, when it runs that adapter's method (for a composed team's part, that team); those of
    a composed team's file (its `role_models`, `max_new_tokens_per_role`). A field the run leaves unset takes
    their value; a dict merges key by key, the run's keys winning."""
    method = data.get("method", schema.model_fields["method"].default)
    trained = TRAINED.get(str(data.get("model")))
    if trained is not None and method == (trained.team or trained.method):
        data = under(data, trained.run_settings)
    return under(data, get_method(str(method)).run_settings)


def under(data: dict[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    merged = dict(data)
    for key, value in defaults.items():
        given = merged.get(key)
        if given is None:
            merged[key] = value
        elif isinstance(given, dict):
            merged[key] = {**value, **given}
    return merged


def build_team(config: RunConfig) -> Team:
    """The method's team; `top_k`/`max_turns` left unset in the config keep the team's paper defaults.
    A role (in `max_new_tokens_per_role` or `role_models`) or option the method does not have is a
    ConfigError (it would be ignored)."""
    settings = TeamSettings(
        top_k=config.top_k,
        max_turns=config.max_turns,
        new_passages_only=config.new_passages_only,
        options=config.options,
    )
    cls = get_method(config.method).team
    check_names(config.method, "role", "max_new_tokens_per_role", config.max_new_tokens_per_role, cls.roles)
    check_names(config.method, "role", "role_models", config.role_models, cls.roles)
    return get_team(config.method, settings)  # validates the options (`Team.Options`)


def effective_config(config: RunConfig, team: Team) -> dict[str, Any]:
    """The run config as written to `config.yaml`, with the `top_k` and `max_turns` the team actually uses
    (its paper defaults where the config left them unset)."""
    return config.model_dump(mode="json") | {
        "top_k": team.settings.top_k,
        "max_turns": team.settings.max_turns,
    }


def select_questions(config: RunConfig) -> list[Question]:
    """The questions a run names: those of its questions file (only of its datasets, when it names some;
    its `lines` FIRST-LAST, then the first `limit`), else the embedded benchmark's split of its datasets
    (all when none; of each dataset, the `lines`, then the first `limit`)."""
    if config.questions is None:
        questions = load_benchmark(config.datasets, config.split, version=config.benchmark)
        return per_dataset_lines(questions, config.line_range, config.limit)
    questions = load_questions(config.questions, skip_bad_lines=config.skip_bad_lines)
    if config.datasets:
        questions = [q for q in questions if q.dataset in config.datasets]
    if config.line_range:
        first, last = config.line_range
        questions = questions[first - 1 : last]
    return questions[: config.limit] if config.limit else questions


def build_sampling(config: RunConfig) -> Sampling:
    return Sampling(
        temperature=config.temperature,
        top_p=config.top_p,
        max_new_tokens=config.max_new_tokens,
        max_new_tokens_per_role=dict(config.max_new_tokens_per_role),
    )


def build_components(config: RunConfig, team: Team | None = None) -> Components:
    """Load the model(s) and, if the method searches, the retriever (built or loaded from cache)."""
    team = team or build_team(config)
    check_engines_fit(config, config.role_models)
    llms = {"policy": policy_llm(config)}  # first: a role model of the same base shares its vLLM engine
    llms.update(role_llms(config, config.role_models))
    retriever = build_run_retriever(config) if team.uses_retrieval else None
    return Components(team=team, llms=llms, retriever=retriever)


def check_engines_fit(
    config: RunConfig, role_models: Mapping[str, str], training: bool = False, total_bytes: int | None = None
) -> None:
    """Refuse, before any model loads, a run whose in-process engines (the policy's, one per distinct role
    model and, in training, the trainer's own copy of the policy) cannot fit this machine's memory."""
    import psutil

    from searchteam.llm.footprint import engine, memory_problem

    main = resolve_backend(config.backend, config.model, config.device)
    engines = [engine(config.model, main, preset_params(config.model), config.ov_precision, config.dtype)]
    if training and main != "hf":
        engines.append(engine(config.model, "hf", preset_params(config.model), "", config.dtype))
    for model in dict.fromkeys(role_models.values()):
        backend = secondary_backend(config.backend, config.model, model, config.device)
        engines.append(engine(model, backend, preset_params(model), config.ov_precision, config.dtype))
    problem = memory_problem(engines, total_bytes or psutil.virtual_memory().total)
    if problem:
        raise ConfigError(problem)


def role_llms(config: RunConfig, role_models: Mapping[str, str]) -> dict[str, LLM]:
    """An engine for each role that runs on its own model, built once per distinct model: roles that name
    the same model share it."""
    engines: dict[str, LLM] = {}
    for model in dict.fromkeys(role_models.values()):
        engines[model] = secondary_llm(config, model)
    return {role: engines[model] for role, model in role_models.items()}


def build_run_retriever(config: RunConfig):
    """The run's retriever (built or loaded from cache), with its embedder, prefixes and reranker; BM25 and
    dense search the run's `corpus`, else its benchmark version's."""
    from searchteam.retrieval import build_retriever

    corpus = config.corpus
    if corpus is None and config.retriever in ("bm25", "dense"):
        corpus = benchmark_corpus(config.benchmark)
    return build_retriever(
        config.retriever,
        corpus=corpus,
        embedder=config.embedder,
        query_prefix=config.query_prefix,
        passage_prefix=config.passage_prefix,
        reranker=config.reranker,
        rerank_depth=config.rerank_depth,
    )


def policy_llm(config: RunConfig) -> LLM:
    """The run's model on the run's backend, with its engine or server settings."""
    return _build(config, config.model, config.backend, config.base_url)


def secondary_llm(
    config: RunConfig,
    model: str,
    backend: str = "auto",
    base_url: str | list[str] | None = None,
    logprobs: bool = False,
) -> LLM:
    """Another model of the run (a judge, a role's own model such as QAgent's frozen generator, a warm start's
    teacher): on `backend` when one is named, else where `secondary_backend` puts it (the run's server,
    the policy's vLLM engine when it is the same model, else `hf`), so no second in-process engine starts.
    On a server it is `base_url`, else the run's."""
    if backend == "auto":
        backend = secondary_backend(config.backend, config.model, model, config.device)
    return _build(config, model, backend, base_url or config.base_url, logprobs)


def _build(
    config: RunConfig, model: str, backend: str, base_url: str | list[str] | None, logprobs: bool = False
) -> LLM:
    return build_llm(
        model,
        backend=backend,
        base_url=base_url,
        device=config.device,
        dtype=config.dtype,
        logprobs=logprobs,
        seed=config.seed,
        ov_precision=config.ov_precision,
        engine=config.engine,
        server=config.server,
    )
