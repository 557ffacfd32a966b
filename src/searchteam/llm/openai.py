"""Any OpenAI-compatible server (vLLM, SGLang, Ollama, ...) over httpx, with concurrent requests.

Prompts are rendered here, with the model's own tokenizer and the same `render_chat` as the local backends,
and sent as token ids to `/v1/completions` (`render="client"`), so the server never re-renders a chat with
its own template. Servers without this model's tokenizer at hand (a hosted API, `searchteam serve`) get
`/v1/chat/completions` instead (`render="server"`). Every sampling parameter is sent: a vLLM server fills
the ones a request leaves out from the model's generation_config (top-k 20 and repetition penalty 1.05 on
Qwen2.5), which the trainer does not score.

With vLLM it also serves RL rollouts: LoRA adapters loaded at runtime (`llm/vllm_adapters.py`), and
`return_token_ids` (vLLM >= 0.10.2) gives the exact sampled ids, which training requires. Several servers
of one model share the requests (`llm/replicas.py`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import re
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import httpx

from searchteam.auth import auth_header
from searchteam.errors import LLMError, RequestRejected
from searchteam.http_client import limits, timeouts
from searchteam.llm.base import (
    Completion,
    GenerationRequest,
    SamplingParams,
    render_prompt_ids,
    text_decoder,
    truncate_at_stop,
)
from searchteam.llm.replicas import Replicas
from searchteam.llm.vllm import NEUTRAL_SAMPLING
from searchteam.llm.vllm_adapters import ServedAdapters, error_message

log = logging.getLogger(__name__)

Render = Literal["auto", "client", "server"]

# vLLM's answers to a request that does not fit the model's context (HTTP 400), over its versions
TOO_LONG = re.compile(r"maximum context length|maximum model length|longer than the maximum|too large", re.I)
TOKEN_IDS_HINT = (
    "training needs the exact prompt and sampled token ids, which vLLM returns for `return_token_ids` "
    "from version 0.10.2 on: upgrade the server (pip install 'vllm>=0.10.2')"
)


def sampling_fields(sampling: SamplingParams) -> dict[str, Any]:
    """Every sampling field of a vLLM request, explicit: the temperature softmax (greedy at temperature 0,
    where vLLM wants top_p 1), nucleus `top_p` and nothing else."""
    return {
        "max_tokens": sampling.max_new_tokens,
        "temperature": 0.0 if sampling.greedy else sampling.temperature,
        "top_p": 1.0 if sampling.greedy else sampling.top_p,
        "top_k": 0,  # 0 disables top-k from vLLM 0.10 on (older servers wanted -1)
        **NEUTRAL_SAMPLING,
        "n": 1,
    }


class OpenAIBackend:
    """Generates on an OpenAI-compatible server; with vLLM also loads LoRA adapters at runtime.

    `render`: `client` renders and tokenizes prompts here (`tokenizer`, else the model's own) and sends
    token ids; `server` sends chats; `auto` is `client` when a tokenizer is given or the model's loads from
    local files, else `server`. `namespace` prefixes the served adapter names (default: one of its own);
    adapters whose name is in it and that this backend does not serve are stale, unloaded before the
    first load.

    `base_url` may list several servers of the same model (replicas): adapters load on every one, and each
    request goes to the server with the fewest requests of this backend in flight, the requests of one
    episode (`GenerationRequest.session`) to the server of its first (its prefix cache holds the prompt)."""

    def __init__(
        self,
        model: str,
        base_url: str | Sequence[str],
        *,
        api_key: str | None = None,
        timeout: float = 120.0,
        max_retries: int = 4,
        concurrency: int = 64,
        tokenizer: Any = None,
        render: Render = "auto",
        namespace: str | None = None,
    ) -> None:
        self.name = model
        urls = [base_url] if isinstance(base_url, str) else list(base_url)
        if not urls:
            raise LLMError(f"backend 'openai' for '{model}' needs a server: base_url is empty")
        self.base_urls = [url.rstrip("/") for url in urls]
        self.base_url = self.base_urls[0]
        self.api_key = api_key or os.environ.get("OPENAI_API_KEY", "EMPTY")
        self.timeout = timeout
        self.max_retries = max_retries
        self.concurrency = concurrency
        self.require_token_ids = False  # training: a completion without token ids is an error
        self._tokenizer = tokenizer
        self._render: Render = "client" if tokenizer is not None and render == "auto" else render
        self._render_lock = threading.Lock()
        self._replicas = Replicas(self.base_urls)
        self._lora = ServedAdapters(self.base_urls, self._headers(), timeout, namespace)
        self._async_client: httpx.AsyncClient | None = None
        self._async_client_loop: asyncio.AbstractEventLoop | None = None

    # ---- training: runtime LoRA adapters (`llm/vllm_adapters.py`) ---------------------------------------

    def for_training(self, tokenizer: Any, namespace: str | None = None) -> None:
        """Roll out for the trainer: prompts rendered with the trainer's own `tokenizer` and sent as token
        ids, every completion must come with its token ids, adapters named in `namespace` (the run's; fix
        it before the first load)."""
        if namespace:
            self._lora.use_namespace(namespace)
        self._tokenizer, self._render, self.require_token_ids = tokenizer, "client", True

    def load_adapters(self, adapters: Mapping[str, Path]) -> dict[str, str]:
        """Use these peft LoRA adapter folders from now on: `{role: folder}`, `{SHARED: folder}` for one
        adapter on every role, `{}` for the base model. Loads them under fresh names, then unloads the old
        ones; returns `{role: served name}`, what other processes sharing the server pass to
        `adopt_adapters`. The server reads the folders itself: it must see the same filesystem."""
        return self._lora.load(adapters)

    def adopt_adapters(self, names: Mapping[str, str]) -> None:
        """Route requests to adapters another process loaded (`load_adapters`' answer there): no HTTP call,
        and this backend never unloads them."""
        self._lora.adopt(names)

    @property
    def served_adapters(self) -> dict[str, str]:
        """`{role: served name}` requests are routed to now (empty: the base model)."""
        return self._lora.served

    def close(self) -> None:
        """Unload the adapters this backend loaded and route to the base model. Also runs when the backend
        is garbage-collected or the process exits."""
        self._lora.close()

    def __enter__(self) -> OpenAIBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _model_for(self, role: str) -> str:
        """The served name a request of this role asks for: its adapter, the shared one, or the base."""
        return self._lora.name_for(role) or self.name

    def _headers(self) -> dict[str, str]:
        return auth_header(self.api_key)

    # ---- generation -------------------------------------------------------------------------------------

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """A blocking batch (judges, scripts); runs use `agenerate`, one request at a time."""
        tokenizer = self._client_tokenizer()
        prompts = [render_prompt_ids(tokenizer, r) if tokenizer else None for r in requests]
        return asyncio.run(self._generate_all(requests, prompts))

    async def agenerate(self, request: GenerationRequest) -> Completion:
        """One request, sent now on this event loop's long-lived client (the caller bounds how many are in
        flight: `concurrency`)."""
        tokenizer = self._client_tokenizer()
        prompt = render_prompt_ids(tokenizer, request) if tokenizer else None
        return await self._complete(self._loop_client(), request, prompt)

    async def aclose(self) -> None:
        client, self._async_client = self._async_client, None
        if client is not None:
            await client.aclose()

    def _loop_client(self) -> httpx.AsyncClient:
        """The HTTP client of the running event loop, opened on first use (`aclose` closes it)."""
        loop = asyncio.get_running_loop()
        if self._async_client is None or self._async_client_loop is not loop:
            self._async_client, self._async_client_loop = self._new_client(), loop
        return self._async_client

    def _new_client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            timeout=timeouts(self.timeout), limits=limits(self.concurrency), headers=self._headers()
        )

    def _client_tokenizer(self) -> Any:
        """The tokenizer prompts are rendered with, or None when the server renders them (`render`)."""
        with self._render_lock:
            if self._render == "auto":
                self._tokenizer = _local_tokenizer(self.name)
                self._render = "client" if self._tokenizer is not None else "server"
                if self._render == "server":
                    log.warning("no local tokenizer of '%s': the server renders its chat template", self.name)
            if self._render == "client" and self._tokenizer is None:
                self._tokenizer = _local_tokenizer(self.name)
                if self._tokenizer is None:
                    raise LLMError(f"render: client needs the tokenizer of '{self.name}' on this machine")
            return self._tokenizer if self._render == "client" else None

    async def _generate_all(
        self, requests: list[GenerationRequest], prompts: list[list[int] | None]
    ) -> list[Completion]:
        sem = asyncio.Semaphore(self.concurrency)
        async with self._new_client() as client:

            async def one(req: GenerationRequest, ids: list[int] | None) -> Completion:
                async with sem:
                    return await self._complete(client, req, ids)

            return list(await asyncio.gather(*(one(r, p) for r, p in zip(requests, prompts, strict=True))))

    def _payload(self, req: GenerationRequest, prompt_ids: list[int] | None) -> dict:
        """A `/v1/completions` body with the token prompt, or (without one) a `/v1/chat/completions` body."""
        body: dict = {
            "model": self._model_for(req.role),
            **sampling_fields(req.sampling),
            "return_token_ids": True,  # vLLM >= 0.10.2: the exact prompt and sampled ids; others ignore it
        }
        if self.require_token_ids:  # training: the sampled tokens' logprobs, to measure the mismatch
            body["logprobs"] = 0 if prompt_ids is not None else True
        if req.sampling.stop:
            body["stop"] = list(req.sampling.stop)
            body["include_stop_str_in_output"] = True  # vLLM extension; other servers ignore it
        if prompt_ids is not None:
            return {**body, "prompt": prompt_ids}
        messages = list(req.messages)
        if req.continuation:
            messages.append({"role": "assistant", "content": req.continuation})
            body.update(add_generation_prompt=False, continue_final_message=True)  # vLLM / SGLang
        return {**body, "messages": messages}

    async def _complete(
        self, client: httpx.AsyncClient, req: GenerationRequest, prompt_ids: list[int] | None
    ) -> Completion:
        server = self._replicas.route(req.session)
        try:
            return await self._complete_on(server, client, req, prompt_ids)
        finally:
            self._replicas.done(server)

    async def _complete_on(
        self, server: str, client: httpx.AsyncClient, req: GenerationRequest, prompt_ids: list[int] | None
    ) -> Completion:
        url = f"{server}/{'completions' if prompt_ids is not None else 'chat/completions'}"
        payload = self._payload(req, prompt_ids)
        last_error = ""
        for attempt in range(self.max_retries + 1):
            try:
                resp = await client.post(url, json=payload)
            except httpx.TransportError as exc:
                last_error = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    return self._parse(resp.json(), req, prompt_ids, server)
                last_error = f"HTTP {resp.status_code}: {resp.text[:300]}"
                if resp.status_code == 400 and TOO_LONG.search(detail := error_message(resp)):
                    raise RequestRejected(f"the server at {server} refused a request: {detail}")
                if resp.status_code < 500 and resp.status_code != 429:
                    break  # retried: transient failures only (no answer, 429, 5xx)
            if attempt < self.max_retries:
                await asyncio.sleep(min(30.0, 0.5 * 2**attempt) * (0.5 + random.random()))
        raise LLMError(
            f"OpenAI-compatible server at {server} failed for model '{payload['model']}': "
            f"{last_error}. "
            "Check that the server is running and serves this model (e.g. `vllm serve MODEL`)."
        )

    def _parse(
        self, data: dict, req: GenerationRequest, prompt_ids: list[int] | None, server: str
    ) -> Completion:
        choice = data["choices"][0]
        token_ids = list(choice.get("token_ids") or [])
        # completions answer the prompt ids per choice, chat completions beside the choices
        served_prompt = list(choice.get("prompt_token_ids") or data.get("prompt_token_ids") or [])
        self._check_token_ids(token_ids, served_prompt, prompt_ids, server)
        if prompt_ids is not None and token_ids:
            text = text_decoder(self._tokenizer)(token_ids)  # as the local backends decode them
        else:
            text = _server_text(choice, req.sampling.stop)
        text, _ = truncate_at_stop(text, req.sampling.stop)
        usage = data.get("usage") or {}
        return Completion(
            text=text,
            prompt_token_ids=list(prompt_ids) if prompt_ids is not None else served_prompt,
            token_ids=token_ids,
            logprobs=_sampled_logprobs(choice, len(token_ids)),
            prompt_tokens=int(usage.get("prompt_tokens", 0)),
            completion_tokens=int(usage.get("completion_tokens", 0)),
            finish_reason=choice.get("finish_reason") or "stop",
        )

    def _check_token_ids(
        self, token_ids: list[int], served: list[int], sent: list[int] | None, server: str
    ) -> None:
        """Training needs the ids (a server that dropped them would have the trainer re-tokenize text), and
        a server that answers other prompt ids than it was sent did not generate from our prompt."""
        if self.require_token_ids and not (token_ids and (served or sent is not None)):
            raise LLMError(f"the server at {server} returned no token ids: {TOKEN_IDS_HINT}")
        if sent is not None and served and served != sent:
            raise LLMError(
                f"the server at {server} answered for other prompt token ids than it was sent "
                f"({len(served)} ids, {len(sent)} sent)"
            )


def _sampled_logprobs(choice: dict, tokens: int) -> list[float] | None:
    """The logprob of each sampled token when the server gave one per token: completions put them in
    `logprobs.token_logprobs`, chat completions in `logprobs.content[].logprob`."""
    given = choice.get("logprobs") or {}
    values = given.get("token_logprobs")
    if values is None and isinstance(given.get("content"), list):
        values = [entry.get("logprob") for entry in given["content"]]
    if not values or len(values) != tokens or any(not isinstance(v, int | float) for v in values):
        return None
    return [float(v) for v in values]


def _server_text(choice: dict, stop: tuple[str, ...]) -> str:
    """The completion text as a server wrote it; a stop string the server dropped is put back."""
    text = choice.get("text")
    if text is None:
        text = (choice.get("message") or {}).get("content") or ""
    reason = choice.get("stop_reason")
    stopped = stop and choice.get("finish_reason") == "stop" and isinstance(reason, str)
    if stopped and not text.endswith(reason):
        text += reason  # servers that drop the stop string: put it back so tags stay closed
    return text


def _local_tokenizer(model: str) -> Any:
    """The tokenizer of `model` from files on this machine (a preset, a folder or the Hub cache), else None;
    never downloads."""
    from transformers import AutoTokenizer

    from searchteam.llm.models import resolve_model

    try:
        return AutoTokenizer.from_pretrained(resolve_model(model), local_files_only=True)
    except (OSError, ValueError, LLMError):
        return None
