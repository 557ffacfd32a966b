"""IRCoT's declarations for the generic suites (tests/support/contracts.py): its reasoning step's first
sentence and the answer it concludes."""

from __future__ import annotations

from searchteam.methods.ircot import team as ircot
from tests.support.contracts import FuzzTarget


def first_sentence_and_answer(text: str) -> tuple[str, str | None]:
    sentence = ircot.first_sentence(text)
    return sentence, ircot.concluded_answer(sentence)


def check_ircot(r: tuple[str, str | None]) -> None:
    sentence, answer = r
    assert sentence == sentence.strip() and len(sentence.splitlines()) <= 1
    assert answer is None or isinstance(answer, str)


FUZZ_TARGETS = [FuzzTarget("ircot.first_sentence", first_sentence_and_answer, (), check_ircot)]
