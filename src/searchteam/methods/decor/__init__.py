"""DECOR: planner, filter, compressor and answerer over a bounded memory, rewarded by an LLM judge."""

from searchteam.methods import register_method
from searchteam.methods.decor.reward import REWARD
from searchteam.methods.decor.team import DECOR

register_method(DECOR, position=7, reward=REWARD, recipes={"cpu": "smollm135m-cpu"})
