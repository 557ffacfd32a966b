"""`searchteam serve`: one team behind HTTP, as a search module any OpenAI client can call.

    POST /ask                    {"question": "...", "golden_answers": [...]?} → answer, trace (and scores);
                                 with "stream": true, server-sent events: one `turn` per LLM call as it
                                 finishes, then `answer` (the reply above)
    POST /v1/chat/completions    OpenAI chat request whose `model` is the method; the last user message is
                                 the question; the answer is the assistant message, the trace rides along;
                                 with "stream": true, `chat.completion.chunk` events and `data: [DONE]`
    GET  /v1/models              the one model (= method) served
    GET  /health                 status, requests in flight, batching so far

Each request becomes one episode on the server's event loop, over backends shared by all requests: the
runtime's batchers gather the LLM and retrieval calls of concurrent episodes into shared model batches, as
in an eval run. Bounds (`ServeLimits`): `concurrency` episodes run at once; beyond `max_pending` requests
in flight the server answers 503 with `Retry-After`; a body over `max_body_bytes` or a question over
`max_question_chars` is a 413; a request not answered within `request_timeout_s` is cancelled with a 504
(a stream past it ends with an `error` event). A streaming client that goes away cancels its episode.
"""

from searchteam.serve.app import create_app, serve
from searchteam.serve.service import TeamService, build_service
from searchteam.server_limits import ServeLimits

__all__ = ["ServeLimits", "TeamService", "build_service", "create_app", "serve"]
