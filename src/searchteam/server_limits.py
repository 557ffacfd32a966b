"""The bounds each HTTP server puts on its requests: the defaults of `searchteam serve-retriever` and
`searchteam serve` and of the apps they start. A field's `help` is its flag's help text."""

from __future__ import annotations

from dataclasses import dataclass, field


def bound(default: float, help: str) -> float:  # noqa: A002 (the flag's word)
    return field(default=default, metadata={"help": help})


PENDING = "Requests in flight at most; more get 503 with Retry-After."


@dataclass(frozen=True)
class RetrieverLimits:
    """`searchteam serve-retriever` (`retrieval.server.create_app`)."""

    max_queries: int = 256
    max_k: int = 100
    max_query_chars: int = 2000
    # fits max_queries queries of max_query_chars, even as \uXXXX escapes
    max_body_bytes: int = bound(4 * 2**20, "Largest request body in bytes; larger: 413.")
    # under HTTPRetriever's 30 s, so its client reads the 504's message
    request_timeout_s: float = bound(25.0, "Seconds a request may take; slower: 504.")
    max_pending: int = bound(512, PENDING)


@dataclass(frozen=True)
class ServeLimits:
    """`searchteam serve` (`serve.create_app`): `concurrency` episodes run at once (the run config's)."""

    concurrency: int = 64
    max_pending: int = bound(256, PENDING)
    max_question_chars: int = 4000
    # a chat request carries the whole conversation, of which one turn is used
    max_body_bytes: int = bound(2**20, "Largest request body in bytes; larger: 413.")
    # an episode of several model calls, queued behind `concurrency` others
    request_timeout_s: float = bound(300.0, "Seconds a request may take; slower: cancelled, 504.")
