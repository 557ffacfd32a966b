"""Direct answering: the papers' no-retrieval baseline, one call from parametric memory."""

from __future__ import annotations

from searchteam.runtime.context import Context
from searchteam.teams.answering import answer_call
from searchteam.teams.base import Team
from searchteam.types import Question


class Direct(Team):
    name = "direct"
    description = "Answer from parametric memory, no retrieval (the papers' direct-inference baseline)."
    uses_retrieval = False
    roles = ("answer",)

    async def run(self, q: Question, ctx: Context) -> str:
        return await answer_call(ctx, self, question=q.question)
