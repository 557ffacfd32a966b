#!/usr/bin/env bash
# GRPO on a searchteam team inside verl (0.9.1, its v1 trainer): Qwen2.5-7B-Instruct with one LoRA adapter
# shared by every role, vLLM rollouts, 8 GPUs. Each rollout plays one searchteam episode through
# searchteam's agent loop and returns one sample per trained turn (docs/integrations.md).
#
#   pip install 'searchteam[verl]'   (plus vllm for verl's rollout servers)
#   bash examples/verl/train.sh mask          # or jade; extra hydra overrides go after it
#   bash examples/verl/train.sh jade --cfg job   # print the composed config without training
#
# Run it from the searchteam checkout (the agent loop configs name examples/verl/*.yaml relative to it).
# Never run by this project at this size: scripts/check_integrations.sh composes this config and runs the
# agent loop in verl's classes on a CPU.
set -euo pipefail
METHOD=${1:?usage: train.sh mask|jade [hydra overrides...]}
shift
HERE=$(cd "$(dirname "$0")" && pwd)
DATA=${DATA:-$HOME/data/searchteam-$METHOD}
MODEL=${MODEL:-Qwen/Qwen2.5-7B-Instruct}

if [ ! -f "$DATA/train.parquet" ]; then  # the questions, as verl's RL parquet (agent_name: searchteam)
  searchteam export-questions --format verl --method "$METHOD" --split train --out "$DATA"
  searchteam export-questions --format verl --method "$METHOD" --split dev --limit 500 --out "$DATA"
fi

python3 -m verl.trainer.main_ppo \
  algorithm.adv_estimator=grpo \
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
  actor_rollout_ref.actor.ppo_mini_batch_size=32 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 \
  actor_rollout_ref.actor.use_kl_loss=True \
  actor_rollout_ref.actor.kl_loss_coef=0.001 \
  actor_rollout_ref.rollout.name=vllm \
  actor_rollout_ref.rollout.n=5 \
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
  trainer.experiment_name="$METHOD-qwen2.5-7b-grpo" \
  trainer.save_freq=50 \
  trainer.test_freq=25 \
  trainer.total_epochs=1 \
  "$@"
