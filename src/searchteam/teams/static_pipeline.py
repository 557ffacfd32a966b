"""MMOA-RAG-style static modular pipeline: rewrite → retrieve → select → generate.

The fixed graph of Chen et al. (2025a) as the JADE and M-ASK papers run it as a baseline (JADE
Appendix C: "we strictly follow its fixed-graph topology (Rewriter → Selector → Generator)"; M-ASK
Appendix B: "a query rewriter, a document selector, and an answer generator"). Every question takes the
same path, one call per role:

1. `qr`  rewrites the question into one or more search queries (`<query>…</query>` each, at most
   `options["max_queries"]`, default 4).
2. retrieve top-k passages for every query; the union (first-seen order, no duplicates) is the candidate set.
3. `ds`  selects the helpful candidates by id (`<id>0, 2</id>`, ids 0..n-1 as numbered in its prompt).
4. `ag`  answers from the selected documents (`<answer>…</answer>`).

Fallbacks (each flags a format error on the turn, never raises):
- `qr` without any `<query>` tag: the original question is the only query; queries beyond the cap are dropped.
- `ds` without an `<id>` tag, with no usable id, or with ids outside 0..n-1: the listed ids that are valid
  are kept; if none is valid, all candidates are kept.
- `ag` without an `<answer>` tag: `Team.answer_from`'s fallback (first line, shortened).

The selector and query helpers here are the executors JADE reuses (same authors, same modules).
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from searchteam.runtime.context import Context
from searchteam.teams.base import Team
from searchteam.teams.parsing import capped, last_tag, small_int, tag_contents
from searchteam.types import Passage, Question, Turn

ID_STOP = ("</id>",)
ANSWER_STOP = ("</answer>",)
MAX_QUERIES = 4


def selection_tokens(n_docs: int) -> int:
    """Room for a selector to list every id and close its tag: 32 tokens, or 4 per id beyond 6 ids
    (Qwen2.5 spells "<id>0, 1, …, 9</id>" in 34 tokens and ids 0-19 in 74; a 0.5B selector over 10
    documents lists all ten, and at 32 it was cut off before `</id>`)."""
    return max(32, 8 + 4 * n_docs)


@dataclass(frozen=True)
class Selection:
    """Document ids chosen by a selector, and whether its output followed the format."""

    ids: list[int]
    ok: bool
    error: str | None = None


def numbered_documents(passages: list[Passage]) -> str:
    """Candidates as `Document0 (Title: t) text` lines: the 0-based ids the selector prompt asks for."""
    if not passages:
        return "(no documents)"
    return "\n".join(f"Document{i} (Title: {p.title}) {p.text}" for i, p in enumerate(passages))


def selection_fields(passages: list[Passage]) -> dict[str, str]:
    """The selector prompt's fields for these candidates: the numbered documents and the highest id."""
    return {"documents": numbered_documents(passages), "max_id": str(max(len(passages) - 1, 0))}


def parse_selection(text: str, n: int) -> Selection:
    """Ids inside `<id>…</id>` ("0, 2", "Document0, Document2" and "Doc 2" all read as ids).

    Invalid output keeps the valid listed ids, or every candidate when none is valid."""
    everything = list(range(n))
    found = last_tag(capped(text), "id")
    if found is None:
        return Selection(everything, ok=False, error="missing <id> tag")
    listed = [(small_int(m), m) for m in re.findall(r"\d+", found)]
    valid = list(dict.fromkeys(i for i, _ in listed if i is not None and 0 <= i < n))
    bad = [m if i is None else i for i, m in listed if i is None or not 0 <= i < n]
    if bad:
        return Selection(valid or everything, ok=False, error=f"ids out of range 0..{n - 1}: {bad}")
    if not valid:
        return Selection(everything, ok=False, error="no document id selected")
    return Selection(valid, ok=True)


def apply_selection(turn: Turn, passages: list[Passage]) -> list[Passage]:
    """The passages the selector turn chose; a malformed choice is flagged on the turn (see fallbacks)."""
    selection = parse_selection(turn.completion, len(passages))
    if not selection.ok:
        turn.flag_format_error(selection.error or "bad selection")
    turn.meta["selected_ids"] = selection.ids
    return [passages[i] for i in selection.ids]


def queries_from(turn: Turn, question: str, limit: int) -> list[str]:
    """The `<query>` contents of a rewriter turn, deduplicated and capped; the question if there are none."""
    found = list(dict.fromkeys(q for q in tag_contents(turn.completion, "query") if q))
    if not found:
        turn.flag_format_error("missing <query> tag")
        return [question]
    if len(found) > limit:
        turn.flag_format_error(f"{len(found)} queries, at most {limit} allowed")
    return found[:limit]


def merge_passages(ranked_lists: list[list[Passage]]) -> list[Passage]:
    """Union of several result lists in first-seen order, one entry per passage id."""
    seen: dict[str, Passage] = {}
    for passages in ranked_lists:
        for p in passages:
            seen.setdefault(p.id, p)
    return list(seen.values())


class StaticPipeline(Team):
    name = "static_pipeline"
    description = "MMOA-RAG fixed graph: query rewriter → retrieval → document selector → answer generator."
    roles = ("qr", "ds", "ag")
    option_names = ("max_queries",)

    async def run(self, q: Question, ctx: Context) -> str:
        limit = int(self.settings.options.get("max_queries", MAX_QUERIES))
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
        # Answer Generator: answer from the selected documents only.
        ag = await ctx.llm(
            "ag",
            self.chat("ag", question=q.question, documents=numbered_documents(selected)),
            stop=ANSWER_STOP,
            max_new_tokens=48,
        )
        answer = self.answer_from(ag)
        ctx.snapshot(
            {
                "queries": queries,
                "candidates": [p.id for p in candidates],
                "selected": [p.id for p in selected],
                "answer": answer,
            }
        )
        return answer
