"""OpenAIBackend against a fake vLLM: runtime LoRA adapters per role and returned token ids."""

from __future__ import annotations

import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from searchteam.errors import LLMError
from searchteam.llm import GenerationRequest
from searchteam.llm.openai import OpenAIBackend
from tests.support.helpers import serve_on_loopback


def _chat_route(app: FastAPI, chats: list[dict]) -> None:
    """Chat completions that echo the requested model; token ids only when asked for."""

    @app.post("/v1/chat/completions")
    async def complete(request: Request):
        body = await request.json()
        chats.append(body)
        data: dict = {
            "choices": [{"message": {"content": f"model={body['model']}"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2},
        }
        if body.get("return_token_ids"):
            data["prompt_token_ids"] = [101, 102, 103]
            data["choices"][0]["token_ids"] = [7, 8]
        return data


@pytest.fixture
def lora_server():
    """A fake vLLM with runtime LoRA updating: records load/unload calls in order, refuses duplicates."""
    app = FastAPI()
    calls: list[tuple[str, dict]] = []
    loaded: dict[str, str] = {}
    chats: list[dict] = []

    @app.post("/v1/load_lora_adapter")
    async def load(request: Request):
        body = await request.json()
        calls.append(("load", body))
        if body["lora_name"] in loaded:
            return JSONResponse(
                {"message": f"The lora adapter '{body['lora_name']}' has already been loaded."}, 400
            )
        loaded[body["lora_name"]] = body["lora_path"]
        return "Success"

    @app.post("/v1/unload_lora_adapter")
    async def unload(request: Request):
        body = await request.json()
        calls.append(("unload", body))
        if loaded.pop(body["lora_name"], None) is None:
            return JSONResponse({"message": f"The lora adapter '{body['lora_name']}' cannot be found."}, 404)
        return "Success"

    _chat_route(app, chats)
    with serve_on_loopback(app) as url:
        yield url, calls, loaded, chats


@pytest.fixture
def plain_server():
    """An OpenAI-compatible server without the runtime LoRA endpoints (vLLM without the env variable)."""
    app = FastAPI()
    chats: list[dict] = []
    _chat_route(app, chats)
    with serve_on_loopback(app) as url:
        yield url


def _adapter(tmp_path, name: str, r: int = 8):
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": r, "lora_alpha": 16}))
    return folder


def _models(backend: OpenAIBackend, roles: list[str]) -> list[str]:
    reqs = [GenerationRequest([{"role": "user", "content": "q"}], role=role) for role in roles]
    return [c.text.removeprefix("model=") for c in backend.generate(reqs)]


def test_openai_per_role_adapters_route_requests(lora_server, tmp_path):
    url, calls, loaded, chats = lora_server
    p1, p2 = _adapter(tmp_path, "searcher"), _adapter(tmp_path, "generator")
    backend = OpenAIBackend("base", url, max_retries=0)
    backend.load_adapters({"searcher": p1, "generator": p2})
    assert [kind for kind, _ in calls] == ["load", "load"]
    names = {body["lora_path"]: body["lora_name"] for _, body in calls}
    assert set(names) == {str(p1), str(p2)} and len(set(names.values())) == 2
    assert loaded == {names[str(p1)]: str(p1), names[str(p2)]: str(p2)}
    got = _models(backend, ["searcher", "generator", "planner", ""])
    assert got == [names[str(p1)], names[str(p2)], "base", "base"]
    assert sorted(c["model"] for c in chats) == sorted(got)  # requests arrive concurrently, in any order


def test_openai_shared_adapter_serves_every_role(lora_server, tmp_path):
    url, calls, loaded, _ = lora_server
    backend = OpenAIBackend("base", url, max_retries=0)
    backend.load_adapters({"": _adapter(tmp_path, "policy")})
    (name,) = loaded
    assert _models(backend, ["searcher", "generator", ""]) == [name] * 3


def test_openai_new_adapters_load_before_old_ones_unload(lora_server, tmp_path):
    url, calls, loaded, _ = lora_server
    backend = OpenAIBackend("base", url, max_retries=0)
    first = {"searcher": _adapter(tmp_path, "s1"), "generator": _adapter(tmp_path, "g1")}
    second = {"searcher": _adapter(tmp_path, "s2"), "generator": _adapter(tmp_path, "g2")}
    backend.load_adapters(first)
    old = set(loaded)
    backend.load_adapters(second)  # same roles again: the fake refuses a reused name with 400
    new = set(loaded)
    assert len(new) == 2 and not new & old
    assert [kind for kind, _ in calls] == ["load", "load", "load", "load", "unload", "unload"]
    assert {body["lora_name"] for _, body in calls[4:]} == old
    assert {body["lora_path"] for _, body in calls[2:4]} == {str(p) for p in second.values()}
    assert sorted(_models(backend, ["searcher", "generator"])) == sorted(new)
    assert loaded[_models(backend, ["searcher"])[0]] == str(second["searcher"])

    backend.load_adapters({})  # back to the base model: everything unloaded
    assert loaded == {} and calls[-1][0] == "unload" and len(calls) == 8
    assert _models(backend, ["searcher", "generator"]) == ["base", "base"]


def test_openai_server_without_runtime_lora_says_how_to_start_vllm(plain_server, tmp_path):
    backend = OpenAIBackend("base", plain_server, max_retries=0)
    with pytest.raises(LLMError, match="VLLM_ALLOW_RUNTIME_LORA_UPDATING=True") as err:
        backend.load_adapters({"searcher": _adapter(tmp_path, "s", r=32)})
    message = str(err.value)
    assert "\n" not in message and "HTTP 404" in message and "--enable-lora" in message
    assert "--max-lora-rank" in message and "r=32" in message
    assert _models(backend, ["searcher"]) == ["base"]  # a failed load leaves routing unchanged


def test_openai_token_ids_are_parsed(plain_server):
    backend = OpenAIBackend("base", plain_server, max_retries=0)
    (out,) = backend.generate([GenerationRequest([{"role": "user", "content": "q"}])])
    assert out.text == "model=base"
    assert out.prompt_token_ids == [101, 102, 103] and out.token_ids == [7, 8]
    assert out.prompt_tokens == 3 and out.completion_tokens == 2
