"""The `openai` backend against a fake vLLM server with vLLM's own semantics (tests/support/fake_vllm.py):
adapter names that never collide (two backends, a warm start then RL, a resumed run), sampling parameters
sent explicitly so the server samples what the trainer scores, token prompts rendered as the `hf` backend
renders them, and training refused without token ids. Also the `hf` and `ov` backends' effective sampling
against the trainer's distribution (the plain temperature softmax)."""

from __future__ import annotations

import gc
import json
from pathlib import Path

import pytest
import torch

from searchteam.errors import ConfigError, LLMError
from searchteam.llm import GenerationRequest, SamplingParams
from searchteam.llm.base import render_prompt_ids
from searchteam.llm.hf import HFBackend, encode_prompts, generation_kwargs
from searchteam.llm.models import PRESETS, resolve_model
from searchteam.llm.openai import OpenAIBackend
from searchteam.llm.vllm_adapters import run_namespace
from searchteam.rl.config import TrainConfig
from searchteam.rl.policy import load_policy
from searchteam.train.config import load_train_run_config
from searchteam.train.rollout import sync_adapters
from tests.support.fake_vllm import QWEN_GENERATION_CONFIG, FakeVLLM, byte_tokenizer
from tests.support.helpers import serve_on_loopback

ROLES = ["searcher", "generator"]
TRAINER_SAMPLING = {"top_k": 0, "min_p": 0.0, "repetition_penalty": 1.0, "presence_penalty": 0.0}
TRAINER_SAMPLING["frequency_penalty"] = 0.0
CHATS = [
    [{"role": "user", "content": "Who wrote Hamlet?"}],
    [
        {"role": "system", "content": "Answer briefly.\nUse <answer></answer> tags."},
        {"role": "user", "content": "  Capital of France?  "},
    ],
    [
        {"role": "user", "content": "Question: when was the Eiffel Tower built?"},
        {"role": "assistant", "content": "<search>Eiffel Tower construction</search>"},
        {"role": "user", "content": "<information>1887 to 1889</information>"},
    ],
]


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture
def vllm(tokenizer):
    """A fake `vllm serve base` with runtime LoRA and Qwen2.5-Instruct's generation_config defaults."""
    fake = FakeVLLM(tokenizer=tokenizer, generation_config=dict(QWEN_GENERATION_CONFIG))
    with serve_on_loopback(fake.app()) as url:
        yield fake, url


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A randomly initialised Llama with the byte tokenizer, saved like any local model folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    folder = tmp_path_factory.mktemp("tiny-llama")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def role_policy(tiny_model_dir):
    """A real per-role LoRA policy (peft adapters saved exactly as training saves them)."""
    config = TrainConfig(lora_per_role=True, roles=ROLES, lora_r=8)
    return load_policy(str(tiny_model_dir), config, device="cpu", dtype="float32")


def _adapters(tmp_path: Path, tag: str, roles: list[str] = ROLES, r: int = 8) -> dict[str, Path]:
    out = {}
    for role in roles:
        folder = tmp_path / tag / role
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": 16}))
        out[role] = folder
    return out


def _ask(backend: OpenAIBackend, roles: list[str], sampling: SamplingParams | None = None) -> list[str]:
    """The served model each role's request reached (the fake answers `model=NAME`)."""
    sampling = sampling or SamplingParams(max_new_tokens=64)
    reqs = [GenerationRequest(list(CHATS[0]), sampling, role=role) for role in roles]
    return [c.text.removeprefix("model=") for c in backend.generate(reqs)]


def _loaded_twice(fake: FakeVLLM) -> list[str]:
    loads = [name for kind, name in fake.lora_calls if kind == "load"]
    return sorted({n for n in loads if loads.count(n) > 1})


# ---- item 1: adapter names ----------------------------------------------------------------------------


def test_two_backends_on_one_server_do_not_collide(vllm, tmp_path):
    """Two processes (ranks, or a run beside an eval) each loading per-role adapters, twice."""
    fake, url = vllm
    one, two = OpenAIBackend("base", url, max_retries=0), OpenAIBackend("base", url, max_retries=0)
    for step in range(2):
        one.load_adapters(_adapters(tmp_path, f"one-{step}"))
        two.load_adapters(_adapters(tmp_path, f"two-{step}"))
    assert len(fake.loras) == 4 and _loaded_twice(fake) == []
    assert set(one.served_adapters.values()) | set(two.served_adapters.values()) == set(fake.loras)
    assert _ask(one, ROLES) == [one.served_adapters[r] for r in ROLES]
    assert _ask(two, ROLES) == [two.served_adapters[r] for r in ROLES]
    assert fake.loras[one.served_adapters["searcher"]] == str(tmp_path / "one-1" / "searcher")


