"""Any OpenAI-compatible chat server (vLLM, SGLang, Ollama, ...) over httpx, with concurrent requests.

With vLLM it also serves RL rollouts: `set_adapters` loads LoRA adapters at runtime (one per role, or one
shared) and requests name them as their model; `return_token_ids` gives the exact sampled token ids.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
from collections.abc import Mapping
from pathlib import Path

import httpx

from searchteam.llm.base import SHARED, Completion, GenerationRequest, LLMError, truncate_at_stop

LORA_HINT = (
    "start vLLM with `--enable-lora --max-lora-rank R` (R >= the adapter's r) and the environment variable "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
)


class OpenAIBackend:
    def __init__(
        self,
        model: str,
        base_url: str,
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        concurrency: int = 64,
    ) -> None:
        self.name = model
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY", "EMPTY")
        self.timeout = timeout
        self.max_retries = max_retries
        self.concurrency = concurrency
        self._adapters: dict[str, str] = {}  # role (or SHARED) -> served LoRA name
        self._counter = itertools.count(1)

    def set_adapters(self, adapters: Mapping[str, Path]) -> None:
        """Use these peft LoRA adapter folders from now on: `{role: folder}`, or `{SHARED: folder}` for one
        adapter on every role; `{}` for the base model. New adapters load before the old ones unload, so no
        request ever names a missing adapter."""
        n = next(self._counter)
        new = {role: f"{role or 'policy'}-{n}" for role in adapters}
        with httpx.Client(timeout=self.timeout, headers=self._headers()) as client:
            for role, folder in adapters.items():
                body = {"lora_name": new[role], "lora_path": str(Path(folder).absolute())}
                self._lora_call(client, "load_lora_adapter", body, Path(folder))
            old, self._adapters = self._adapters, new
            for name in old.values():
                self._lora_call(client, "unload_lora_adapter", {"lora_name": name})

    def _lora_call(self, client: httpx.Client, endpoint: str, body: dict, folder: Path | None = None) -> None:
        """POST a vLLM runtime LoRA endpoint; a refusal or no answer is an LLMError saying what to do."""
        try:
            resp = client.post(f"{self.base_url}/{endpoint}", json=body)
        except httpx.TransportError as exc:
            raise LLMError(f"vLLM at {self.base_url} unreachable for {endpoint}: {exc}") from exc
        if resp.status_code >= 400:
            detail = " ".join(resp.text.split())[:300]
            rank = f" (this adapter has r={r})" if folder and (r := _lora_rank(folder)) else ""
            raise LLMError(
                f"vLLM at {self.base_url} refused {endpoint} for '{body['lora_name']}' "
                f"(HTTP {resp.status_code}: {detail}); {LORA_HINT}{rank}."
            )

    def _model_for(self, role: str) -> str:
        """The served name a request of this role asks for: its adapter, the shared one, or the base."""
        return self._adapters.get(role) or self._adapters.get(SHARED) or self.name

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"}

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return asyncio.run(self._generate_all(requests))

    async def _generate_all(self, requests: list[GenerationRequest]) -> list[Completion]:
        limits = httpx.Limits(max_connections=self.concurrency)
        sem = asyncio.Semaphore(self.concurrency)
        async with httpx.AsyncClient(timeout=self.timeout, limits=limits, headers=self._headers()) as client:

            async def one(req: GenerationRequest) -> Completion:
                async with sem:
                    return await self._complete(client, req)

            return list(await asyncio.gather(*(one(r) for r in requests)))

    def _payload(self, req: GenerationRequest) -> dict:
        messages = list(req.messages)
        body: dict = {
            "model": self._model_for(req.role),
            "max_tokens": req.sampling.max_new_tokens,
            "temperature": req.sampling.temperature,
            "top_p": req.sampling.top_p,
            "return_token_ids": True,  # vLLM >= 0.10: the exact prompt and sampled ids; others ignore it
        }
        if req.sampling.stop:
            body["stop"] = list(req.sampling.stop)
            body["include_stop_str_in_output"] = True  # vLLM extension; other servers ignore it
        if req.continuation:
            messages.append({"role": "assistant", "content": req.continuation})
            body.update(add_generation_prompt=False, continue_final_message=True)  # vLLM / SGLang
        body["messages"] = messages
        return body

    async def _complete(self, client: httpx.AsyncClient, req: GenerationRequest) -> Completion:
        url = f"{self.base_url}/chat/completions"
        last_error = ""
        for attempt in range(self.max_retries + 1):
            try:
                resp = await client.post(url, json=self._payload(req))
            except httpx.TransportError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    return self._parse(resp.json(), req)
                last_error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                if resp.status_code < 500 and resp.status_code != 429:
                    break
            if attempt < self.max_retries:
                await asyncio.sleep(min(30.0, 0.5 * 2**attempt) * (0.5 + random.random()))
        raise LLMError(
            f"OpenAI-compatible server at {self.base_url} failed for model '{self._model_for(req.role)}': "
            f"{last_error}. "
            "Check that the server is running and serves this model (e.g. `vllm serve MODEL`)."
        )

    @staticmethod
    def _parse(data: dict, req: GenerationRequest) -> Completion:
        choice = data["choices"][0]
        text = choice["message"].get("content") or ""
        if req.sampling.stop and choice.get("finish_reason") == "stop" and choice.get("stop_reason"):
            stop = choice["stop_reason"]
            if isinstance(stop, str) and not text.endswith(stop):
                text += stop  # servers that drop the stop string: put it back so tags stay closed
        text, _ = truncate_at_stop(text, req.sampling.stop)
        usage = data.get("usage") or {}
        return Completion(
            text=text,
            prompt_token_ids=list(data.get("prompt_token_ids") or []),
            token_ids=list(choice.get("token_ids") or []),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=choice.get("finish_reason") or "stop",
        )


def _lora_rank(folder: Path) -> int | None:
    """The adapter's LoRA rank `r` from its peft config, if readable."""
    try:
        return int(json.loads((folder / "adapter_config.json").read_text())["r"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
