"""Search-R1 (Jin et al., 2025): one agent that thinks, searches and answers in one growing reply."""

from searchteam.methods import register_method
from searchteam.methods.search_r1.team import SearchR1
from searchteam.rewards.outcome import OUTCOME

register_method(SearchR1, position=4, reward=OUTCOME, recipes={"cpu": "smollm135m-cpu", "gpu": "qwen3b-gpu"})
