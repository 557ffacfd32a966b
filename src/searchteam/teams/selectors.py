"""Query rewriting and document selection shared by MMOA-RAG's static pipeline and JADE's executors (same
authors, same modules): rewriter queries, the numbered candidate list a selector sees, and its parsed choice.

Fallbacks (each flags a format error on the turn, never raises): a rewriter without any `<query>` tag gives
the original question as the only query, and queries beyond the cap are dropped; a selector without an `<id>`
tag, with no usable id, or with ids outside 0..n-1 keeps the listed ids that are valid, else all candidates.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from searchteam.teams.parsing import capped, last_tag, small_int, tag_contents
from searchteam.types import Passage, Turn

ID_STOP = ("</id>",)
ANSWER_STOP = ("</answer>",)


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
