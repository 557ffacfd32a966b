#!/usr/bin/env bash
# RL on a searchteam team inside verl (0.9.1, its v1 sync trainer): Qwen2.5-7B-Instruct with one LoRA adapter
# shared by every role, vLLM rollouts, 8 GPUs. Each rollout plays one searchteam episode through searchteam's
# agent loop and returns one row per trained turn; searchteam's trainer (trainer.v1.trainer_mode=searchteam)
# gives each row the credit the team's run config names: M-ASK's turn-level GAE (so verl's critic is built),
# JADE's GRPO (docs/integrations.md).
#
#   pip install 'searchteam[verl]'   (plus vllm for verl's rollout servers)
#   bash examples/verl/train.sh mask          # or jade; extra hydra overrides go after it
#   bash examples/verl/train.sh jade --cfg job   # print the composed config without training
#
# Mini-batches: verl's v1 trainer takes ppo_mini_batch_size x rollout.n rows per optimizer step, and a
# searchteam rollout is one row per trained turn, so the size is given in rows: EPISODES_PER_UPDATE episodes
# times ROWS_PER_EPISODE (about 14 for M-ASK with 4 search turns, 3 for JADE), hence 4 optimizer steps per
# 128 x 5 episodes. Dynamic batch sizing lets a mini-batch exceed train_batch_size (verl checks it in prompts).
#
# Run it from the searchteam checkout (the agent loop configs name examples/teams/*.yaml relative to it).
# Never run by this project at this size: scripts/check_integrations.sh composes this config and runs the
# agent loop and the trainer's post-rollout code in verl's classes on a CPU.
set -euo pipefail
METHOD=${1:?usage: train.sh mask|jade [hydra overrides...]}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${DATA:-$HOME/data/searchteam-$METHOD}
MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}
N=5  # rollouts per question (GRPO's G)
EPISODES_PER_UPDATE=160  # 32 questions x 5 rollouts per optimizer step
case $METHOD in
  mask) ROWS=${ROWS_PER_EPISODE:-14}; ESTIMATOR=gae ;;  # M-ASK's run config: turn-level GAE, a critic
  *) ROWS=${ROWS_PER_EPISODE:-3}; ESTIMATOR=grpo ;;
esac

if [ ! -f "$DATA/train.parquet" ]; then  # the questions, as verl's RL parquet (agent_name: searchteam)
  searchteam export-questions --format verl --method "$METHOD" --split train --out "$DATA"
  searchteam export-questions --format verl --method "$METHOD" --split dev --limit 500 --out "$DATA"
fi

python3 -m searchteam.integrations.verl_trainer \
  trainer.v1.trainer_mode=searchteam \
  algorithm.adv_estimator=$ESTIMATOR \
  algorithm.use_kl_in_reward=False \
  data.train_files="$DATA/train.parquet" \
  data.val_files="$DATA/dev.parquet" \
  data.train_batch_size=128 \
  data.max_prompt_length=4096 \
  data.max_response_length=512 \
  data.return_raw_chat=True \
  actor_rollout_ref.model.path="$MODEL" \
  actor_rollout_ref.model.lora_rank=64 \
  actor_rollout_ref.model.lora_alpha=32 \
  actor_rollout_ref.model.target_modules=all-linear \
  actor_rollout_ref.model.enable_gradient_checkpointing=True \
  actor_rollout_ref.actor.optim.lr=1e-5 \
  actor_rollout_ref.actor.ppo_mini_batch_size=$((EPISODES_PER_UPDATE * ROWS / N)) \
  actor_rollout_ref.actor.use_dynamic_bsz=True \
  actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384 \
  critic.ppo_mini_batch_size=$((EPISODES_PER_UPDATE * ROWS / N)) \
  critic.use_dynamic_bsz=True \
  critic.model.path="$MODEL" \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=$N \
  actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
  actor_rollout_ref.rollout.max_model_len=8192 \
  actor_rollout_ref.rollout.agent.agent_loop_config_path="$HERE/agent-loop-$METHOD.yaml" \
  actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8 \
  trainer.use_v1=True \
  trainer.n_gpus_per_node=8 \
  trainer.nnodes=1 \
  trainer.project_name=searchteam \
  trainer.experiment_name="$METHOD-qwen2.5-7b-$ESTIMATOR" \
  trainer.save_freq=50 \
  trainer.test_freq=25 \
  trainer.total_epochs=1 \
  "$@"
