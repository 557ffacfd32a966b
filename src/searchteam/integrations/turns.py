"""A run's turns as rows: one row per LLM call, the rows `searchteam export` writes.

A run is an eval run (`results.jsonl`: one episode per question) or a training run (its warm start's
sampled episodes, `warm_start/collected-NN.jsonl`, and its RL rollouts, `rollouts.jsonl`). Each row holds
the turn's identity, its prompt messages and completion, its tokens (the engine's ids where the run recorded
them, else the prompt rendered with the model's chat template and tokenized, as the trainer does), the
rewards, and the task with its retrieved passages.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import yaml

from searchteam.errors import ExperienceError, ExportError, JsonlError
from searchteam.files import read_jsonl_tolerant
from searchteam.metrics import answer_scores
from searchteam.retrieval.corpus import corpus_of_run, find_passages
from searchteam.rl.experience import chat_render, group_key, turn_token_ids
from searchteam.rl.warm_start.data import collected_rounds, read_collected
from searchteam.types import Episode, Passage, Question, Retrieval, Turn

EVAL_RESULTS = "results.jsonl"
ROLLOUTS = "rollouts.jsonl"

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))
TURN_SCHEMA = pa.schema(
    [
        # identity
        ("run", pa.string()),
        ("source", pa.string()),  # eval | warm_start | rollout
        ("method", pa.string()),
        ("model", pa.string()),
        ("adapter", pa.string()),
        ("question_id", pa.string()),
        ("dataset", pa.string()),
        ("group", pa.string()),
        ("episode", pa.int64()),
        ("turn", pa.int64()),
        ("training_step", pa.int64()),
        ("warm_start_round", pa.int64()),
        ("role", pa.string()),
        ("role_step", pa.int64()),
        # messages
        ("prompt", MESSAGES),
        ("continuation", pa.string()),  # assistant text the call continued: a prefill, or earlier turns
        ("env_spans", pa.list_(pa.list_(pa.int64()))),  # [start, end) of retrieved text in `continuation`
        ("completion", pa.string()),
        ("trained", pa.bool_()),
        # tokens
        ("prompt_ids", pa.list_(pa.int64())),
        ("completion_ids", pa.list_(pa.int64())),
        ("logprobs", pa.list_(pa.float64())),
        ("loss_mask", pa.list_(pa.int64())),
        ("tokens_recorded", pa.bool_()),
        ("tokenizer", pa.string()),
        ("chat_template_sha256", pa.string()),
        # RL
        ("turn_reward", pa.float64()),
        ("episode_reward", pa.float64()),
        ("reward_terms", pa.string()),  # JSON object: term name -> value
        ("parsed_ok", pa.bool_()),
        ("parse_error", pa.string()),
        # task
        ("question", pa.string()),
        ("golden_answers", pa.list_(pa.string())),
        ("prediction", pa.string()),
        ("em", pa.float64()),
        ("f1", pa.float64()),
        ("passage_ids", pa.list_(pa.string())),
        ("passage_titles", pa.list_(pa.string())),
        ("passage_texts", pa.list_(pa.string())),
    ]
)


@dataclass
class RunEpisode:
    """One recorded episode and where in the run it came from."""

    episode: Episode
    source: str
    training_step: int | None = None
    warm_start_round: int | None = None


@dataclass
class RunInfo:
    name: str
    method: str
    model: str
    adapter: str
    config: dict[str, Any]


@dataclass
class Tokenizing:
    """The tokenizer the rows' ids come from, and what identifies it."""

    tokenizer: Any
    name: str
    template_sha256: str


def read_run(run_dir: Path) -> tuple[RunInfo, list[RunEpisode]]:
    """The run's settings and every episode it recorded, in file order."""
    try:
        return _read_run(run_dir)
    except JsonlError as exc:
        raise ExportError(f"{exc}: the file is damaged; repair or delete that line") from None


