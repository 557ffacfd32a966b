"""`searchteam train`: a run's config (`config`), its rollouts through the batched runtime (`rollout`) and
the assembly of the team-agnostic RL trainer (`build`). The only package that knows teams, reward schemes
and the trainer at once."""
