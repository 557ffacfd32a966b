"""Engines and where a run's models go (issue 31 item 4, and item 3 for the in-process vLLM): one vLLM engine
per base model per process, LoRA by role on it, prompts as token ids rendered like `hf`'s, explicit sampling,
and a run's other models (judge, extra models) on the run's server or beside its engine. vLLM itself is not
installed here: a fake `vllm` module records what the backend would hand it."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from searchteam.config import RunConfig, load_config
from searchteam.errors import ConfigError
from searchteam.llm import GenerationRequest, SamplingParams
from searchteam.llm import vllm as vllm_backend
from searchteam.llm.models import TRAINED


@pytest.fixture(autouse=True)
def no_engines(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """An empty engine cache for each test."""
    engines: dict[str, Any] = {}
    monkeypatch.setattr(vllm_backend, "ENGINES", engines, raising=False)
    return engines


class FakeLLM:
    """Stands in for `vllm.LLM`: records each generate call and answers every prompt with 'ok'."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.calls: list[dict[str, Any]] = []

    def generate(self, prompts, params, *, use_tqdm: bool, lora_request):
        self.calls.append({"prompts": prompts, "params": params, "lora": lora_request})
        done = types.SimpleNamespace(text="ok", token_ids=[7, 8], logprobs=None, finish_reason="stop")
        return [
            types.SimpleNamespace(prompt_token_ids=p["prompt_token_ids"], outputs=[done]) for p in prompts
        ]


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch) -> list[FakeLLM]:
    """A `vllm` module whose LLM, SamplingParams and LoRARequest record their arguments; returns the
    engines started."""
    started: list[FakeLLM] = []

    def start(**kwargs: Any) -> FakeLLM:
        started.append(FakeLLM(**kwargs))
        return started[-1]

    vllm = types.ModuleType("vllm")
    vllm.LLM = start  # type: ignore[attr-defined]
    vllm.SamplingParams = lambda **kw: ("sampling", kw)  # type: ignore[attr-defined]
    lora = types.ModuleType("vllm.lora")
    request = types.ModuleType("vllm.lora.request")
    request.LoRARequest = lambda **kw: ("lora", kw)  # type: ignore[attr-defined]
    for name, module in (("vllm", vllm), ("vllm.lora", lora), ("vllm.lora.request", request)):
        monkeypatch.setitem(sys.modules, name, module)
    return started


@pytest.fixture
def tokenizer_of(monkeypatch: pytest.MonkeyPatch):
    """Every model's tokenizer is `tok` (no weights are read)."""

    def use(tok: Any) -> None:
        import transformers

        monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: tok)

    return use


def llama3_like_tokenizer():
    """A tokenizer that, like Llama-3's, adds BOS when encoding with special tokens and whose chat template
    starts with BOS too."""
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    words = ["<bos>", "<eos>", "<unk>", "<user>", "<assistant>", "<eot>", "hi", "there", "so"]
    core = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", 0)])
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core, bos_token="<bos>", eos_token="<eos>", unk_token="<unk>"
    )
    tok.chat_template = (
        "{{ bos_token }}{% for m in messages %}<{{ m.role }}> {{ m.content }} <eot> {% endfor %}"
        "{% if add_generation_prompt %}<assistant> {% endif %}"
    )
    return tok


def make_checkpoint(root: Path, roles: dict[str, int], base: str = "base-model") -> Path:
    """A `searchteam train` checkpoint folder with one peft adapter (of rank r) per role."""
    for role, rank in roles.items():
        folder = root / "policy" / "adapters" / role
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base, "r": rank}))
    return root


def request(role: str = "", text: str = "hi there", **sampling: Any) -> GenerationRequest:
    return GenerationRequest([{"role": "user", "content": text}], SamplingParams(**sampling), role=role)


# --- one engine per model per process --------------------------------------------------------------


def test_one_engine_per_model_in_a_process(fake_vllm, tokenizer_of):
    """The policy, a frozen generator of the same model and a second build share one engine; another model
    gets its own. Fails at 85a4d67: every `build_llm` started an engine (there: vllm missing, LLMError)."""
    from searchteam.llm import build_llm

    tokenizer_of(llama3_like_tokenizer())
    first = build_llm("org/model-a", backend="vllm")
    second = build_llm("org/model-a", backend="vllm", seed=3)
    other = build_llm("org/model-b", backend="vllm")
    assert first.engine is second.engine
    assert other.engine is not first.engine
    assert [e.kwargs["model"] for e in fake_vllm] == ["org/model-a", "org/model-b"]