def _read_run(run_dir: Path) -> tuple[RunInfo, list[RunEpisode]]:
    config_path = run_dir / "config.yaml"
    if not config_path.is_file():
        raise ExportError(
            f"{run_dir} is not a run folder: it has no config.yaml (give a searchteam eval or "
            "train output folder)"
        )
    config = yaml.safe_load(config_path.read_text(encoding="utf-8")) or {}
    info = RunInfo(run_dir.name, str(config.get("method", "")), *_model_and_adapter(config), config)
    if (run_dir / EVAL_RESULTS).is_file():
        rows = read_jsonl_tolerant(run_dir / EVAL_RESULTS)
        return info, [RunEpisode(_eval_episode(row, info.method), "eval") for row in rows]
    episodes = [
        RunEpisode(episode, "warm_start", warm_start_round=round_index)
        for round_index in collected_rounds(run_dir)
        for episode in (read_collected(run_dir, round_index) or ([], []))[0]
    ]
    if (run_dir / ROLLOUTS).is_file():
        episodes += [_rollout_episode(r, info.method) for r in read_jsonl_tolerant(run_dir / ROLLOUTS)]
    if not episodes:
        raise ExportError(
            f"{run_dir} holds no episodes: neither {EVAL_RESULTS} (searchteam eval) nor {ROLLOUTS} or "
            "warm_start/collected-NN.jsonl (searchteam train)"
        )
    return info, episodes


def _model_and_adapter(config: dict[str, Any]) -> tuple[str, str]:
    """The base model and the adapter a run ran: a trained adapter's name or a checkpoint folder given as
    `model` (eval), or the checkpoint a training run started from (`init_from`)."""
    from searchteam.llm.models import TRAINED

    model = str(config.get("model", ""))
    if model in TRAINED:
        return TRAINED[model].base, model
    if (Path(model) / "policy").is_dir():
        return _checkpoint_base(model), model
    return model, str(config.get("init_from") or "")


def _checkpoint_base(folder: str) -> str:
    from searchteam.llm.models import preset_of
    from searchteam.llm.vllm import read_checkpoint

    base = read_checkpoint(folder).base
    return preset_of(base) or base


def _eval_episode(row: dict[str, Any], method: str) -> Episode:
    question = Question(
        id=str(row["id"]),
        question=row.get("question", ""),
        golden_answers=row.get("golden_answers", []),
        dataset=row.get("dataset", "custom"),
    )
    retrievals = [
        Retrieval(
            query=s.get("query", ""),
            k=len(s.get("ids", [])),
            step=s.get("step", 0),
            after_turns=s.get("after_turns", 0),
            passages=[Passage(id=str(i), text="") for i in s.get("ids", [])],
        )
        for s in row.get("searches", [])
    ]
    return Episode(
        question=question,
        method=method,
        turns=[Turn.model_validate(t) for t in row.get("turns", [])],
        retrievals=retrievals,
        answer=row.get("prediction") or "",
        error=row.get("error"),
    )


def _rollout_episode(record: dict[str, Any], method: str) -> RunEpisode:
    fields = {k: v for k, v in record.items() if k != "step"}
    episode = Episode.model_validate({"method": method, **fields})
    return RunEpisode(episode, "rollout", training_step=record.get("step"))


def load_tokenizing(model: str, override: str | None = None) -> Tokenizing:
    """The tokenizer of the run's base model (or `override`), from files on this machine only."""
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model

    name = override or model
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolve_model(name), local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ExportError(
            f"cannot load the tokenizer of {name} from this machine ({exc}); pass --tokenizer PATH, or "
            "--no-tokens to export text only"
        ) from None
    template = tokenizer.chat_template or ""
    return Tokenizing(tokenizer, name, hashlib.sha256(template.encode("utf-8")).hexdigest())


