"""A fake vLLM OpenAI-compatible server with vLLM's own request semantics, minus the model.

What it keeps from vLLM (read from `vllm/entrypoints/openai/models/serving.py`, `completion/protocol.py`,
`chat_completion/protocol.py`), so the `openai` backend is tested against the behaviour it meets:

- runtime LoRA (`/v1/load_lora_adapter`, `/v1/unload_lora_adapter`, only with
  VLLM_ALLOW_RUNTIME_LORA_UPDATING): both names and paths required (400), a name already loaded refused
  with 400, a folder without `adapter_config.json` 404, r above `--max-lora-rank` refused, an unknown name
  on unload 404; `/v1/models` lists the base model and the loaded adapters; a request naming a model that
  is neither answers 404;
- sampling: a field a request leaves unset (None) takes the server default (the model's
  generation_config under `--generation-config auto`, nothing under `vllm`), else the OpenAI default, as
  `to_sampling_params` does; the effective parameters are recorded; invalid values answer 400;
- prompts: `/v1/completions` takes a string (tokenized with `add_special_tokens=True`, the default) or
  token ids (used as they are); `/v1/chat/completions` renders with the tokenizer's chat template;
- `return_token_ids` (vLLM >= 0.10.2, `version` below that ignores it): completions put `prompt_token_ids`
  and `token_ids` on the choice, chat completions `prompt_token_ids` beside the choices;
- stop strings: generation ends at the token that completes one; the text is cut at it (kept with
  `include_stop_str_in_output`); EOS ends with `stop_reason` None; `max_tokens` with `length`.

The model is a reply function: the same text for a given (model, prompt) pair, `model=NAME` by default.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

# vLLM's CompletionRequest._DEFAULT_SAMPLING_PARAMS: the last resort after the request and the server
OPENAI_DEFAULTS: dict[str, float] = {
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
}
# generation_config.json of Qwen2.5-*-Instruct, which vLLM >= 0.8 applies by default
QWEN_GENERATION_CONFIG: dict[str, float] = {
    "temperature": 0.7,
    "top_p": 0.8,
    "top_k": 20,
    "repetition_penalty": 1.05,
}
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if not (loop.last and continue_final_message) %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def byte_tokenizer():
    """A real transformers tokenizer with a byte-level vocabulary (no merges), ChatML special tokens and a
    ChatML chat template: what the tests render with when a shipped model's tokenizer is not needed."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, eos_token="<|im_end|>", pad_token="<|im_end|>")
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>"]})
    tokenizer.chat_template = CHATML
    return tokenizer


