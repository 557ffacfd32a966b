"""transformers backend: real batched generation (left padding) on CPU or CUDA."""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from itertools import groupby
from pathlib import Path

import torch

from searchteam.llm.base import (
    Completion,
    GenerationRequest,
    SamplingParams,
    cut_completion,
    render_chat,
    text_decoder,
)
from searchteam.llm.logprobs import chosen_token_logprobs
from searchteam.llm.models import resolve_model

LOGPROB_CHUNK = 8  # completions per teacher-forced pass when logprobs are requested


# Every generation_config field that reshapes the next-token distribution, at its off value: `generate`
# fills what a call leaves unset from the model's generation_config (Qwen2.5-Instruct: top_k=20,
# repetition_penalty=1.05; the global default is top_k=50), and the trainer scores the plain softmax.
NEUTRAL_GENERATION: dict[str, object] = {
    "top_k": None,
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "top_h": None,
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "sequence_bias": None,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "min_length": 0,
    "min_new_tokens": None,
    "exponential_decay_length_penalty": None,
    "renormalize_logits": False,
    "guidance_scale": None,
    "watermarking_config": None,
}


def generation_kwargs(sampling: SamplingParams, pad_token_id: int | None = None) -> dict[str, object]:
    """`generate` keyword arguments that sample exactly the temperature softmax (nucleus-truncated when
    top_p < 1) or take its argmax at temperature 0, whatever the model's generation_config says."""
    from transformers import GenerationConfig

    known = GenerationConfig().to_dict()  # a field this transformers lacks would be taken for a model input
    kwargs: dict[str, object] = {k: v for k, v in NEUTRAL_GENERATION.items() if k in known}
    kwargs.update(
        max_new_tokens=sampling.max_new_tokens, do_sample=not sampling.greedy, pad_token_id=pad_token_id
    )
    if sampling.greedy:
        kwargs.update(temperature=None, top_p=None)
    else:
        kwargs.update(temperature=sampling.temperature, top_p=sampling.top_p)
    return kwargs


def encode_prompts(tokenizer, requests: list[GenerationRequest]):
    """The left-padded batch of `render_chat` prompts that `generate` runs on (no special tokens added:
    the chat template holds them)."""
    prompts = [render_chat(tokenizer, r) for r in requests]
    return tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)


def pick_device(device: str | None) -> str:
    if device and device != "auto":
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def pick_dtype(dtype: str | None, device: str, training: bool = False) -> torch.dtype:
    """The named dtype, or for `auto`/None: bf16 on a GPU that supports it, else fp32; for `training`, also
    bf16 on a CPU with bf16 matrix instructions (AVX512-BF16, AMX), where it trains faster than fp32. On
    other CPUs bf16 runs several times slower than fp32 (docs/benchmarks.md): a bf16 request there is
    honoured with a warning."""
    if dtype and dtype != "auto":
        chosen = getattr(torch, dtype)
        if chosen == torch.bfloat16 and device == "cpu" and not cpu_has_bf16():
            warnings.warn(
                "bfloat16 on this CPU (no AVX512-BF16 or AMX) computes several times slower than float32: "
                "set dtype: auto (or float32)",
                stacklevel=2,
            )
        return chosen
    if device.startswith("cuda"):
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float32
    return torch.bfloat16 if training and device == "cpu" and cpu_has_bf16() else torch.float32


def cpu_has_bf16() -> bool:
    """Whether this CPU multiplies bf16 matrices natively (AVX512-BF16 or AMX, as torch detects them)."""
    checks = [
        getattr(torch.cpu, name, None) for name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    ]
    return any(check() for check in checks if check is not None)


