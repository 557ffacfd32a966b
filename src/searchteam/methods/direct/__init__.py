"""Direct answering: the no-retrieval baseline of every paper."""

from searchteam.methods import register_method
from searchteam.methods.direct.team import Direct
from searchteam.rewards.outcome import OUTCOME

register_method(Direct, position=0, reward=OUTCOME)
