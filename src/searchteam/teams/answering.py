"""The answer call prefilled with `<answer>`: direct answering's, naive RAG's and the static pipeline's."""

from __future__ import annotations

from searchteam.runtime.context import Context
from searchteam.teams.base import Team

ANSWER_STOP = ("</answer>",)
# The assistant turn is prefilled with the opening tag: SmolLM2-135M otherwise often answers with a
# sentence (56% format errors on NQ dev, all 8 naive_rag tries with long document prompts). A reply that
# never closes the tag is still a format error, and parse_answer's fallback keeps its first sentence.
ANSWER_OPEN = "<answer>"


async def answer_call(
    ctx: Context,
    team: Team,
    *,
    role: str = "answer",
    prompt: str = "",
    max_new_tokens: int | None = None,
    **fields: str,
) -> str:
    """One call as `role` with the team's `prompt` filled with `fields`, its reply opened with `<answer>`;
    the parsed answer."""
    messages = team.chat(prompt, **fields)
    turn = await ctx.llm(
        role, messages, stop=ANSWER_STOP, max_new_tokens=max_new_tokens, continuation=ANSWER_OPEN
    )
    return team.answer_from(turn, prefill=ANSWER_OPEN)
