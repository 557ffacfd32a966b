"""The single answer call of the one-call baselines (direct answering and naive RAG)."""

from __future__ import annotations

from searchteam.runtime.context import Context
from searchteam.teams.base import Team

ANSWER_STOP = ("</answer>",)
# The assistant turn is prefilled with the opening tag: SmolLM2-135M otherwise often answers with a
# sentence (56% format errors on NQ dev, all 8 naive_rag tries with long document prompts). A reply that
# never closes the tag is still a format error, and parse_answer's fallback keeps its first sentence.
ANSWER_OPEN = "<answer>"


async def answer_call(ctx: Context, team: Team, **fields: str) -> str:
    """One `answer` call with the team's prompt filled with `fields`; the parsed answer."""
    turn = await ctx.llm("answer", team.chat(**fields), stop=ANSWER_STOP, continuation=ANSWER_OPEN)
    return team.answer_from(turn, prefill=ANSWER_OPEN)