def test_engine_settings_of_the_run_reach_vllm(fake_vllm, tokenizer_of):
    """`engine:` of the run config becomes `vllm.LLM`'s arguments. Fails at 85a4d67 (no `engine` field)."""
    from searchteam.factory import policy_llm

    tokenizer_of(llama3_like_tokenizer())
    config = RunConfig(
        model="org/model-a",
        backend="vllm",
        engine={
            "gpu_memory_utilization": 0.4,
            "max_model_len": 4096,
            "tensor_parallel_size": 2,
            "max_num_seqs": 32,
            "enforce_eager": True,
        },
    )
    policy_llm(config)
    kwargs = fake_vllm[0].kwargs
    assert kwargs["gpu_memory_utilization"] == 0.4
    assert kwargs["max_model_len"] == 4096
    assert kwargs["tensor_parallel_size"] == 2
    assert kwargs["max_num_seqs"] == 32
    assert kwargs["enforce_eager"] is True
    assert "enable_lora" not in kwargs  # a plain model reserves no LoRA slots


# --- LoRA on the in-process engine ---------------------------------------------------------------


def test_checkpoint_runs_on_its_base_with_one_lora_slot_per_role(tmp_path, fake_vllm, tokenizer_of):
    """A per-role checkpoint starts its base model's engine with LoRA (max_loras = roles, rank = the largest
    adapter's r rounded up to one vLLM takes), and each request names its role's adapter. Fails at 85a4d67:
    the checkpoint folder itself was handed to vLLM as a model."""
    from searchteam.llm import build_llm

    tokenizer_of(llama3_like_tokenizer())
    ckpt = make_checkpoint(tmp_path / "step-4", {"planner": 8, "executor": 12})
    llm = build_llm(str(ckpt), backend="vllm")
    kwargs = fake_vllm[0].kwargs
    assert kwargs["model"] == "base-model"
    assert (kwargs["enable_lora"], kwargs["max_loras"], kwargs["max_lora_rank"]) == (True, 2, 16)

    llm.generate([request("planner"), request("executor"), request("planner"), request("critic")])
    loras = [kw for _, kw in fake_vllm[0].calls[0]["lora"]]
    assert [kw["lora_name"] for kw in loras] == ["planner", "executor", "planner", "executor"]
    assert [kw["lora_path"] for kw in loras[:2]] == [
        str((ckpt / "policy/adapters/planner").absolute()),
        str((ckpt / "policy/adapters/executor").absolute()),
    ]
    ids = {kw["lora_name"]: kw["lora_int_id"] for kw in loras}
    assert len(set(ids.values())) == 2 and min(ids.values()) >= 1  # one id per adapter, never 0


def test_one_shared_adapter_serves_every_role(tmp_path, fake_vllm, tokenizer_of):
    from searchteam.llm import build_llm

    tokenizer_of(llama3_like_tokenizer())
    llm = build_llm(str(make_checkpoint(tmp_path / "run", {"policy": 8})), backend="vllm")
    llm.generate([request("planner"), request("")])
    assert [kw["lora_name"] for _, kw in fake_vllm[0].calls[0]["lora"]] == ["policy", "policy"]


def test_base_model_beside_a_checkpoint_shares_its_engine_without_lora(tmp_path, fake_vllm, tokenizer_of):
    """QAgent's frozen generator (the base model) runs on the policy's engine, on the base weights."""
    from searchteam.llm import build_llm

    tokenizer_of(llama3_like_tokenizer())
    policy = build_llm(str(make_checkpoint(tmp_path / "run", {"agent": 8})), backend="vllm")
    generator = build_llm("base-model", backend="vllm")
    assert generator.engine is policy.engine and len(fake_vllm) == 1
    generator.generate([request("generator")])
    assert fake_vllm[0].calls[0]["lora"] == [None]


