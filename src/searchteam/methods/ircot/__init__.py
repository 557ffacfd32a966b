"""IRCoT (Trivedi et al., 2023): interleave chain-of-thought sentences with retrieval."""

from searchteam.methods import register_method
from searchteam.methods.ircot.team import IRCoT
from searchteam.rewards.outcome import OUTCOME

register_method(IRCoT, position=2, reward=OUTCOME)
