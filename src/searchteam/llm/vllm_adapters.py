"""vLLM's runtime LoRA adapters as the `openai` backend serves them for RL rollouts (`sync_adapters`).

Adapters are loaded at runtime (one per role, or one shared) under fresh names
`{namespace}:{role}@{version}`: vLLM refuses a loaded name, and a name reused for new weights can serve
stale prefix-cache blocks (vLLM #42125). Needs vLLM started with runtime LoRA updating (`LORA_HINT`).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import secrets
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx

from searchteam.errors import LLMError
from searchteam.http_client import timeouts
from searchteam.llm.base import SHARED
from searchteam.llm.vllm import adapter_rank

LORA_HINT = (
    "start vLLM with `--enable-lora --max-lora-rank R` (R >= the adapter's r) and the environment variable "
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
)


def run_namespace(folder: Path) -> str:
    """A stable adapter namespace for the run whose rollout adapters live under `folder`: the same after a
    resume (so the stale names of the run are found), distinct for another run, stage or rank."""
    return "searchteam-" + hashlib.sha1(str(Path(folder).resolve()).encode()).hexdigest()[:12]


class ServedAdapters:
    """The LoRA adapters one backend serves on its vLLM servers (replicas of one model): loads them on
    every server, names the one a role's requests ask for, and unloads what it loaded (`close`, also on
    garbage collection or exit). Names in `namespace` that it does not serve are stale, unloaded before
    the first load."""

    def __init__(
        self, base_urls: Sequence[str], headers: dict[str, str], timeout: float, namespace: str | None = None
    ) -> None:
        self.base_urls = list(base_urls)
        self.headers = headers
        self.timeout = timeout
        self.namespace = namespace or f"searchteam-{secrets.token_hex(4)}"
        self._epoch = _base36(time.time_ns() // 1_000_000)  # no two backends name a version alike
        self._versions = itertools.count(1)
        self._served: dict[str, str] = {}  # role (or SHARED) -> served LoRA name
        self._owned: list[str] = []  # names loaded here and to unload here (not adopted ones)
        self._cleaned = False
        self._finalizer = weakref.finalize(self, _unload_quietly, self.base_urls, headers, self._owned)

    @property
    def served(self) -> dict[str, str]:
        """`{role: served name}` requests are routed to now (empty: the base model)."""
        return dict(self._served)

    def name_for(self, role: str) -> str | None:
        """The served name a request of `role` asks for: its adapter, the shared one, else None (the base)."""
        return self._served.get(role) or self._served.get(SHARED)

    def use_namespace(self, namespace: str) -> None:
        """Name adapters in `namespace` from now on; only before the first load."""
        if namespace == self.namespace:
            return
        if self._owned:
            raise LLMError(f"adapter namespace is {self.namespace} already; cannot become {namespace}")
        self.namespace, self._cleaned = namespace, False

    def load(self, adapters: Mapping[str, Path]) -> dict[str, str]:
        """Load `adapters` (`{role: folder}`, `{SHARED: folder}` or `{}`) under fresh names, route to them,
        then unload the names served before (so no request ever names a missing adapter). The first call
        first unloads the namespace's stale names. Returns `{role: served name}`. The servers read the
        folders themselves: they must see the same filesystem."""
        version = f"{self._epoch}.{next(self._versions)}"
        new = {role: f"{self.namespace}:{role or 'shared'}@{version}" for role in adapters}
        with self._client() as client:
            if not self._cleaned:
                self._unload_stale(client)
            for role, folder in adapters.items():
                body = {"lora_name": new[role], "lora_path": str(Path(folder).absolute())}
                self._owned.append(new[role])
                for url in self.base_urls:
                    self._lora_call(client, url, "load_lora_adapter", body, Path(folder))
            old, self._served = self._served, new
            for name in old.values():
                self._unload_own(client, name)
        return dict(new)

    def adopt(self, names: Mapping[str, str]) -> None:
        """Route to adapters another process loaded (its `load`'s answer): no HTTP call, not unloaded here."""
        self._served = dict(names)

    def close(self) -> None:
        """Unload the adapters loaded here and route to the base model."""
        with self._client() as client:
            for name in list(self._owned):
                self._unload_own(client, name)
        self._served = {}

    def _client(self) -> httpx.Client:
        return httpx.Client(timeout=timeouts(self.timeout), headers=self.headers)

    def _unload_stale(self, client: httpx.Client) -> None:
        """Unload the namespace's names not served here (left by a run that crashed or was resumed)."""
        self._cleaned = True
        prefix, live = f"{self.namespace}:", set(self._served.values())
        for url in self.base_urls:
            for name in _served_names(client, url):
                if name.startswith(prefix) and name not in live:
                    self._lora_call(client, url, "unload_lora_adapter", {"lora_name": name}, missing_ok=True)

    def _unload_own(self, client: httpx.Client, name: str) -> None:
        for url in self.base_urls:
            self._lora_call(client, url, "unload_lora_adapter", {"lora_name": name}, missing_ok=True)
        if name in self._owned:
            self._owned.remove(name)

    def _lora_call(
        self,
        client: httpx.Client,
        url: str,
        endpoint: str,
        body: dict,
        folder: Path | None = None,
        missing_ok: bool = False,
    ) -> None:
        """POST a vLLM runtime LoRA endpoint of the server at `url`; a refusal or no answer is an LLMError
        saying what to do. `missing_ok`: an unload of a name the server no longer has is fine."""
        try:
            resp = client.post(f"{url}/{endpoint}", json=body)
        except httpx.TransportError as exc:
            raise LLMError(f"vLLM at {url} unreachable for {endpoint}: {exc}") from exc
        if resp.status_code < 400:
            return
        detail = error_message(resp)
        if missing_ok and resp.status_code == 404 and "cannot be found" in detail:
            return
        raise LLMError(
            f"vLLM at {url} refused {endpoint} for '{body['lora_name']}' "
            f"(HTTP {resp.status_code}: {detail}); {_lora_advice(detail, folder)}."
        )


def error_message(resp: httpx.Response) -> str:
    """The message of an error answer in vLLM's shapes (`{"error": {...}}`, older `{"message": ...}`)."""
    try:
        data = resp.json()
    except ValueError:
        return " ".join(resp.text.split())[:300]
    if isinstance(data, dict):
        inner = data.get("error") if isinstance(data.get("error"), dict) else data
        message = inner.get("message") or inner.get("detail") or data
        return " ".join(str(message).split())[:300]
    return " ".join(str(data).split())[:300]


def _served_names(client: httpx.Client, url: str) -> list[str]:
    """The ids `/v1/models` of the server at `url` lists (base models and loaded adapters); none when it
    cannot say."""
    try:
        resp = client.get(f"{url}/models")
    except httpx.TransportError as exc:
        raise LLMError(f"vLLM at {url} unreachable for /models: {exc}") from exc
    if resp.status_code != 200:
        return []
    return [str(card.get("id")) for card in resp.json().get("data", []) if isinstance(card, dict)]


def _lora_advice(detail: str, folder: Path | None) -> str:
    """What to do about a refused LoRA call: a reused name, an unreadable folder, or a server setup."""
    if "already been loaded" in detail:
        return "another process loads adapters under this backend's names (one loader per namespace)"
    if "no adapter found" in detail.lower():  # vLLM's LoRAAdapterNotFoundError
        return "the server cannot read the adapter folder: trainer and server must share a filesystem"
    return f"{LORA_HINT}{_rank_note(folder)}"


def _rank_note(folder: Path | None) -> str:
    """` (this adapter has r=R)` when the adapter's peft config is readable, else nothing."""
    if folder is None:
        return ""
    try:
        rank = adapter_rank(folder)
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    return f" (this adapter has r={rank})" if rank else ""


def _unload_quietly(base_urls: list[str], headers: dict[str, str], names: list[str]) -> None:
    """Finalizer: unload the adapters still owned, ignoring servers that are gone."""
    if not names:
        return
    with httpx.Client(timeout=10.0, headers=headers) as client:
        for url in base_urls:
            with contextlib.suppress(httpx.HTTPError):  # a server that is gone: on to the next
                for name in names:
                    client.post(f"{url}/unload_lora_adapter", json={"lora_name": name})
    names.clear()


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out or "0"