def test_every_update_loads_a_fresh_name_in_the_run_namespace(vllm, tmp_path, tokenizer):
    fake, url = vllm
    backend = OpenAIBackend("base", url, tokenizer=tokenizer, namespace="run7", max_retries=0)
    seen: list[dict[str, str]] = [backend.load_adapters(_adapters(tmp_path, f"s{i}")) for i in range(3)]
    names = [name for served in seen for name in served.values()]
    assert len(set(names)) == 6 and all(n.startswith("run7:") for n in names)
    assert [n.split(":")[1].split("@")[0] for n in names[:2]] == ROLES
    assert set(fake.loras) == set(seen[-1].values())  # the older versions are unloaded
    # new names load before the old ones unload: no request ever names a missing adapter
    kinds = [kind for kind, _ in fake.lora_calls]
    assert kinds == ["load", "load"] + ["load", "load", "unload", "unload"] * 2


def test_warm_start_then_rl_in_one_process_do_not_collide(vllm, tmp_path, role_policy):
    """The warm start's engine is dropped without closing; RL's engine then loads the same roles."""
    fake, url = vllm
    rollout_adapters = tmp_path / "run" / "rollout_adapters"
    warm, rl = OpenAIBackend("base", url, max_retries=0), OpenAIBackend("base", url, max_retries=0)
    for _ in range(2):
        sync_adapters(role_policy, warm, rollout_adapters / "warm_start" / "rank0")
    for _ in range(2):
        sync_adapters(role_policy, rl, rollout_adapters / "rank0")
    assert _loaded_twice(fake) == [] and set(rl.served_adapters) == set(ROLES)
    assert not set(warm.served_adapters.values()) & set(rl.served_adapters.values())
    for folder in (rollout_adapters / "rank0").iterdir():  # a server running as another user reads them
        assert folder.stat().st_mode & 0o777 == 0o755
    assert _ask(rl, ROLES) == [rl.served_adapters[r] for r in ROLES]
    del warm
    gc.collect()  # a dropped engine unloads what it loaded
    assert set(fake.loras) == set(rl.served_adapters.values())


def test_a_resumed_run_unloads_the_stale_names_of_its_run_only(vllm, tmp_path, role_policy):
    """A run killed after loading its adapters (it unloads nothing), another run on the same server and
    an adapter loaded by hand; then the first run resumes."""
    fake, url = vllm
    root = tmp_path / "run" / "rollout_adapters" / "rank0"
    killed = OpenAIBackend("base", url, max_retries=0)  # kept alive: its exit-time unload never runs
    sync_adapters(role_policy, killed, root)
    other_run = OpenAIBackend("base", url, max_retries=0)
    sync_adapters(role_policy, other_run, tmp_path / "other" / "rollout_adapters" / "rank0")
    fake.loras["my-own-lora"] = str(_adapters(tmp_path, "mine", ["x"])["x"])  # `--lora-modules`

    resumed = OpenAIBackend("base", url, max_retries=0)
    sync_adapters(role_policy, resumed, root)
    stale = set(killed.served_adapters.values())
    assert not stale & set(fake.loras) and {("unload", name) for name in stale} <= set(fake.lora_calls)
    kept = set(resumed.served_adapters.values()) | set(other_run.served_adapters.values()) | {"my-own-lora"}
    assert set(fake.loras) == kept and _loaded_twice(fake) == []
    assert all(name.startswith(run_namespace(root) + ":") for name in resumed.served_adapters.values())


def test_the_main_process_loads_and_the_others_adopt(vllm, tmp_path, tokenizer):
    """Several processes on one server: only the main one loads (and unloads); the others route to the
    names it broadcasts, with no call of their own."""
    fake, url = vllm
    main = OpenAIBackend("base", url, tokenizer=tokenizer, namespace="run", max_retries=0)
    ranks = [
        OpenAIBackend("base", url, tokenizer=tokenizer, namespace="run", max_retries=0) for _ in range(3)
    ]
    for step in range(2):
        names = main.load_adapters(_adapters(tmp_path, f"step{step}"))
        calls = len(fake.lora_calls)
        for rank in ranks:
            rank.adopt_adapters(names)
        assert len(fake.lora_calls) == calls
        assert all(_ask(rank, ROLES) == [names[r] for r in ROLES] for rank in ranks)
    for rank in ranks:
        rank.close()  # adopted names are not theirs to unload
    assert set(fake.loras) == set(names.values())
    main.close()
    assert fake.loras == {} and _ask(main, ["searcher"]) == ["base"]


