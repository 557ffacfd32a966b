"""Naive RAG: retrieve top-k passages for the question once, then answer from them in one call.

As a part of a composed team it gathers the question's own top-k (no LLM call) and reads any given passages
with the same answer call."""

from __future__ import annotations

from searchteam.runtime.context import Context
from searchteam.teams.answering import answer_call
from searchteam.teams.base import Team, format_documents
from searchteam.types import Passage, Question


class NaiveRAG(Team):
    name = "naive_rag"
    description = "Retrieve top-k passages for the question once, then answer from them (vanilla RAG)."
    roles = ("answer",)
    gatherer_roles = ()

    async def run(self, q: Question, ctx: Context) -> str:
        return await self.read(q, ctx, await self.gather(q, ctx))

    async def gather(self, q: Question, ctx: Context) -> list[Passage]:
        return await ctx.search(q.question, k=self.settings.top_k)

    async def read(self, q: Question, ctx: Context, passages: list[Passage]) -> str:
        return await answer_call(ctx, self, question=q.question, documents=format_documents(passages))
