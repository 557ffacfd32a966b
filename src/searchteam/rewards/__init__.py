"""Generic reward pieces: answer metrics, the LLM judge, the reward-scheme contract (`base`) and the outcome
reward several methods share (`outcome`). Each method's own scheme lives in its package
(`searchteam/methods/<name>/reward.py`)."""
