"""Tolerant, honest parsing of tagged model outputs: every parser says whether the format was valid."""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Parsed:
    value: str
    ok: bool
    error: str | None = None


def tag_contents(text: str, tag: str) -> list[str]:
    """All `<tag>...</tag>` contents in order (case-insensitive, across lines)."""
    pattern = re.compile(rf"<{tag}>(.*?)</{tag}>", re.IGNORECASE | re.DOTALL)
    return [m.strip() for m in pattern.findall(text)]


def last_tag(text: str, tag: str) -> str | None:
    found = tag_contents(text, tag)
    return found[-1] if found else None


def untagged(text: str) -> str:
    """The text with every tag replaced by a space."""
    return re.sub(r"<[^>]+>", " ", text)


def flat(text: str) -> str:
    """Whitespace runs (newlines included) collapsed to single spaces, ends stripped."""
    return " ".join(text.split())


def parse_answer(text: str, tag: str = "answer") -> Parsed:
    """The answer inside `<answer>…</answer>` (the last one if several).

    Fallback when the tag is missing (flagged as a format error, never raised): an opened but unclosed
    tag yields the text after it; otherwise the first non-empty line, minus an `Answer:` prefix. Either
    way the fallback is cut at the first sentence end and to 20 words, so a rambling reply still
    scores as a short answer would."""
    found = last_tag(text, tag)
    if found is not None:
        return Parsed(found, ok=True)
    opened = re.search(rf"<{tag}>(.*)", text, re.IGNORECASE | re.DOTALL)
    if opened:
        return Parsed(_shorten(opened.group(1)), ok=False, error=f"unclosed <{tag}> tag")
    lines = [ln.strip() for ln in re.sub(r"<[^>]+>", " ", text).splitlines() if ln.strip()]
    if not lines:
        return Parsed("", ok=False, error="empty output")
    first = re.sub(r"^(final\s+)?answer\s*[:\-]\s*", "", lines[0], flags=re.IGNORECASE)
    return Parsed(_shorten(first), ok=False, error=f"missing <{tag}> tag")


def _shorten(text: str) -> str:
    text = text.strip().splitlines()[0] if text.strip() else ""
    text = re.split(r"(?<=[a-z0-9)])\.\s", text, maxsplit=1)[0]
    return " ".join(text.split()[:20]).rstrip(".")
