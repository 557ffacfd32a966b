"""Hand-built episodes for reward tests (tests/rewards/test_schemes.py and each method's
tests/test_reward.py), whose rewards the tests compute by hand from the papers' equations."""

from __future__ import annotations

from searchteam.types import Episode, Passage, Question, Retrieval, Turn

F1_PARIS_FRANCE = 2 / 3  # F1("Paris France", ["Paris"]): precision 1/2, recall 1


def question(qid: str = "q1", golds: tuple[str, ...] = ("Paris",)) -> Question:
    return Question(id=qid, question="What is the capital of France?", golden_answers=list(golds))


def turn(role: str, step: int = 0, completion: str = "", ok: bool = True, **given) -> Turn:
    """A turn with `given` Turn fields (`frozen=True`) set as such and any other key put in `meta`."""
    fields = {k: v for k, v in given.items() if k in Turn.model_fields}
    meta = {k: v for k, v in given.items() if k not in Turn.model_fields}
    return Turn(role=role, step=step, completion=completion, parsed_ok=ok, meta=meta, **fields)


def retrieval(step: int, *texts: str, query: str = "q") -> Retrieval:
    passages = [Passage(id=f"{step}-{i}", title="T", text=t) for i, t in enumerate(texts)]
    return Retrieval(query=query, k=len(texts), step=step, passages=passages)


def episode(method: str, turns: list[Turn], answer: str, qid: str = "q1", **fields) -> Episode:
    return Episode(question=question(qid), method=method, turns=turns, answer=answer, **fields)


def rewards(ep: Episode, role: str | None = None) -> list[float | None]:
    return [t.reward for t in ep.turns if role is None or t.role == role]
