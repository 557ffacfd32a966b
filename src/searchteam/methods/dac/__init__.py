"""DAC, Divide and Cooperate: a searcher and a generator trained with cross-verification rewards."""

from searchteam.methods import register_method
from searchteam.methods.dac.reward import REWARD
from searchteam.methods.dac.team import DAC

register_method(DAC, position=8, reward=REWARD, recipes={"cpu": "smollm135m-cpu"})
