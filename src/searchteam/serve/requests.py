"""Reading a request: its JSON body, question and flags, checked, each problem answered as the endpoint's
error (FastAPI's `HTTPException` for /ask, `OpenAIError` in OpenAI's shape for /v1)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import HTTPException, Request
from fastapi.responses import JSONResponse

from searchteam.server_limits import ServeLimits


class OpenAIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        kind = "invalid_request_error" if self.status < 500 else "server_error"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


WORK_PATHS = ("/ask", "/v1/chat/completions")


def error_body(path: str, status: int, message: str) -> dict[str, Any]:
    """A bounds error (413, 503, 504) in the shape of its endpoint: OpenAI's under /v1, else FastAPI's."""
    return OpenAIError(status, message).body() if path.startswith("/v1/") else {"detail": message}


def fail(kind: type[Exception], status: int, message: str, param: str | None = None) -> Exception:
    """An HTTPException (for /ask) or an OpenAIError (for /v1) with this status and message."""
    return OpenAIError(status, message, param) if kind is OpenAIError else HTTPException(status, message)


async def json_object(request: Request, kind: type[Exception]) -> dict[str, Any]:
    try:
        body = json.loads(await request.body())
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise fail(kind, 400, "the request body is not JSON: send a JSON object") from None
    if not isinstance(body, dict):
        raise fail(kind, 400, f"the request body must be a JSON object, not {type(body).__name__}")
    return body


def question_text(value: Any, param: str, limits: ServeLimits, kind: type[Exception]) -> str:
    if value is None:
        raise fail(kind, 422, f'\'{param}\' is missing: send {{"question": "..."}}', param)
    if not isinstance(value, str) or not value.strip():
        raise fail(kind, 422, "the question must be a non-empty string", param)
    if len(value) > limits.max_question_chars:
        message = f"the question has {len(value)} characters; the limit is {limits.max_question_chars}"
        raise fail(kind, 413, message, param)
    return value.strip()


def flag(body: dict[str, Any], name: str, kind: type[Exception]) -> bool:
    value = body.get(name, False)
    if value is None or isinstance(value, bool):
        return bool(value)
    raise fail(kind, 400 if kind is OpenAIError else 422, f"'{name}' must be true or false", name)


def golden_answers(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise HTTPException(422, "'golden_answers' must be a list of strings")
    return value


def check_chat_request(body: dict[str, Any], method: str) -> None:
    model = body.get("model")
    if model is None:
        raise OpenAIError(400, f"'model' is missing: this server serves the method '{method}'", "model")
    if model != method:
        message = f"the model '{model}' does not exist: this server serves the method '{method}'"
        raise OpenAIError(404, message, "model", "model_not_found")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise OpenAIError(400, "'stream_options' must be an object", "stream_options")
    if options is not None and not body.get("stream"):
        message = "'stream_options' is only allowed when 'stream' is true"
        raise OpenAIError(400, message, "stream_options")
    if body.get("n") not in (None, 1):
        raise OpenAIError(400, "only n=1 is supported: a team gives one answer per question", "n")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
        raise OpenAIError(400, "'messages' must be a non-empty list of {role, content} objects", "messages")


def last_user_message(messages: list[dict[str, Any]]) -> str:
    """The text of the last user message (a string, or the text parts of a content list)."""
    for message in reversed(messages):
        if message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, list):
                parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"]
                return "".join(str(p.get("text", "")) for p in parts)
            if not isinstance(content, str):
                raise OpenAIError(400, "the last user message has no text 'content'", "messages")
            return content
    raise OpenAIError(
        400, "'messages' has no user message: the last user message is the question", "messages"
    )
