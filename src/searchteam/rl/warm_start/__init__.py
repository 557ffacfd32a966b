"""The warm start: rejection-sampling fine-tuning (expert iteration) before RL. `data` is its data side
(which sampled episodes to keep, their turns as likelihood samples, the files that let a killed warm start
resume under `RUN/warm_start/`); `loop.WarmStartLoop` runs the rounds for `Trainer.run_warm_start`."""
