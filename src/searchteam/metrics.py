"""SQuAD-style answer metrics, best over all golden answers (as in FlashRAG and Search-R1), and retrieval
recall of an episode's searches."""

from __future__ import annotations

import re
import string
import unicodedata
from collections import Counter
from collections.abc import Iterable, Sequence

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCT = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and articles, collapse whitespace; unicode is NFKC-folded first."""
    text = unicodedata.normalize("NFKC", text or "").lower()
    text = "".join(ch for ch in text if ch not in _PUNCT and not unicodedata.category(ch).startswith("P"))
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def cover_exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1 if some normalized gold answer appears, as whole words, inside the normalized prediction."""
    pred = f" {normalize_answer(prediction)} "
    return float(any((g := normalize_answer(gold)) and f" {g} " in pred for gold in golds))


def substring_match(prediction: str, golds: Sequence[str]) -> float:
    """FlashRAG's `acc` (Search-R1's `subem`): 1 if some normalized gold answer is a plain substring of the
    normalized prediction, word boundaries ignored ("1" counts inside "1990"). A gold that normalizes to
    nothing matches nothing (FlashRAG would count it as found in every prediction)."""
    pred = normalize_answer(prediction)
    return float(any((g := normalize_answer(gold)) and g in pred for gold in golds))


# HotpotQA's closed answers: a prediction or gold that normalizes to one of these scores F1 only by equality.
CLOSED_ANSWERS = frozenset({"yes", "no", "noanswer"})


def _token_f1(prediction: str, gold: str) -> float:
    """Token F1 of one gold, with HotpotQA's rule (`hotpot_evaluate_v1.py`, FlashRAG's `F1_Score`): when the
    normalized prediction or gold is yes/no/noanswer and the two differ, F1 is 0, not a token overlap."""
    pred, ref = normalize_answer(prediction), normalize_answer(gold)
    if pred != ref and (pred in CLOSED_ANSWERS or ref in CLOSED_ANSWERS):
        return 0.0
    pred_tokens, gold_tokens = pred.split(), ref.split()
    common = Counter(pred_tokens) & Counter(gold_tokens)
    overlap = sum(common.values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, golds: Sequence[str]) -> float:
    """Token F1, best over golds, as HotpotQA's official script and FlashRAG's `f1` score it."""
    return max((_token_f1(prediction, g) for g in golds), default=0.0)


def hit(text: str, golds: Sequence[str]) -> float:
    """1 if any gold answer occurs in an arbitrary text (a passage, a trajectory)."""
    return cover_exact_match(text, golds)


def sufficiency(passages: Iterable[str], golds: Sequence[str]) -> float:
    """EM-based retrieval sufficiency: some retrieved passage contains some gold answer."""
    return float(any(hit(p, golds) for p in passages))


def gold_rank(rankings: Iterable[Sequence[str]], golds: Sequence[str]) -> int | None:
    """The best 1-based rank at which a passage containing a gold answer (whole words, as `hit`) was
    retrieved, over every ranked list in `rankings` (one per retriever call); None if none contains one.

    An episode's recall@k is `gold_rank <= k`: some search of the episode, not only the first, had a gold
    answer among its top k passages. For a method that searches once this is FlashRAG's
    `retrieval_recall_top{k}`."""
    ranks = (rank for ranking in rankings for rank, text in enumerate(ranking, 1) if hit(text, golds))
    return min(ranks, default=None)


def recall_at_k(rank: int | None, k: int) -> float:
    """1 if a gold answer was retrieved within the top `k` (see `gold_rank`)."""
    return float(rank is not None and rank <= k)


def answer_scores(prediction: str, golds: Sequence[str]) -> dict[str, float]:
    return {
        "em": exact_match(prediction, golds),
        "cover_em": cover_exact_match(prediction, golds),
        "acc": substring_match(prediction, golds),
        "f1": f1_score(prediction, golds),
    }