def test_sync_adapters_with_share_loads_once_for_every_process(vllm, tmp_path, role_policy):
    """sync_adapters as several processes call it: the main one saves and loads, `share` (a broadcast)
    hands its names to the others, which write no folder and make no call."""
    fake, url = vllm
    engines = [OpenAIBackend("base", url, max_retries=0) for _ in range(3)]
    roots = [tmp_path / "run" / "rollout_adapters" / f"rank{rank}" for rank in range(3)]
    slot: list[dict[str, str]] = []

    def share(names: dict[str, str] | None) -> dict[str, str]:
        if names is not None:  # the main process's call comes first in this sequential stand-in
            slot[:] = [names]
        return slot[0]

    for _ in range(2):
        for rank, (engine, root) in enumerate(zip(engines, roots, strict=True)):
            sync_adapters(role_policy, engine, root, main=rank == 0, share=share)
    assert [kind for kind, _ in fake.lora_calls] == ["load", "load", "load", "load", "unload", "unload"]
    assert all(engine.served_adapters == slot[0] for engine in engines) and set(fake.loras) == set(
        slot[0].values()
    )
    assert not roots[1].exists() and not roots[2].exists()
    assert all(_ask(engine, ROLES) == [slot[0][r] for r in ROLES] for engine in engines)


def test_unreadable_adapter_folder_says_to_share_the_filesystem(vllm, tmp_path, tokenizer):
    _, url = vllm
    backend = OpenAIBackend("base", url, tokenizer=tokenizer, max_retries=0)
    with pytest.raises(LLMError, match="share a filesystem"):
        backend.load_adapters({"searcher": tmp_path / "not-there"})
    assert backend.served_adapters == {}


# ---- item 2: sampling -----------------------------------------------------------------------------------


@pytest.mark.parametrize("render", ["client", "server"])
def test_sampling_parameters_are_sent_explicitly(vllm, tokenizer, render):
    """The server holds Qwen2.5's generation_config (top_k 20, repetition penalty 1.05, top_p 0.8,
    temperature 0.7); what it samples with must still be the trainer's temperature softmax."""
    fake, url = vllm
    given = {"tokenizer": tokenizer} if render == "client" else {}  # "base" has no local tokenizer
    backend = OpenAIBackend("base", url, max_retries=0, **given)
    sampled = SamplingParams(max_new_tokens=64, temperature=1.0)
    backend.generate([GenerationRequest(list(CHATS[0]), sampled)])
    backend.generate([GenerationRequest(list(CHATS[0]), SamplingParams(max_new_tokens=64))])
    assert ("prompt" in fake.requests[0]) == (render == "client")
    assert fake.sampled_with == [
        {**TRAINER_SAMPLING, "temperature": 1.0, "top_p": 1.0},
        {**TRAINER_SAMPLING, "temperature": 0.0, "top_p": 1.0},
    ]


def test_training_refuses_top_p_below_one():
    with pytest.raises(ConfigError, match="field 'top_p'.*set top_p: 1"):
        load_train_run_config(None, {"top_p": 0.9})
    assert load_train_run_config(None, {"top_p": 1.0}).top_p == 1.0


