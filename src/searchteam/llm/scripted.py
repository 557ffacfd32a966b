"""A scripted LLM double for unit tests of control flow. Never a default, never a demo."""

from __future__ import annotations

from collections.abc import Callable

from searchteam.llm.base import Completion, GenerationRequest, truncate_at_stop

Responder = Callable[[GenerationRequest], str]


class ScriptedLLM:
    """Answers each request with `responder(request)` or, given a list, the next scripted string. With
    `record` (the default) it keeps every request and batch size for the test to read."""

    def __init__(self, script: list[str] | Responder, name: str = "scripted", record: bool = True) -> None:
        self.name = name
        self.record = record
        self._responder = script if callable(script) else None
        self._queue = list(script) if not callable(script) else []
        self.requests: list[GenerationRequest] = []
        self.batch_sizes: list[int] = []

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        if self.record:
            self.batch_sizes.append(len(requests))
            self.requests.extend(requests)
        out = []
        for req in requests:
            text = self._responder(req) if self._responder else self._next()
            text, _ = truncate_at_stop(text, req.sampling.stop)
            prompt_len = sum(len(m["content"].split()) for m in req.messages)
            n = len(text.split())
            out.append(
                Completion(
                    text=text,
                    token_ids=list(range(n)),
                    prompt_tokens=prompt_len,
                    completion_tokens=n,
                )
            )
        return out

    def _next(self) -> str:
        if not self._queue:
            raise AssertionError("ScriptedLLM ran out of scripted responses")
        return self._queue.pop(0)
