"""MMOA-RAG-style static modular pipeline: rewrite → retrieve → select → generate.

The fixed graph of Chen et al. (2025a) as the JADE and M-ASK papers run it as a baseline (JADE
Appendix C: "we strictly follow its fixed-graph topology (Rewriter → Selector → Generator)"; M-ASK
Appendix B: "a query rewriter, a document selector, and an answer generator"). Every question takes the
same path, one call per role:

1. `qr`  rewrites the question into one or more search queries (`<query>…</query>` each, at most
   `options["max_queries"]`, default 4).
2. retrieve top-k passages for every query; the union (first-seen order, no duplicates) is the candidate set.
3. `ds`  selects the helpful candidates by id (`<id>0, 2</id>`, ids 0..n-1 as numbered in its prompt).
4. `ag`  answers from the selected documents (`<answer>…</answer>`; the reply is prefilled with `<answer>`).

Fallbacks (each flags a format error on the turn, never raises):
- `qr` without any `<query>` tag: the original question is the only query; queries beyond the cap are dropped.
- `ds` without an `<id>` tag, with no usable id, or with ids outside 0..n-1: the listed ids that are valid
  are kept; if none is valid, all candidates are kept.
- `ag` without an `<answer>` tag: `Team.answer_from`'s fallback (first line, shortened).

The rewriter and selector helpers live in `searchteam.teams.selectors` (JADE's executors reuse them).
"""

from __future__ import annotations

import asyncio

from pydantic import Field

from searchteam.runtime.context import Context
from searchteam.teams.answering import answer_call
from searchteam.teams.base import GathersItsSearches, Team, TeamOptions
from searchteam.teams.selectors import (
    ID_STOP,
    apply_selection,
    merge_passages,
    numbered_documents,
    queries_from,
    selection_fields,
    selection_tokens,
)
from searchteam.types import Question

MAX_QUERIES = 4
ANSWER_TOKENS = 48  # the generator's cap: a few words and the closing tag


class StaticPipeline(GathersItsSearches, Team):
    name = "static_pipeline"
    description = "MMOA-RAG fixed graph: query rewriter → retrieval → document selector → answer generator."
    roles = ("qr", "ds", "ag")

    class Options(TeamOptions):
        max_queries: int = Field(MAX_QUERIES, ge=1, description="queries the rewriter may write")

    options: Options

    async def run(self, q: Question, ctx: Context) -> str:
        limit = self.options.max_queries
        # Query Rewriter: the question becomes one or more searchable sub-queries.
        qr = await ctx.llm("qr", self.chat("qr", question=q.question), max_new_tokens=64)
        queries = queries_from(qr, q.question, limit)
        # Retrieval: top-k for every sub-query (searched together), pooled into one candidate list.
        results = await asyncio.gather(*(ctx.search(query, self.settings.top_k) for query in queries))
        candidates = merge_passages(list(results))
        # Document Selector: keep the candidates that help answer the question.
        ds = await ctx.llm(
            "ds",
            self.chat("ds", question=q.question, **selection_fields(candidates)),
            stop=ID_STOP,
            max_new_tokens=selection_tokens(len(candidates)),
        )
        selected = apply_selection(ds, candidates)
        # Answer Generator: answer from the selected documents only, its reply opened with <answer>.
        answer = await answer_call(
            ctx,
            self,
            role="ag",
            prompt="ag",
            max_new_tokens=ANSWER_TOKENS,
            question=q.question,
            documents=numbered_documents(selected),
        )
        ctx.snapshot(
            {
                "queries": queries,
                "candidates": [p.id for p in candidates],
                "selected": [p.id for p in selected],
                "answer": answer,
            }
        )
        return answer