def passages_by_id(
    info: RunInfo, records: list[RunEpisode], corpus: Path | None
) -> tuple[dict[str, Passage], str]:
    """Titles and texts for passages the run recorded by id only (eval results), from the run's corpus;
    a note when they stay unknown."""
    wanted = {p.id for r in records for p in r.episode.retrieved_passages() if not (p.title or p.text)}
    if not wanted:
        return {}, ""
    where, why = corpus_of_run(info.config, corpus)
    if where is None:
        return {}, f"passage titles and texts unknown: {why}"
    found = find_passages(where, wanted)
    missing = len(wanted) - len(found)
    return found, f"{missing} passage ids not in {where}" if missing else ""


def turn_rows(
    info: RunInfo,
    records: list[RunEpisode],
    tokenizing: Tokenizing | None,
    passages: dict[str, Passage],
    with_texts: bool = True,
    run_name: str = "",
) -> Iterable[dict[str, Any]]:
    """One row per turn of every episode, in the order of `TURN_SCHEMA`; `run_name` (default: the run
    folder's name) tells runs apart in a dataset of several."""
    run_name = run_name or info.name
    render = chat_render(tokenizing.tokenizer) if tokenizing else None
    for index, record in enumerate(records):
        episode = record.episode
        q = episode.question
        scores = answer_scores(episode.answer, q.golden_answers)
        shown = [passages.get(p.id, p) for p in episode.retrieved_passages()]
        task = {
            "question": q.question,
            "golden_answers": list(q.golden_answers),
            "prediction": episode.answer,
            "em": scores["em"],
            "f1": scores["f1"],
            "passage_ids": [p.id for p in shown],
            "passage_titles": [p.title for p in shown],
            "passage_texts": [p.text for p in shown] if with_texts else None,
        }
        identity = {
            "run": run_name,
            "source": record.source,
            "method": info.method,
            "model": info.model,
            "adapter": info.adapter,
            "question_id": q.id,
            "dataset": q.dataset,
            "group": group_key(episode),
            "episode": index,
            "training_step": record.training_step,
            "warm_start_round": record.warm_start_round,
        }
        for turn_index, turn in enumerate(episode.turns):
            yield {
                **identity,
                "turn": turn_index,
                "role": turn.role,
                "role_step": turn.step,
                "prompt": [
                    {"role": m.get("role", ""), "content": m.get("content", "")} for m in turn.messages
                ],
                "continuation": turn.continuation,
                "env_spans": turn.env_spans,
                "completion": turn.completion,
                "trained": turn.model == "policy" and not turn.frozen,
                **_tokens(turn, tokenizing, render),
                "turn_reward": turn.reward,
                "episode_reward": episode.reward,
                "reward_terms": json.dumps(episode.reward_terms),
                "parsed_ok": turn.parsed_ok,
                "parse_error": turn.parse_error,
                **task,
            }


def _tokens(turn: Turn, tokenizing: Tokenizing | None, render) -> dict[str, Any]:
    """Token ids for a policy turn (another model's turns were made by another tokenizer: none)."""
    none = {
        "prompt_ids": None,
        "completion_ids": None,
        "logprobs": None,
        "loss_mask": None,
        "tokens_recorded": False,
        "tokenizer": None,
        "chat_template_sha256": None,
    }
    if tokenizing is None or turn.model != "policy" or not (turn.messages or turn.prompt_token_ids):
        return none
    try:
        prompt, completion = turn_token_ids(turn, tokenizing.tokenizer, render)
    except ExperienceError:
        return none
    known = turn.logprobs is not None and len(turn.logprobs) == len(completion)
    trained = not turn.frozen
    return {
        "prompt_ids": prompt,
        "completion_ids": completion,
        "logprobs": list(turn.logprobs) if known else None,
        "loss_mask": [int(trained)] * len(completion),
        "tokens_recorded": bool(turn.prompt_token_ids),
        "tokenizer": tokenizing.name,
        "chat_template_sha256": tokenizing.template_sha256,
    }