def test_adapters_on_an_engine_started_without_lora_are_refused(tmp_path, fake_vllm, tokenizer_of):
    from searchteam.errors import LLMError
    from searchteam.llm import build_llm

    tokenizer_of(llama3_like_tokenizer())
    build_llm("base-model", backend="vllm")
    with pytest.raises(LLMError, match="without LoRA"):
        build_llm(str(make_checkpoint(tmp_path / "run", {"agent": 8})), backend="vllm")


@pytest.mark.parametrize("name", sorted(TRAINED))
def test_shipped_adapters_load_on_their_base_model(name, monkeypatch):
    """Every shipped adapter is read as LoRA on its preset base (the preset is not converted here)."""
    monkeypatch.setattr(vllm_backend, "resolve_model", lambda model: f"resolved:{model}")
    checkpoint = vllm_backend.read_checkpoint(str(TRAINED[name].path))
    assert checkpoint.base == f"resolved:{TRAINED[name].base}"
    assert checkpoint.adapters and all(p.is_dir() for p in checkpoint.adapters.values())
    kwargs = vllm_backend.engine_kwargs(checkpoint, RunConfig().engine, dtype=None, seed=0)
    assert kwargs["enable_lora"] and kwargs["max_loras"] == len(checkpoint.adapters)
    assert kwargs["max_lora_rank"] >= 8


# --- prompts and sampling ------------------------------------------------------------------------


def test_prompt_is_rendered_once_and_sent_as_token_ids(fake_vllm, tokenizer_of):
    """Item 3: the engine gets the `hf` rendering's token ids (TokensPrompt), with one BOS, not text that it
    would tokenize again with special tokens (a second BOS on Llama-3). Fails at 85a4d67 (text prompts)."""
    from searchteam.llm import build_llm
    from searchteam.llm.base import render_chat

    tok = llama3_like_tokenizer()
    tokenizer_of(tok)
    llm = build_llm("org/llama-like", backend="vllm")
    req = request(text="hi there")
    req.continuation = "so"
    llm.generate([req])
    (prompt,) = fake_vllm[0].calls[0]["prompts"]
    text = render_chat(tok, req)
    assert prompt == {"prompt_token_ids": tok(text, add_special_tokens=False).input_ids}
    assert prompt["prompt_token_ids"].count(tok.bos_token_id) == 1
    assert tok(text).input_ids.count(tok.bos_token_id) == 2  # what re-tokenizing the text would have sent


def test_sampling_is_the_plain_temperature_softmax_the_trainer_scores(fake_vllm, tokenizer_of):
    """Item 2 for the in-process engine: top-k off, no penalties, min-p 0, top-p from the config. Fails at
    85a4d67 (top_k, repetition_penalty and min_p were left to the model's generation_config)."""
    from searchteam.llm import build_llm

    tokenizer_of(llama3_like_tokenizer())
    llm = build_llm("org/model-a", backend="vllm")
    llm.generate([request(temperature=0.7, top_p=0.9, max_new_tokens=33, stop=("</answer>",)), request()])
    (_, sampled), (_, greedy) = fake_vllm[0].calls[0]["params"]
    assert sampled["top_k"] in (-1, 0)
    assert (sampled["repetition_penalty"], sampled["min_p"]) == (1.0, 0.0)
    assert (sampled["presence_penalty"], sampled["frequency_penalty"]) == (0.0, 0.0)
    assert (sampled["temperature"], sampled["top_p"], sampled["max_tokens"]) == (0.7, 0.9, 33)
    assert sampled["stop"] == ["</answer>"] and sampled["include_stop_str_in_output"]
    assert (greedy["temperature"], greedy["top_p"], greedy["top_k"]) == (0.0, 1.0, -1)


def test_logprobs_are_of_the_sampled_distribution():
    """With logprobs, vLLM must report them after temperature (as the trainer computes them)."""
    checkpoint = vllm_backend.Checkpoint("m")
    assert vllm_backend.engine_kwargs(checkpoint, RunConfig().engine, dtype=None, seed=0)[
        "logprobs_mode"
    ] == ("processed_logprobs")
    assert vllm_backend.sampling_kwargs(SamplingParams(), logprobs=True)["logprobs"] == 0


# --- where the run's other models go -------------------------------------------------------------


