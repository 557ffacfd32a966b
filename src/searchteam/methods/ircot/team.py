"""IRCoT: interleave retrieval with chain-of-thought, one sentence at a time (Trivedi et al., 2023).

The iterative baseline of the DAC, JADE and M-ASK papers. The loop of the IRCoT paper:

1. retrieve top-k passages for the question;
2. `reasoner` reads the collected passages and the question and continues its chain of thought inside
   one growing assistant reply; only the first new sentence is kept;
3. if that sentence says "So the answer is: X" the chain stops; otherwise the sentence is the next
   retrieval query and its passages join the collection (distinct passages, first-seen order);
4. repeat from 2 for at most `settings.max_turns` reasoning steps.

The answer: X when the chain concluded with "So the answer is: X" (IRCoT's "answer is:" extraction, which
also takes "The answer is: X");
otherwise `answer` (IRCoT's reader) answers from the passages and the reasoning inside `<answer>` tags.

Knobs: `settings.top_k` passages per retrieval; `options["max_passages"]` (default 15, IRCoT's paragraph
budget) collected passages shown to the reasoner and the reader.

Fallbacks (each flags a format error on the turn, never raises):
- reasoner: an empty sentence ends the chain (there is nothing to retrieve with); "So the answer is:" with
  nothing after it ends the chain and leaves the answer to the reader.
- answer: `Team.answer_from`'s fallback.
"""

from __future__ import annotations

import re

from pydantic import Field

from searchteam.runtime.context import Context
from searchteam.teams.base import GathersItsSearches, Team, TeamOptions
from searchteam.teams.parsing import capped
from searchteam.types import Passage, Question

# IRCoT's "answer is:" marker: "So the answer is: X", "So the answer is X" or "The answer is: X"
ANSWER_MARK = re.compile(r"(\bso the answer is\b|\bthe answer is\s*:)\s*:?", re.IGNORECASE)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z\"'(])")
MAX_PASSAGES = 15


def first_sentence(text: str) -> str:
    """The first sentence of the first non-empty line; a concluding sentence runs to the end of its line,
    so an answer with periods in it ("St. Louis") stays whole."""
    line = next((ln.strip() for ln in capped(text).splitlines() if ln.strip()), "")
    first = SENTENCE_END.split(line, maxsplit=1)[0]
    mark = ANSWER_MARK.search(line)
    return line if mark and mark.start() < len(first) else first


def concluded_answer(sentence: str) -> str | None:
    """X in "… So the answer is: X." ("" when nothing follows); None when the sentence does not conclude."""
    sentence = capped(sentence)
    mark = ANSWER_MARK.search(sentence)
    if mark is None:
        return None
    return sentence[mark.end() :].strip().rstrip(".").strip()


def wikipedia_paragraphs(passages: list[Passage]) -> str:
    """Passages in IRCoT's prompt format: `Wikipedia Title: <title>` then the paragraph."""
    return "\n\n".join(f"Wikipedia Title: {p.title}\n{p.text}" for p in passages)


class IRCoT(GathersItsSearches, Team):
    name = "ircot"
    description = "IRCoT: interleave one chain-of-thought sentence with one retrieval per step."
    roles = ("reasoner", "answer")
    reader_roles = ("answer",)

    class Options(TeamOptions):
        max_passages: int = Field(MAX_PASSAGES, ge=1, description="cap on the passages the reasoner reads")

    options: Options

    async def run(self, q: Question, ctx: Context) -> str:
        budget = self.options.max_passages
        collected: dict[str, Passage] = {}
        self.collect(collected, await ctx.search(q.question, self.settings.top_k))  # step 1
        thoughts: list[str] = []
        answer: str | None = None
        for step in range(self.settings.max_turns):  # step 4: at most max_turns sentences
            ctx.step = step
            shown = wikipedia_paragraphs(list(collected.values())[:budget])
            turn = await ctx.llm(
                "reasoner",
                self.chat("reasoner", documents=shown, question=q.question),
                continuation=" ".join(thoughts),
                max_new_tokens=48,
            )
            sentence = first_sentence(turn.completion)  # step 2: keep one new sentence
            turn.meta["sentence"] = sentence
            if not sentence:
                turn.flag_format_error("empty reasoning sentence")
                break
            thoughts.append(sentence)
            answer = concluded_answer(sentence)  # step 3
            if answer is None:
                self.collect(collected, await ctx.search(sentence, self.settings.top_k))
            ctx.snapshot({"thoughts": list(thoughts), "passages": list(collected), "concluded": answer})
            if answer is not None:
                if not answer:
                    turn.flag_format_error("'So the answer is:' without an answer")
                break
        if answer:
            return answer
        ctx.step += 1
        return await self.answer(q, list(collected.values())[:budget], thoughts, ctx)

    @staticmethod
    def collect(collected: dict[str, Passage], passages: list[Passage]) -> None:
        for p in passages:
            collected.setdefault(p.id, p)

    async def read(self, q: Question, ctx: Context, passages: list[Passage]) -> str:
        """IRCoT's reader on another method's passages, with no reasoning of its own."""
        return await self.answer(q, passages, [], ctx)

    async def answer(self, q: Question, passages: list[Passage], thoughts: list[str], ctx: Context) -> str:
        """IRCoT's reader: answer from the collected passages and the reasoning so far."""
        prompt = self.chat(
            "answer",
            documents=wikipedia_paragraphs(passages),
            question=q.question,
            reasoning=" ".join(thoughts) or "(none)",
        )
        return self.answer_from(await ctx.llm("answer", prompt, stop=("</answer>",), max_new_tokens=48))