class _Refused(Exception):
    def __init__(self, status: int, message: str, kind: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind


@dataclass
class FakeVLLM:
    """State and routes of one fake `vllm serve MODEL` process. Run `app()` with `serve_on_loopback`."""

    tokenizer: Any
    model: str = "base"
    generation_config: dict[str, float] = field(default_factory=dict)  # the model's sampling defaults
    runtime_lora: bool = True  # VLLM_ALLOW_RUNTIME_LORA_UPDATING=True
    max_lora_rank: int = 16
    version: tuple[int, int, int] = (0, 11, 0)
    reply: Callable[[str, list[int]], str] = lambda model, prompt: f"model={model}"
    loras: dict[str, str] = field(default_factory=dict)  # loaded name -> path
    lora_calls: list[tuple[str, str]] = field(default_factory=list)  # ("load"/"unload", name), accepted
    requests: list[dict] = field(default_factory=list)  # generation request bodies, as received
    sampled_with: list[dict[str, float]] = field(default_factory=list)  # effective sampling per request
    prompts: list[list[int]] = field(default_factory=list)  # the prompt ids each request generated from

    def app(self) -> FastAPI:
        app = FastAPI()

        @app.exception_handler(_Refused)
        async def refused(_: Request, exc: _Refused) -> JSONResponse:
            error = {"message": exc.message, "type": exc.kind, "param": None, "code": exc.status}
            return JSONResponse({"error": error}, status_code=exc.status)

        @app.get("/v1/models")
        async def models() -> dict:
            cards = [{"id": self.model, "object": "model", "root": self.model, "parent": None}]
            cards += [
                {"id": name, "object": "model", "root": path, "parent": self.model}
                for name, path in self.loras.items()
            ]
            return {"object": "list", "data": cards}

        if self.runtime_lora:
            app.post("/v1/load_lora_adapter")(self._load)
            app.post("/v1/unload_lora_adapter")(self._unload)
        app.post("/v1/completions")(self._completions)
        app.post("/v1/chat/completions")(self._chat)
        return app

    # ---- runtime LoRA ---------------------------------------------------------------------------------

    async def _load(self, request: Request) -> str:
        body = await request.json()
        name, path = body.get("lora_name"), body.get("lora_path")
        if not name or not path:
            raise _Refused(400, "Both 'lora_name' and 'lora_path' must be provided.", "InvalidUserInput")
        if name in self.loras and not body.get("load_inplace"):
            raise _Refused(
                400,
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
                "place, set 'load_inplace' to True.",
                "InvalidUserInput",
            )
        config = Path(path) / "adapter_config.json"
        if not config.is_file():
            raise _Refused(404, f"Loading lora {name} failed: No adapter found for {path}", "NotFoundError")
        rank = int(json.loads(config.read_text()).get("r", 0))
        if rank > self.max_lora_rank:
            raise _Refused(
                400,
                f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.",
                "BadRequestError",
            )
        self.loras[name] = path
        self.lora_calls.append(("load", name))
        return f"Success: LoRA adapter '{name}' added successfully."

    async def _unload(self, request: Request) -> str:
        name = (await request.json()).get("lora_name")
        if not name:
            raise _Refused(
                400, "'lora_name' needs to be provided to unload a LoRA adapter.", "InvalidUserInput"
            )
        if name not in self.loras:
            raise _Refused(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError")
        del self.loras[name]
        self.lora_calls.append(("unload", name))
        return f"Success: LoRA adapter '{name}' removed successfully."

    # ---- generation ---------------------------------------------------------------------------------------

    async def _completions(self, request: Request) -> dict:
        body = await request.json()
        prompt = body.get("prompt")
        if isinstance(prompt, str) and prompt:
            ids = self.tokenizer(prompt, add_special_tokens=body.get("add_special_tokens", True))["input_ids"]
        elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and t >= 0 for t in prompt):
            ids = list(prompt)
        else:
            raise _Refused(400, "Either prompt or prompt_embeds must be provided and non-empty.")
        result = self._generate(body, ids)
        choice = {"index": 0, **result["choice"]}
        if self._returns_token_ids(body):
            choice.update(prompt_token_ids=ids, token_ids=result["token_ids"])
        if body.get("logprobs") is not None:  # the sampled token's logprob for each (0 top alternatives)
            choice["logprobs"] = {"token_logprobs": self.token_logprobs(result["token_ids"])}
        return {
            "object": "text_completion",
            "model": body["model"],
            "choices": [choice],
            "usage": result["usage"],
        }

    async def _chat(self, request: Request) -> dict:
        body = await request.json()
        continue_final = bool(body.get("continue_final_message"))
        text = self.tokenizer.apply_chat_template(
            body["messages"],
            tokenize=False,
            add_generation_prompt=body.get("add_generation_prompt", True),
            continue_final_message=continue_final,
        )
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        result = self._generate(body, ids)
        message = {"role": "assistant", "content": result["choice"].pop("text")}
        choice = {"index": 0, "message": message, **result["choice"]}
        data = {
            "object": "chat.completion",
            "model": body["model"],
            "choices": [choice],
            "usage": result["usage"],
        }
        if self._returns_token_ids(body):
            choice["token_ids"] = result["token_ids"]
            data["prompt_token_ids"] = ids
        if body.get("logprobs"):
            logprobs = self.token_logprobs(result["token_ids"])
            choice["logprobs"] = {"content": [{"logprob": lp} for lp in logprobs]}
        return data

    @staticmethod
    def token_logprobs(ids: list[int]) -> list[float]:
        """The engine's logprob of each sampled token: a fixed function of the token."""
        return [-0.01 * (tid % 50) for tid in ids]

    def _returns_token_ids(self, body: dict) -> bool:
        return bool(body.get("return_token_ids")) and self.version >= (0, 10, 2)

    def _generate(self, body: dict, prompt_ids: list[int]) -> dict:
        """Check the model and sampling like vLLM, record them, and produce the reply's tokens."""
        model = body.get("model") or self.model
        if model != self.model and model not in self.loras:
            raise _Refused(404, f"The model `{model}` does not exist.", "NotFoundError")
        sampling = self._sampling(body)
        max_tokens = body.get("max_tokens") or 16
        if max_tokens < 1:
            raise _Refused(400, f"max_tokens must be at least 1, got {max_tokens}.")
        self.requests.append(body)
        self.sampled_with.append(sampling)
        self.prompts.append(prompt_ids)
        reply = self.tokenizer(self.reply(model, prompt_ids), add_special_tokens=False)["input_ids"]
        ids, text, finish, reason = self._stop(reply + [self.tokenizer.eos_token_id], body, max_tokens)
        usage = {"prompt_tokens": len(prompt_ids), "completion_tokens": len(ids)}
        usage["total_tokens"] = usage["prompt_tokens"] + usage["completion_tokens"]
        choice = {"text": text, "finish_reason": finish, "stop_reason": reason}
        return {"choice": choice, "token_ids": ids, "usage": usage}

    def _sampling(self, body: dict) -> dict[str, float]:
        """Request value, else the server's default, else OpenAI's; validated as SamplingParams does."""
        params = {
            name: body[name] if body.get(name) is not None else self.generation_config.get(name, default)
            for name, default in OPENAI_DEFAULTS.items()
        }
        if params["top_k"] == -1:
            params["top_k"] = 0  # "quietly accept -1 as disabled, but prefer 0"
        checks = [
            (params["temperature"] >= 0.0, f"temperature must be non-negative, got {params['temperature']}."),
            (0.0 < params["top_p"] <= 1.0, f"top_p must be in (0, 1], got {params['top_p']}."),
            (params["top_k"] >= 0, f"top_k must be 0 (disable), or at least 1, got {params['top_k']}."),
            (0.0 <= params["min_p"] <= 1.0, f"min_p must be in [0, 1], got {params['min_p']}."),
            (
                params["repetition_penalty"] > 0.0,
                f"repetition_penalty must be greater than zero, got {params['repetition_penalty']}.",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise _Refused(400, message)
        return params

    def _stop(self, ids: list[int], body: dict, max_tokens: int) -> tuple[list[int], str, str, str | None]:
        """Generated ids up to the first stop string, EOS or the token limit; text, finish and stop reason."""
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        decode = lambda part: self.tokenizer.decode(part, skip_special_tokens=True)  # noqa: E731
        for n in range(1, min(len(ids), max_tokens) + 1):
            text = decode(ids[:n])
            hits = [(text.find(s), s) for s in stops if s in text]
            if hits:
                at, stop = min(hits)
                keep = at + len(stop) if body.get("include_stop_str_in_output") else at
                return ids[:n], text[:keep], "stop", stop
            if ids[n - 1] == self.tokenizer.eos_token_id:
                return ids[:n], text, "stop", None
        return ids[:max_tokens], decode(ids[:max_tokens]), "length", None