def test_other_models_go_to_the_run_server_or_beside_its_engine(monkeypatch, no_engines):
    """Fails at 85a4d67: there is no `secondary_backend`; every model went to `auto` (a new engine each)."""
    import importlib.util

    import searchteam.llm.hf as hf
    from searchteam.llm import secondary_backend

    assert secondary_backend("openai", "policy-model", "judge-model") == "openai"
    assert secondary_backend("hf", "policy-model", "judge-model") == "hf"
    monkeypatch.setattr(hf, "pick_device", lambda device: "cuda")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: object() if name == "vllm" else real(name, *a)
    )
    no_engines["org/policy"] = object()  # the policy's engine is running
    for backend in ("auto", "vllm"):
        assert secondary_backend(backend, "org/policy", "org/judge") == "hf"
        assert secondary_backend(backend, "org/policy", "org/policy") == "vllm"
    no_engines.clear()  # e.g. training: the policy is on hf, no engine runs
    assert secondary_backend("auto", "org/policy", "org/policy") == "hf"


def test_run_server_reaches_judge_and_role_models():
    """With backend: openai, the judge and role models get the run's base_url and client settings unless
    they name their own. Fails at 85a4d67: the judge had no base_url ('needs --base-url')."""
    from searchteam.eval.runner import build_judge
    from searchteam.factory import secondary_llm

    config = RunConfig(
        backend="openai",
        base_url="http://127.0.0.1:8000/v1",
        judge_model="served-judge",
        server={"timeout": 30, "concurrency": 8, "max_retries": 1},
    )
    judge = build_judge(config)
    extra = secondary_llm(config, "served-generator")
    for llm, name in ((judge, "served-judge"), (extra, "served-generator")):
        assert (llm.name, llm.base_url) == (name, "http://127.0.0.1:8000/v1")
        assert (llm.timeout, llm.concurrency, llm.max_retries) == (30, 8, 1)
    own = build_judge(config.model_copy(update={"judge_base_url": "http://127.0.0.1:9000/v1"}))
    assert own.base_url == "http://127.0.0.1:9000/v1"


def test_build_components_puts_role_models_on_the_run_server(monkeypatch):
    import searchteam.factory as factory

    monkeypatch.setattr(factory, "build_run_retriever", lambda config: None)
    config = RunConfig(
        method="qagent",
        model="served-policy",
        backend="openai",
        base_url="http://127.0.0.1:8000/v1",
        options={"mode": "submodule"},
        role_models={"generator": "served-generator"},
    )
    llms = factory.build_components(config).llms
    assert {name: (llm.name, llm.base_url) for name, llm in llms.items()} == {
        "policy": ("served-policy", "http://127.0.0.1:8000/v1"),
        "generator": ("served-generator", "http://127.0.0.1:8000/v1"),
    }


# --- config ---------------------------------------------------------------------------------------


def test_engine_and_server_sections_load_and_validate(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text(
        "backend: vllm\nengine:\n  gpu_memory_utilization: 0.5\n  max_lora_rank: 32\n"
        "server:\n  timeout: 600\n  concurrency: 16\n"
    )
    config = load_config(path, {})
    assert (config.engine.gpu_memory_utilization, config.engine.max_lora_rank) == (0.5, 32)
    assert (config.server.timeout, config.server.concurrency, config.server.max_retries) == (600, 16, 4)
    for section, problem in (
        ("engine:\n  gpu_memory_utilization: 1.5\n", "engine.gpu_memory_utilization"),
        ("engine:\n  max_lora_rank: 12\n", "engine.max_lora_rank"),
        ("engine:\n  gpu_mem: 0.5\n", "engine.gpu_mem"),
        ("server:\n  concurrency: 0\n", "server.concurrency"),
    ):
        path.write_text(section)
        with pytest.raises(ConfigError, match=problem.replace(".", r"\.")):
            load_config(path, {})


def test_a_resumed_eval_may_change_engine_and_server_settings(tmp_path):
    """They decide how fast a run goes, not its answers; a run directory written before they existed
    resumes too."""
    import yaml

    from searchteam.eval.runner import check_resume_matches

    old = RunConfig().model_dump(mode="json")
    del old["engine"], old["server"]
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(old))
    now = RunConfig(engine={"max_num_seqs": 8}, server={"timeout": 5}).model_dump(mode="json")
    check_resume_matches(tmp_path, now)
