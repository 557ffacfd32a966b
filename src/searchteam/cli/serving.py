"""Commands that serve over HTTP: `serve` (a team) and `serve-retriever` (the retriever)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from searchteam.cli.app import app, console, quiet_libraries, user_errors
from searchteam.cli.flags import RUN_FLAGS, AllowOpenOpt, ApiKeyOpt, RunFlags, limit_flag, shared_flags
from searchteam.server_limits import RetrieverLimits, ServeLimits


@app.command("serve-retriever")
def serve_retriever(
    retriever: Annotated[str, typer.Option(help="bm25 | dense")] = "bm25",
    corpus: Annotated[Path | None, typer.Option(help="Corpus JSONL(.gz) with id, title, text.")] = None,
    embedder: Annotated[str | None, typer.Option(help="sentence-transformers model for dense.")] = None,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8001,
    max_pending: limit_flag(RetrieverLimits, "max_pending", 1) = RetrieverLimits.max_pending,
    max_body_bytes: limit_flag(RetrieverLimits, "max_body_bytes", 1) = RetrieverLimits.max_body_bytes,
    request_timeout: limit_flag(
        RetrieverLimits, "request_timeout_s", 0.001
    ) = RetrieverLimits.request_timeout_s,
    api_key: ApiKeyOpt = None,
    allow_no_api_key: AllowOpenOpt = False,
) -> None:
    """Serve a Search-R1-compatible POST /retrieve endpoint."""
    from searchteam.auth import check_bind
    from searchteam.retrieval import build_retriever
    from searchteam.retrieval.server import serve

    with user_errors():
        check_bind(host, api_key, allow_no_api_key)
        built = build_retriever(retriever, corpus=corpus, embedder=embedder)
    limits = {
        "max_pending": max_pending,
        "max_body_bytes": max_body_bytes,
        "request_timeout_s": request_timeout,
    }
    serve(built, host=host, port=port, api_key=api_key, allow_open=allow_no_api_key, **limits)


@app.command()
@shared_flags(RUN_FLAGS)
def serve(
    flags: RunFlags,
    host: Annotated[str, typer.Option()] = "127.0.0.1",
    port: Annotated[int, typer.Option()] = 8000,
    max_pending: limit_flag(ServeLimits, "max_pending", 1) = ServeLimits.max_pending,
    max_body_bytes: limit_flag(ServeLimits, "max_body_bytes", 1) = ServeLimits.max_body_bytes,
    request_timeout: limit_flag(ServeLimits, "request_timeout_s", 0.001) = ServeLimits.request_timeout_s,
    api_key: ApiKeyOpt = None,
    allow_no_api_key: AllowOpenOpt = False,
) -> None:
    """Serve a team over HTTP: POST /ask and OpenAI-compatible /v1/chat/completions (model = method).
    At most `concurrency` (config) episodes run at once."""
    from searchteam.auth import check_bind
    from searchteam.serve import build_service
    from searchteam.serve import serve as serve_team

    with user_errors():
        check_bind(host, api_key, allow_no_api_key)
        quiet_libraries()
        cfg = flags.load()
        limits = ServeLimits(
            concurrency=cfg.concurrency,
            max_pending=max_pending,
            max_body_bytes=max_body_bytes,
            request_timeout_s=request_timeout,
        )
        service = build_service(cfg, limits=limits)
    console.print(f"serving {cfg.method} on {cfg.model} at http://{host}:{port}/ (Ctrl-C stops it)")
    with user_errors():  # a team bug that repeats stops the server
        serve_team(service, host=host, port=port, api_key=api_key, allow_open=allow_no_api_key)
