"""Validated run configuration: defaults, then a YAML file (`--config`), then `--set key=value` settings,
then explicit CLI flags."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from searchteam.errors import ConfigError, did_you_mean
from searchteam.llm.models import DEFAULT_MODEL
from searchteam.llm.settings import BACKENDS, Backend, EngineSettings, ServerSettings

# accelerate's trackers a run may report to; "all" is refused (it would start every installed tracker)
TRACKERS = ("tensorboard", "wandb", "mlflow", "comet_ml", "aim", "clearml", "dvclive", "swanlab", "trackio")
NO_TRACKER = "none"


class RunConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    method: str = Field("naive_rag", description="method name (see `searchteam methods`)")
    model: str = Field(
        DEFAULT_MODEL,
        description="preset (smollm2-135m, qwen2.5-coder-0.5b), trained adapter (`searchteam models`), HF id "
        "or path",
    )
    backend: Backend = Field(
        "auto",
        description=" | ".join(BACKENDS)
        + " (auto: ov on the CPU where it runs the model, hf or vllm on CUDA)",
    )
    ov_precision: Literal["int8", "fp16", "fp32"] = Field(
        "int8", description="weights of the ov backend's converted model (fp32: exactly the hf model)"
    )
    base_url: str | list[str] | None = Field(
        None,
        description="with backend: openai, the server of the policy and of the run's other models; several "
        "servers of the same model as a list (or comma-separated): requests go to the least busy",
    )
    engine: EngineSettings = Field(default_factory=EngineSettings, description="backend: vllm's engine")
    server: ServerSettings = Field(default_factory=ServerSettings, description="backend: openai's client")
    role_models: dict[str, str] = Field(
        default_factory=dict,
        description="a model per role, each a preset, trained adapter, checkpoint or served model name, e.g. "
        "{answerer: qwen2.5-coder-1.5b} or QAgent's frozen {generator: qwen2.5-coder-0.5b}; a role without "
        "one runs on `model`. In training such a role is frozen: served by its own engine, never trained",
    )
    device: str | None = Field(None, description="cpu | cuda | auto; unset: auto")
    dtype: str | None = Field(
        None,
        description="dtype of the hf and vllm backends' weights (float32, bfloat16, float16); unset or auto: "
        "bfloat16 on a GPU that supports it, else float32",
    )
    retriever: str = Field(
        "bm25", description="bm25 | dense | http://host:port of `searchteam serve-retriever`"
    )
    corpus: Path | None = Field(
        None,
        description="corpus JSONL (FlashRAG shape), unset: the embedded one; dense:INDEX_FILE needs its own",
    )
    embedder: str | None = Field(
        None, description="sentence-transformers model of the dense retriever or index"
    )
    query_prefix: str = Field(
        "",
        description="dense retriever: text put before each query it embeds (E5: `query: `); with a prebuilt "
        "index (dense:INDEX_FILE), empty means the embedder's usual one",
    )
    passage_prefix: str = Field(
        "", description="dense retriever: text put before each passage it embeds when it builds its index"
    )
    top_k: int | None = Field(None, ge=1, le=100, description="passages per search; unset: the paper's")
    max_turns: int | None = Field(
        None, ge=1, le=32, description="search rounds of an iterative method; unset: the paper's"
    )
    new_passages_only: bool = Field(
        False, description="a search leaves out the passages its episode already retrieved (returns k new)"
    )
    temperature: float = Field(0.0, ge=0.0, le=5.0, description="sampling temperature (0: greedy)")
    top_p: float = Field(
        1.0,
        gt=0.0,
        le=1.0,
        description="nucleus sampling: sample among the likeliest tokens that make up this probability "
        "(1: off; training needs 1)",
    )
    max_new_tokens: int = Field(
        128, ge=1, le=32768, description="new tokens per LLM call, where max_new_tokens_per_role sets none"
    )
    max_new_tokens_per_role: dict[str, int] = Field(
        default_factory=dict, description="new tokens per LLM call of a role, by the method's role names"
    )
    batch_size: int = Field(
        32,
        ge=1,
        le=4096,
        description="requests per generate call of an in-process engine (ov, hf, vllm), at most; an HTTP "
        "engine (backend: openai) gets each request alone, up to server.concurrency in flight",
    )
    concurrency: int = Field(64, ge=1, le=100000, description="episodes in flight at once")
    seed: int = Field(
        0,
        description="seed of the models' sampling; a training run also draws its questions and seeds its "
        "trainer from it",
    )
    options: dict[str, Any] = Field(
        default_factory=dict, description="the method's team options; one the method does not have is refused"
    )
    datasets: list[str] | None = Field(
        None,
        description="datasets, comma-separated: the benchmark's, or those of a questions file to keep; "
        "unset: all (a training run's: nq and hotpotqa)",
    )
    split: str = Field("dev", description="dev | train | smoke (a training run's default: train)")
    questions: Path | None = Field(
        None, description="your own QA JSONL (question, golden_answers) instead of the benchmark"
    )
    skip_bad_lines: bool = Field(
        False,
        description="skip (with a warning) unparseable lines of the questions file instead of stopping",
    )
    benchmark: Literal["v1", "v2"] = Field(
        "v2",
        description="version of the embedded benchmark whose questions and corpus a run uses: v2, or v1 "
        "(its prefix: 23,831 passages, the first lines of each split) to rerun results reported on v1",
    )
    lines: str | None = Field(
        None,
        pattern=r"^[1-9][0-9]*-[1-9][0-9]*$",
        description="FIRST-LAST: only lines FIRST to LAST (1-based, inclusive) of each dataset's split or "
        "questions file, e.g. 351-450 (the benchmark README says which dev lines are still unread)",
    )
    limit: int | None = Field(None, ge=1, description="at most this many questions per dataset")
    out: Path | None = Field(
        None,
        description="run directory (eval: results.jsonl, summary.json; train: log, checkpoints, plots); "
        "unset: runs/METHOD-MODEL-DATA-SPLIT for eval, runs/train-METHOD for train",
    )
    resume: bool = Field(
        False,
        description="continue the interrupted run in `out`; without it a run refuses an `out` holding one",
    )
    report_to: list[str] | None = Field(
        None,
        description="experiment trackers (accelerate's log_with): tensorboard, wandb, mlflow, comet_ml, aim, "
        "clearml, dvclive, swanlab, trackio, or none; unset: tensorboard for training, none for eval",
    )
    tracker_project: str = Field("searchteam", description="project name the trackers log under")
    judge_model: str | None = Field(
        None, description="LLM judge: eval's judge_acc metric; reward schemes that use one (DECOR)"
    )
    judge_backend: Backend = Field(
        "auto", description="backend of eval's judge_acc judge; auto: as the run's other models"
    )
    judge_base_url: str | None = Field(
        None, description="server of eval's judge with judge_backend: openai; unset: base_url"
    )
    reranker: str | None = Field(
        None,
        description="rescore each search's top rerank_depth passages with this model and keep the top k: "
        "a sentence-transformers CrossEncoder, or a bi-encoder by cosine similarity (all-MiniLM-L6-v2: "
        "the shipped one); cross:NAME or bi:NAME forces the kind",
    )
    rerank_depth: int = Field(20, ge=1, le=1000, description="candidates per search the reranker rescores")

    @model_validator(mode="before")
    @classmethod
    def _no_extra_models(cls, data: Any) -> Any:
        if isinstance(data, dict) and "extra_models" in data:
            raise ValueError(
                "extra_models is now role_models, with the same keys (the roles' names): rename it"
            )
        return data

    @field_validator("base_url", mode="before")
    @classmethod
    def _split_servers(cls, value: Any) -> Any:
        """`--base-url http://a:8000/v1,http://b:8000/v1` or a YAML list; one server stays a string."""
        if isinstance(value, str) and "," in value:
            value = [v.strip() for v in value.split(",") if v.strip()]
        if isinstance(value, list) and len(value) == 1:
            return value[0]
        return value

    @field_validator("datasets", "report_to", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`--dataset nq,hotpotqa`, `--report-to wandb,tensorboard`, or a YAML list."""
        if isinstance(value, str):
            return [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("lines")
    @classmethod
    def _ordered_lines(cls, value: str | None) -> str | None:
        if value is not None:
            first, last = parse_lines(value)
            if first > last:
                raise ValueError(f"lines {value}: FIRST must not be after LAST")
        return value

    @property
    def line_range(self) -> tuple[int, int] | None:
        """`lines` as (first, last), 1-based and inclusive."""
        return None if self.lines is None else parse_lines(self.lines)

    @field_validator("report_to")
    @classmethod
    def _known_trackers(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        names = list(dict.fromkeys(v.lower() for v in value))
        if "all" in names:
            raise ValueError(
                "'all' is not allowed: it starts every installed tracker, some of which contact a network; "
                f"name the trackers ({', '.join(TRACKERS)})"
            )
        unknown = [n for n in names if n not in (*TRACKERS, NO_TRACKER)]
        if unknown:
            raise ValueError(f"unknown tracker(s) {unknown}; choose from {', '.join(TRACKERS)} or none")
        if NO_TRACKER in names and len(names) > 1:
            raise ValueError("'none' cannot be combined with trackers")
        return names


def parse_settings(items: Iterable[str]) -> dict[str, Any]:
    """`--set` items (`key=value`, a dotted key for a nested field: `train.lr=1e-5`) as {key: value}, each
    value read as YAML the way a config file reads it (`true`, `null`, `3`, `[nq, hotpotqa]`)."""
    settings: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not key or any(not part for part in key.split(".")):
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. --set train.lr=1e-5")
        try:
            settings[key] = yaml.safe_load(text) if text.strip() else ""
        except (yaml.YAMLError, ValueError) as exc:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML: {exc}") from None
    return settings


def apply_setting(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` in `data`; a dotted key sets a field of a section (created when absent), keeping the
    section's other fields."""
    *sections, field = key.split(".")
    for depth, name in enumerate(sections):
        section = data.get(name)
        if section is None:
            section = data[name] = {}
        elif not isinstance(section, dict):
            path = ".".join(sections[: depth + 1])
            raise ConfigError(f"cannot set '{key}': '{path}' is {section!r}, not a section of fields")
        else:
            section = data[name] = dict(section)  # never edit a mapping the caller still holds
        data = section
    data[field] = value


def read_yaml(path: Path) -> Any:
    """The YAML document in `path`; any reason it cannot be read becomes a ConfigError naming the file."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:
        raise ConfigError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        return yaml.safe_load(text) or {}
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: a date like 2001-13-01, a 5,000-digit integer
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid YAML: nested too deeply") from None


def load_config(
    path: Path | None,
    overrides: dict[str, Any],
    schema: type[RunConfig] = RunConfig,
    settings: Mapping[str, Any] | None = None,
    complete: Callable[[dict[str, Any], type[RunConfig]], dict[str, Any]] | None = None,
) -> RunConfig:
    """Validate against `schema` a YAML file, then `settings` (`--set`, all given), then CLI overrides (None
    means "not given"); a dotted key in either sets one field of a section (`parse_settings`). `complete`
    fills in what they leave unset before validation (`factory.load_run_config`: a trained adapter's run
    settings)."""
    data: dict[str, Any] = {}
    source = "command line"
    if path is not None:
        source = str(path)
        loaded = read_yaml(path)
        if not isinstance(loaded, dict):
            raise ConfigError(f"{path}: expected a mapping of option names to values at the top level")
        data.update(loaded)
    for key, value in (settings or {}).items():
        apply_setting(data, key, value)
    for key, value in overrides.items():
        if value is not None:
            apply_setting(data, key, value)
    if settings:
        source += " and --set" if path is not None else ", --set"
    try:
        return schema.model_validate(complete(data, schema) if complete else data)
    except ValidationError as exc:
        problems = "; ".join(_problem(err, schema) for err in exc.errors())
        raise ConfigError(f"invalid configuration ({source}): {problems}") from None


def parse_lines(lines: str) -> tuple[int, int]:
    """ "FIRST-LAST" (the `lines` setting) as (first, last)."""
    first, last = lines.split("-")
    return int(first), int(last)


def _problem(err: Any, schema: type[RunConfig]) -> str:
    """One validation error as `field 'x': message`, with a hint for a misspelled field name."""
    loc = err["loc"]
    if not loc:  # a check of the whole config: its message says what is wrong
        return str(err["msg"]).removeprefix("Value error, ")
    text = f"field '{'.'.join(str(p) for p in loc)}': {err['msg']}"
    section = _section_model(schema, loc[:-1])
    if err["type"] == "extra_forbidden" and section is not None:
        text += did_you_mean(str(loc[-1]), section.model_fields)
    return text


def _section_model(schema: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model of the section at `loc` (() is `schema` itself), or None for a dict or a list."""
    model: type[BaseModel] | None = schema
    for name in loc:
        field = model.model_fields.get(str(name)) if model is not None else None
        if field is None:
            return None
        kinds = [field.annotation, *get_args(field.annotation)]
        model = next((k for k in kinds if isinstance(k, type) and issubclass(k, BaseModel)), None)
    return model
