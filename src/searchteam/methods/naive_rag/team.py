"""Naive RAG: retrieve top-k passages for the question once, then answer from them in one call."""

from __future__ import annotations

from searchteam.runtime.context import Context
from searchteam.teams.answering import answer_call
from searchteam.teams.base import Team, format_documents
from searchteam.types import Question


class NaiveRAG(Team):
    name = "naive_rag"
    description = "Retrieve top-k passages for the question once, then answer from them (vanilla RAG)."
    roles = ("answer",)

    async def run(self, q: Question, ctx: Context) -> str:
        docs = await ctx.search(q.question, k=self.settings.top_k)
        return await answer_call(ctx, self, question=q.question, documents=format_documents(docs))
