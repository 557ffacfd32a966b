"""JADE: a planner builds a workflow of executors per sub-query; one shared global reward."""

from searchteam.methods import register_method
from searchteam.methods.jade.reward import REWARD
from searchteam.methods.jade.team import Jade

register_method(Jade, position=9, reward=REWARD, recipes={"cpu": "smollm135m-cpu"})