class HFBackend:
    """Generates with a transformers causal LM. Pass `model` to share an already-loaded policy (training)."""

    def __init__(
        self,
        name: str,
        *,
        device: str | None = None,
        dtype: str | None = None,
        logprobs: bool = False,
        model=None,
        tokenizer=None,
        seed: int | None = None,
        activate: Callable[[str], None] | None = None,
        autocast: torch.dtype | None = None,
    ) -> None:
        """`activate(role)`, when given, is called before generating for each role's requests (one LoRA
        adapter per role); requests are then batched per role. `autocast` (e.g. bfloat16) computes in that
        dtype over fp32 weights (a fully fine-tuned policy keeps fp32 master weights)."""
        self.name = name
        if model is not None and device is None:  # a shared model stays where it is (this rank's GPU)
            self.device = str(next(model.parameters()).device)
        else:
            self.device = pick_device(device)
        self.want_logprobs = logprobs
        self.activate = activate
        if model is None:
            model, tokenizer, self.activate = _load(name, pick_dtype(dtype, self.device))
            model = model.to(self.device)
        self.tokenizer = tokenizer
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = model
        self.model.eval()
        self._lock = threading.Lock()
        self._generator_seed = seed
        self._autocast = autocast

    def render(self, request: GenerationRequest) -> str:
        return render_chat(self.tokenizer, request)

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """One batched generate call per group of requests sharing sampling params (and role, when
        roles have their own adapters)."""

        def key(i: int) -> tuple[str, SamplingParams]:
            return (requests[i].role if self.activate else "", requests[i].sampling)

        results: dict[int, Completion] = {}
        order = sorted(range(len(requests)), key=lambda i: (key(i)[0], hash(key(i)[1])))
        with self._lock:
            for (role, sampling), group in groupby(order, key=key):
                idx = list(group)
                if self.activate:
                    self.activate(role)
                outs = self._generate_group([requests[i] for i in idx], sampling)
                results.update(zip(idx, outs, strict=True))
        return [results[i] for i in range(len(requests))]

    @torch.inference_mode()
    def _generate_group(
        self, requests: list[GenerationRequest], sampling: SamplingParams
    ) -> list[Completion]:
        tok = self.tokenizer
        enc = encode_prompts(tok, requests).to(self.device)
        kwargs = generation_kwargs(sampling, pad_token_id=tok.pad_token_id)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=tok)
        if self._generator_seed is not None:
            torch.manual_seed(self._generator_seed)
        with self._precision():
            sequences = self.model.generate(**enc, **kwargs)
        prompt_len = enc["input_ids"].shape[1]
        completions = []
        eos_ids = self._eos_ids()
        for row in range(len(requests)):
            prompt_ids = enc["input_ids"][row][enc["attention_mask"][row].bool()].tolist()
            new_ids, text, stopped = cut_completion(
                sequences[row, prompt_len:].tolist(), eos_ids, sampling.stop, text_decoder(tok)
            )
            finish = "stop" if stopped else "length"
            completions.append(
                Completion(
                    text=text,
                    prompt_token_ids=prompt_ids,
                    token_ids=new_ids,
                    prompt_tokens=len(prompt_ids),
                    completion_tokens=len(new_ids),
                    finish_reason=finish,
                )
            )
        if self.want_logprobs:
            with self._precision():
                self._attach_logprobs(completions, sampling)
        return completions

    def _precision(self) -> torch.autocast:
        device_type = torch.device(self.device).type
        return torch.autocast(device_type, dtype=self._autocast, enabled=self._autocast is not None)

    def _eos_ids(self) -> set[int]:
        ids = self.model.generation_config.eos_token_id
        ids = ids if isinstance(ids, list) else [ids]
        return {i for i in ids if i is not None} | {self.tokenizer.eos_token_id}

    def _attach_logprobs(self, completions: list[Completion], sampling: SamplingParams) -> None:
        """Per-token logprobs of the sampled tokens under the sampling distribution (temperature-scaled),
        from teacher-forced passes over right-padded chunks instead of storing every step's scores."""
        temperature = sampling.temperature if not sampling.greedy else 1.0
        scored = [c for c in completions if c.token_ids]
        for c in completions:
            c.logprobs = [] if not c.token_ids else None
        for start in range(0, len(scored), LOGPROB_CHUNK):
            chunk = scored[start : start + LOGPROB_CHUNK]
            seqs = [c.prompt_token_ids + c.token_ids for c in chunk]
            width = max(map(len, seqs))
            ids = torch.full((len(seqs), width), self.tokenizer.pad_token_id, dtype=torch.long)
            mask = torch.zeros_like(ids)
            positions = torch.zeros((len(seqs), max(len(c.token_ids) for c in chunk)), dtype=torch.long)
            for row, (c, seq) in enumerate(zip(chunk, seqs, strict=True)):
                ids[row, : len(seq)] = torch.tensor(seq)
                mask[row, : len(seq)] = 1
                first = len(c.prompt_token_ids) - 1
                positions[row, : len(c.token_ids)] = torch.arange(first, first + len(c.token_ids))
            logp, _ = chosen_token_logprobs(
                self.model, ids.to(self.device), mask.to(self.device), positions.to(self.device), temperature
            )
            for row, c in enumerate(chunk):
                c.logprobs = logp[row, : len(c.token_ids)].tolist()


def _load(name: str, dtype: torch.dtype):
    """A preset, hub id or local model directory; or a `searchteam train` checkpoint directory, whose
    LoRA adapters are loaded onto their base model (one adapter per role: routed by role)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    checkpoint = Path(name) / "policy"
    full = checkpoint / "model"
    adapters = sorted(p.parent for p in (checkpoint / "adapters").glob("*/adapter_config.json"))
    if adapters and not (full / "config.json").exists():
        return _load_adapters(adapters, dtype)
    path = str(full) if (full / "config.json").exists() else resolve_model(name)
    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype), AutoTokenizer.from_pretrained(path), None


def _load_adapters(adapters: list[Path], dtype: torch.dtype):
    """One shared adapter is merged into the base; several (one per role) stay switchable by role."""
    import json

    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    named = json.loads((adapters[0] / "adapter_config.json").read_text())["base_model_name_or_path"]
    base = resolve_model(named)  # a preset's name, or a path or hub id
    backbone = AutoModelForCausalLM.from_pretrained(base, dtype=dtype)
    model = PeftModel.from_pretrained(backbone, adapters[0], adapter_name=adapters[0].name)
    for path in adapters[1:]:
        model.load_adapter(path, adapter_name=path.name)
    if len(adapters) == 1:
        return model.merge_and_unload(), AutoTokenizer.from_pretrained(base), None
    names = sorted(p.name for p in adapters)

    def activate(role: str) -> None:
        model.set_adapter(role if role in names else names[0])

    return model, AutoTokenizer.from_pretrained(base), activate
