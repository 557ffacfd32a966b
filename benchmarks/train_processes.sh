#!/usr/bin/env bash
# One real RL step of `naive_rag/smollm135m-cpu` (the default model, its real retriever and NQ questions) in one
# process and in two data-parallel processes (torchrun, gloo) on this machine, one after the other. Prints
# each run's record (world_size, episodes, samples, reward, times) and the wall-clock ratio of the two.
# Both runs see the same step-0 questions and train on every sample (dynamic sampling off, so both update
# on all 16); a warm-up run first fills the caches (converted model, OpenVINO export, BM25 index) so that
# neither timed run pays for them. Usage: bash benchmarks/train_processes.sh [OUT]
set -euo pipefail
out="${1:-$(mktemp -d)}"
export HF_HUB_OFFLINE=1
rm -rf "$out" && mkdir -p "$out"
python -c '
import sys, yaml
from searchteam.methods import shipped_recipes
recipe = yaml.safe_load(shipped_recipes()["naive_rag/smollm135m-cpu"][0].read_text())
recipe["train"]["dynamic_sampling"] = False
open(sys.argv[1], "w").write(yaml.safe_dump(recipe))
' "$out/recipe.yaml"
train() {  # train DIR [FLAGS...]
  local dir="$1"; shift
  searchteam train --config "$out/recipe.yaml" --steps 1 --out "$dir" "$@" > "$dir.log" 2>&1
}

train "$out/warmup"
for n in 1 2; do
  start=$(date +%s.%N)
  train "$out/p$n" --num-processes "$n"
  echo "$start $(date +%s.%N)" > "$out/p$n.wall"
done
python - "$out" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
keys = ["world_size", "episodes", "samples", "reward/mean", "time/rollout", "time/update"]
wall = {}
for n in (1, 2):
    start, end = map(float, (out / f"p{n}.wall").read_text().split())
    wall[n] = end - start
    record = json.loads((out / f"p{n}" / "train_log.jsonl").read_text().splitlines()[0])
    print(f"{n} process(es): wall {wall[n]:.1f} s  " + "  ".join(f"{k}={record[k]:.4g}" for k in keys))
print(f"wall-clock ratio, 1 process / 2 processes: {wall[1] / wall[2]:.2f}")
EOF
