"""Generic reward pieces: the LLM judge, the reward-scheme contract (`base`) and the outcome reward several
methods share (`outcome`); the answer metrics they score with are `searchteam.metrics`. Each method's own
scheme lives in its package (`searchteam/methods/<name>/reward.py`)."""
