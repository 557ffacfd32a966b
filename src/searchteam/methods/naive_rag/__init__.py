"""Naive RAG: retrieve once, answer once (the papers' vanilla RAG baseline)."""

from searchteam.methods import register_method
from searchteam.methods.naive_rag.team import NaiveRAG
from searchteam.rewards.outcome import OUTCOME

register_method(NaiveRAG, position=1, reward=OUTCOME, recipes={"cpu": "smollm135m-cpu"})