def test_hf_generate_samples_the_trainer_distribution(tiny_model_dir, tokenizer):
    """The model's generation_config asks for every processor transformers has; the hf backend's
    generate must still see logits / T (sampling) or the raw logits (greedy) at every step."""
    from transformers import AutoModelForCausalLM, GenerationConfig

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    model.generation_config = GenerationConfig(
        **QWEN_GENERATION_CONFIG,
        do_sample=True,
        min_p=0.05,
        typical_p=0.9,
        no_repeat_ngram_size=2,
        min_new_tokens=4,
        suppress_tokens=[5],
        bad_words_ids=[[6]],
        renormalize_logits=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    scores: list[torch.Tensor] = []
    original = model.generate

    def recording_generate(**kwargs):
        out = original(**kwargs, output_scores=True, return_dict_in_generate=True)
        scores.append(torch.stack(out.scores, dim=1))
        return out.sequences

    model.generate = recording_generate
    backend = HFBackend("tiny", model=model, tokenizer=tokenizer, seed=0)
    for temperature in (0.7, 0.0):
        sampling = SamplingParams(max_new_tokens=5, temperature=temperature)
        (out,) = backend.generate([GenerationRequest(list(CHATS[1]), sampling)])
        ids = torch.tensor([out.prompt_token_ids + out.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(out.prompt_token_ids) - 1 : -1]
        steps = len(out.token_ids)
        torch.testing.assert_close(scores[-1][0, :steps], logits / (temperature or 1.0), rtol=1e-4, atol=1e-4)


def test_hf_generation_kwargs_set_every_processor_off():
    kwargs = generation_kwargs(SamplingParams(temperature=0.5, top_p=1.0))
    assert (
        kwargs["top_k"] is None and kwargs["repetition_penalty"] == 1.0 and kwargs["min_new_tokens"] is None
    )
    assert (kwargs["temperature"], kwargs["top_p"], kwargs["do_sample"]) == (0.5, 1.0, True)


def test_ov_generation_config_is_the_plain_softmax():
    pytest.importorskip("openvino_genai")
    from searchteam.llm.ov import generation_config

    sampled = generation_config(SamplingParams(temperature=0.7), 2, {2}, seed=3)
    assert sampled.is_multinomial() and sampled.top_k == 0 and sampled.top_p == 1.0
    assert (sampled.repetition_penalty, sampled.presence_penalty, sampled.frequency_penalty) == (
        1.0,
        0.0,
        0.0,
    )
    assert sampled.min_p == 0.0 and sampled.min_new_tokens == 0
    assert sampled.temperature == pytest.approx(0.7)
    greedy = generation_config(SamplingParams(), 2, {2}, seed=None)
    assert greedy.is_greedy_decoding() and greedy.repetition_penalty == 1.0 and greedy.top_k == 0


# ---- item 3: prompts and token ids ---------------------------------------------------------------------


def test_the_server_never_renders_a_chat(tokenizer, tiny_model_dir):
    """The server's own template trims the assistant's continuation (as Llama-3's does); the client's
    rendering, with the model folder's tokenizer, is what it generates from."""
    server_side = byte_tokenizer()
    server_side.chat_template = server_side.chat_template.replace("m['content']", "m['content'] | trim")
    fake = FakeVLLM(tokenizer=server_side, model=str(tiny_model_dir))
    continuation = "<search>Eiffel </search>\n\n<information>1887</information>\n\n"
    reqs = [GenerationRequest(list(CHATS[1])), GenerationRequest(list(CHATS[0]), continuation=continuation)]
    with serve_on_loopback(fake.app()) as url:
        outs = OpenAIBackend(str(tiny_model_dir), url, max_retries=0).generate(reqs)
    assert sorted(fake.prompts) == sorted(render_prompt_ids(tokenizer, r) for r in reqs)  # any order
    assert all("prompt" in body and "messages" not in body for body in fake.requests)
    assert sorted(o.prompt_token_ids for o in outs) == sorted(fake.prompts)
    assert all(o.token_ids and o.text == f"model={tiny_model_dir}" for o in outs)


def test_training_fails_clearly_without_token_ids(tokenizer):
    fake = FakeVLLM(tokenizer=tokenizer, version=(0, 10, 1))  # before `return_token_ids`
    with serve_on_loopback(fake.app()) as url:
        evaluation = OpenAIBackend("base", url, tokenizer=tokenizer, max_retries=0)
        (out,) = evaluation.generate([GenerationRequest(list(CHATS[0]))])
        assert out.text == "model=base" and out.token_ids == []  # evaluation needs only the text
        training = OpenAIBackend("base", url, max_retries=0)
        training.for_training(tokenizer)
        with pytest.raises(LLMError, match=r"no token ids.*0\.10\.2"):
            training.generate([GenerationRequest(list(CHATS[0]))])


def test_stop_strings_and_completion_ids_match_the_local_backends(vllm, tokenizer):
    fake, url = vllm
    fake.reply = lambda model, prompt: "<search>capital of France</search> and more"
    backend = OpenAIBackend("base", url, tokenizer=tokenizer, max_retries=0)
    sampling = SamplingParams(max_new_tokens=64, stop=("</search>",))
    (out,) = backend.generate([GenerationRequest(list(CHATS[0]), sampling)])
    assert out.text == "<search>capital of France</search>" and out.finish_reason == "stop"
    assert tokenizer.decode(out.token_ids) == out.text
    (short,) = backend.generate([GenerationRequest(list(CHATS[0]), SamplingParams(max_new_tokens=4))])
    assert short.finish_reason == "length" and len(short.token_ids) == 4


def _shipped_tokenizer(preset: str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(resolve_model(preset))
    except LLMError as exc:  # its weights package is not installed
        pytest.skip(f"{preset} is not installed here: {exc}")


@pytest.mark.model
@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_token_prompts_are_the_hf_rendering_for_shipped_templates(preset):
    """What the server receives is byte for byte what the hf backend feeds its model, continuation and
    all, for each shipped model's own chat template."""
    tok = _shipped_tokenizer(preset)
    tok.padding_side = "left"
    tok.pad_token = tok.pad_token or tok.eos_token
    fake = FakeVLLM(tokenizer=tok, model=preset)
    reqs = [GenerationRequest(list(chat)) for chat in CHATS]
    reqs.append(GenerationRequest(list(CHATS[0]), continuation="<search>Hamlet author</search>\n\n"))
    with serve_on_loopback(fake.app()) as url:
        backend = OpenAIBackend(preset, url, max_retries=0)  # `auto`: the preset's own tokenizer
        backend.generate(reqs)
    enc = encode_prompts(tok, reqs)
    hf_rows = [
        row[mask.bool()].tolist() for row, mask in zip(enc["input_ids"], enc["attention_mask"], strict=True)
    ]
    assert sorted(fake.prompts) == sorted(hf_rows)  # requests arrive in any order
