"""MMOA-RAG's static pipeline (Chen et al., 2025a): rewrite, retrieve, select, generate."""

from searchteam.methods import register_method
from searchteam.methods.static_pipeline.reward import REWARD
from searchteam.methods.static_pipeline.team import StaticPipeline

register_method(StaticPipeline, position=3, reward=REWARD)
