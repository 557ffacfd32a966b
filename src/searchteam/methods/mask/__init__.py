"""M-ASK (Chen et al.): five agents share a structured knowledge state, with turn-level ΔF1 rewards."""

from searchteam.methods import register_method
from searchteam.methods.mask.reward import REWARD
from searchteam.methods.mask.team import MASK

register_method(MASK, position=5, reward=REWARD, recipes={"cpu": "smollm135m-cpu", "gpu": "qwen7b-gpu"})
