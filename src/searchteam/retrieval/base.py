"""The retriever protocol: batched `search(queries, k)` returning ranked passages per query."""

from __future__ import annotations

from typing import Protocol

from searchteam.types import Passage


class Retriever(Protocol):
    name: str

    def search(self, queries: list[str], k: int) -> list[list[Passage]]: ...
