#!/usr/bin/env bash
# One step of the GPU programme (docs/gpu.md), run on the device machine after gpu/unpack.sh:
#
#   bash gpu/step.sh STEP [--smoke]
#     STEP: tests | bench | eval | train | bench-trained | train-eagle3 | bench-eagle3
#
# Each step sources $GPU_ROOT/env.sh (PYTHONPATH to the staged site, SPECDEC_TARGET to the converted
# target), runs one command under its own `timeout` so that it ends well inside the device tool's
# 10 minutes, and writes what it learned under $OUT: STEP.txt (the table), STEP.json, STEP.log and
# STEP-device.json (train: train.json, train.log and the draft in draft/, in parts of 15 MiB;
# train-eagle3 the same, its device facts inside train-eagle3.json: the tool returns 8 files at most).
# --smoke runs the same commands on the CPU with tiny budgets (the rehearsal in
# tests/harness/test_gpu_steps.py: a tiny target in SPECDEC_TARGET, two cases, a few tokens).
#
# Knobs, for a rerun after a timeout (docs/gpu.md says when): STEP_TIMEOUT (seconds, default per step),
# BENCH_LIMIT (cases; default all), BENCH_EXTRA (more bench flags), TRAIN_MINUTES (default 6), TRAIN_TOKENS (default 100M),
# TRAIN_BATCH (default 32), TRAIN_INIT (default draft:decoder/weights/gemma3-270m-code, the shipped draft;
# for train-eagle3 draft:decoder/weights/gemma3-270m-eagle3 where that folder exists, else a fresh draft,
# and TRAIN_INIT=fresh starts fresh), EAGLE_TOKENS (train-eagle3's feature tokens, default 4M: 5 kB of
# bf16 features a token on disk for Gemma 3 270M, so 4M is ~20 GB of the machine's 64 GiB),
# EAGLE_TRAIN_TOKENS (default 100M). train-eagle3 shares train's TRAIN_MINUTES and TRAIN_BATCH.
set -uo pipefail
cd "$(dirname "$0")/.." # the repo root: docs/examples/cases.jsonl, tests/

step=${1:?usage: gpu/step.sh tests|bench|eval|train|bench-trained|train-eagle3|bench-eagle3 [--smoke]}
smoke=${2:-}
GPU_ROOT=${GPU_ROOT:-/tmp/gpu}
OUT=${OUT:?OUT must name the folder results go to}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT"
# shellcheck source=/dev/null
source "$GPU_ROOT/env.sh"
: "${SPECDEC_TARGET:?env.sh must export SPECDEC_TARGET}"
export TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
# The repo root is the working directory, and its speccomplete/ folder holds only the CLI and the
# harness: on the path first (as `python -m` puts it), it would hide the staged package's decoder.
export PYTHONSAFEPATH=1

cases=docs/examples/cases.jsonl
draft_dir=$GPU_ROOT/train/draft # finetune's --out: a second call resumes from its checkpoint while the machine is warm
eagle_dir=$GPU_ROOT/train-eagle3/draft # train-eagle3's --out, resumed the same way; its features beside it
eagle_features=$GPU_ROOT/train-eagle3/features
if [ "$smoke" = --smoke ]; then
  device=(--device cpu --dtype float32 --steps eager)
  # two cases (eval has no --limit): one single-line, one multi-line (docs/examples/cases.jsonl)
  head -n 2 "$cases" >"$GPU_ROOT/smoke-cases.jsonl"
  cases=$GPU_ROOT/smoke-cases.jsonl
  limit=()
  new_tokens=(--max-new-tokens 4)
  test_device=cpu
  step_timeout=${STEP_TIMEOUT:-120}
  train_minutes=${TRAIN_MINUTES:-0.0005} # stops after a step or a few: the rehearsal checks resuming
  train_tokens=${TRAIN_TOKENS:-16k}
  train_batch=${TRAIN_BATCH:-2}
  train_extra=(--precision fp32 --warmup-tokens 128 --eval-sequences 1 --eval-tokens 32 --draft-vocab 64 --layers 0)
  eagle_device=(--device cpu --dtype float32) # train-eagle3 has no --steps
  eagle_tokens=${EAGLE_TOKENS:-2k}
  eagle_train_tokens=${EAGLE_TRAIN_TOKENS:-4k}
  eagle_extra=(--precision fp32 --draft-vocab 64 --eval-sequences 1 --warmup-tokens 128 --eval-every 10
    --checkpoint-every 10)
elif [ -n "$smoke" ]; then
  echo "unknown flag $smoke (only --smoke)" >&2
  exit 2
else
  device=(--device cuda --dtype bfloat16 --steps compiled)
  limit=()
  [ -n "${BENCH_LIMIT:-}" ] && limit=(--limit "$BENCH_LIMIT")
  # more bench flags, word-split: BENCH_EXTRA="--hf-gammas= --prompt-lookup 0" keeps two HF rows of six
  read -r -a bench_extra <<<"${BENCH_EXTRA:-}"
  limit+=("${bench_extra[@]}")
  new_tokens=()
  test_device=cuda
  # each step's share of the session's 30 device minutes (docs/gpu.md); a rerun can give more
  case $step in
  tests | eval) step_timeout=${STEP_TIMEOUT:-300} ;;
  bench) step_timeout=${STEP_TIMEOUT:-480} ;;
  *) step_timeout=${STEP_TIMEOUT:-540} ;;
  esac
  train_minutes=${TRAIN_MINUTES:-6}
  train_tokens=${TRAIN_TOKENS:-100M}
  train_batch=${TRAIN_BATCH:-32}
  # the shipped draft's recipe (decoder/weights/gemma3-270m-code/README.md), at a GPU's batch and budget,
  # going on from the shipped draft itself (TRAIN_INIT=derived starts from the target's layers instead)
  train_extra=(--init "${TRAIN_INIT:-draft:decoder/weights/gemma3-270m-code}" --precision bf16 --warmup-tokens 2M
    --eval-sequences 2 --eval-tokens 256)
  eagle_device=(--device cuda --dtype bfloat16)
  eagle_tokens=${EAGLE_TOKENS:-4M}
  eagle_train_tokens=${EAGLE_TRAIN_TOKENS:-100M}
  # on from the shipped EAGLE-3 draft where one ships (TRAIN_INIT overrides; TRAIN_INIT=fresh: a new draft)
  eagle_init=${TRAIN_INIT:-}
  [ -z "$eagle_init" ] && [ -f decoder/weights/gemma3-270m-eagle3/config.json ] &&
    eagle_init=draft:decoder/weights/gemma3-270m-eagle3
  eagle_extra=(--precision bf16)
  [ -n "$eagle_init" ] && [ "$eagle_init" != fresh ] && eagle_extra+=(--init "$eagle_init")
fi

# Where and when, beside every step's results: the tables are committed with their device and date.
# (Not from torch: importing it costs seconds, and each step's own command imports it anyway.)
gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | head -n 1)
"$PYTHON" - "$OUT/$step-device.json" "$gpu" <<'EOF'
import json, platform, sys, time
from importlib.metadata import version
info = {"date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "python": platform.python_version(),
        "torch": version("torch"), "transformers": version("transformers"), "gpu": sys.argv[2] or None}
json.dump(info, open(sys.argv[1], "w"), indent=1)
EOF

find_corpus() { # sets corpus and dev (train, train-eagle3), or exits
  # the corpus pack (gpu/unpack.sh: $GPU_ROOT/corpus, one `specdec corpus` folder), or train/ and dev/ in it
  corpus=${SPECDEC_CORPUS:-$GPU_ROOT/corpus}
  [ -f "$corpus/manifest.json" ] || corpus=$corpus/train
  [ -f "$corpus/manifest.json" ] || {
    echo "no training corpus in ${SPECDEC_CORPUS:-$GPU_ROOT/corpus}: the pack holds one only when" \
      "specdec gpu-pack was given --splits (.carry/PLAN.md says 'Corpus: ...')" >&2
    exit 2
  }
  dev=()
  [ -f "$(dirname "$corpus")/dev/manifest.json" ] && dev=(--dev "$(dirname "$corpus")/dev")
}

run_logged() { # run_logged LOG CMD...: the command under the step's timeout, its output in LOG and on stdout
  # (stop_signal INT for pytest: interrupted, it still writes its summary and its junit file)
  local log=$1
  shift
  timeout --signal="${stop_signal:-TERM}" --kill-after=20 "$step_timeout" "$@" 2>&1 | tee "$log"
  return "${PIPESTATUS[0]}"
}

case $step in
tests)
  # The decoder tests on the device (tests/conftest.py: SPECDEC_TEST_DEVICE): greedy identity of eager,
  # fixed and compiled steps, the sampling test, no recompiles. Not -x: one failure must not hide the rest.
  # The compiled steps and the engine first: the second session's 200 s ran the first 85 tests of
  # the other order (all passed) and stopped inside test_target_steps.py (docs/gpu.md).
  selected=(tests/decoder/test_target_steps.py tests/decoder/test_engine.py
    tests/decoder/test_greedy_identity.py tests/decoder/test_sampling_lossless.py)
  [ "$smoke" = --smoke ] && selected=(tests/decoder/test_target_steps.py -k "row_buckets or fixed_cache_refuses")
  # -v and --durations: a run cut by its cap still says which tests passed and what took the time
  stop_signal=INT SPECDEC_TEST_DEVICE=$test_device run_logged "$OUT/tests.log" "$PYTHON" -m pytest -v --maxfail=10 \
    --durations=15 -p no:cacheprovider --junitxml="$OUT/tests.xml" "${selected[@]}"
  rc=$?
  "$PYTHON" - "$OUT/tests.xml" "$OUT/tests.json" "$rc" <<'EOF'
import json, sys, xml.etree.ElementTree as ET
rows = {"exit": int(sys.argv[3])}
try:
    suite = ET.parse(sys.argv[1]).getroot().find("testsuite")
    rows |= {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    rows["failed"] = [f"{c.get('classname')}::{c.get('name')}" for c in suite.iter("testcase")
                      if c.find("failure") is not None or c.find("error") is not None]
except (OSError, ET.ParseError) as e:  # killed by the timeout before pytest wrote it
    rows["junit"] = str(e)
json.dump(rows, open(sys.argv[2], "w"), indent=1)
print(json.dumps(rows))
EOF
  exit "$rc"
  ;;
bench | bench-trained | bench-eagle3)
  if [ "$step" = bench ]; then
    # our AR and spec, HF greedy and HF assisted, and the bandwidth bound, in one run; and the lookup
    # alone: the self draft runs the target's layers for every draft, which on a GPU costs an AR step
    # (docs/gpu.md, the second session), so `ngram` may be the CUDA default's better draft
    drafts=(--compare-drafts ngram)
  elif [ "$step" = bench-eagle3 ]; then
    [ -f "$eagle_dir/config.json" ] || {
      echo "no EAGLE-3 draft in $eagle_dir: run the train-eagle3 step first, on this warm machine" >&2
      exit 2
    }
    # the EAGLE-3 draft behind the lookup, against the product default and the EAGLE-3 draft alone
    drafts=(--draft "ngram+$eagle_dir" --compare-drafts "ngram+self,$eagle_dir" --no-hf)
  else
    [ -f "$draft_dir/draft.json" ] || {
      echo "no trained draft in $draft_dir: run the train step first, on this warm machine" >&2
      exit 2
    }
    # the new draft behind the lookup, against the product default and the shipped trained draft
    drafts=(--draft "ngram+$draft_dir" --compare-drafts ngram+self,ngram+auto --no-hf)
  fi
  run_logged "$OUT/$step.log" "$PYTHON" -m speccomplete bench --cases "$cases" --target "$SPECDEC_TARGET" \
    "${device[@]}" "${limit[@]}" "${new_tokens[@]}" "${drafts[@]}" --json "$OUT/$step.json"
  exit $? # bench wrote STEP.json and, beside it, STEP.txt
  ;;
eval)
  run_logged "$OUT/eval.txt" "$PYTHON" -m speccomplete eval "$cases" --target "$SPECDEC_TARGET" "${device[@]}" \
    --telemetry "$OUT/eval-events.jsonl" $([ "$smoke" = --smoke ] && echo --max-tokens-single-line 4 --max-tokens-multi-line 4)
  rc=$?
  "$PYTHON" - "$OUT/eval-events.jsonl" "$OUT/eval.json" <<'EOF'
import json, sys
from pathlib import Path
from speccomplete.metrics import percentile  # a leaf: the events are plain JSON lines (telemetry/events.py)
path = Path(sys.argv[1])
events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
single = [e["latency_ms"] for e in events if not e["multiline"]]
multi = [e["latency_ms"] for e in events if e["multiline"]]
rows = {"events": len(events), "device": events[0].get("device") if events else None,
        "single_line": {"n": len(single), "p50_ms": percentile(single, 50), "p95_ms": percentile(single, 95)},
        "multi_line": {"n": len(multi), "p50_ms": percentile(multi, 50), "p95_ms": percentile(multi, 95)}}
json.dump(rows, open(sys.argv[2], "w"), indent=1)
print(json.dumps(rows))
EOF
  exit "$rc"
  ;;
train)
  find_corpus
  run_logged "$OUT/train.log" "$PYTHON" -m speccomplete finetune --data "$corpus" "${dev[@]}" --out "$draft_dir" \
    --target "$SPECDEC_TARGET" "${device[@]}" --objective kd --lr 5e-4 --tokens "$train_tokens" \
    --batch-size "$train_batch" --checkpoint-every 200 --eval-every 100000000 --max-minutes "$train_minutes" \
    "${train_extra[@]}"
  rc=$?
  # The draft comes back through $OUT in files of at most 15 MiB (the tool returns 16 MiB a file).
  mkdir -p "$OUT/draft"
  for f in draft.json README.md; do [ -f "$draft_dir/$f" ] && cp "$draft_dir/$f" "$OUT/draft/"; done
  [ -f "$draft_dir/model.safetensors" ] &&
    split -b 15M -d -a 2 "$draft_dir/model.safetensors" "$OUT/draft/model.safetensors.part-"
  "$PYTHON" - "$draft_dir" "$OUT" "$rc" <<'EOF'
import hashlib, json, sys
from pathlib import Path
draft, out, rc = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
log = draft / "train_log.jsonl"
records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
steps = [r for r in records if "loss" in r]
evals = [r for r in records if "dev" in r]
state = draft / "checkpoint" / "state.json"
state = json.loads(state.read_text()) if state.exists() else {}
weights = draft / "model.safetensors"
rows = {
    "exit": rc,
    "tokens": state.get("tokens"), "steps": state.get("step"), "complete": state.get("complete"),
    # tokens_per_s counts from the start of this call's loop (train.py), so the last step's is this call's rate
    "tokens_per_s": steps[-1]["tokens_per_s"] if steps else None,
    "last_loss": steps[-1]["loss"] if steps else None,
    "dev_first": evals[0]["dev"].get("all") if evals else None,
    "dev_last": evals[-1]["dev"].get("all") if evals else None,
    "model_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.exists() else None,
    "parts": sorted(p.name for p in (out / "draft").glob("model.safetensors.part-*")),
    "join": "cat model.safetensors.part-* > model.safetensors",
}
json.dump(rows, open(out / "train.json", "w"), indent=1)  # no train.txt: $OUT holds 8 files, the draft needs 4
print("\n".join(f"{k:>13}: {v}" for k, v in rows.items()))
EOF
  exit "$rc"
  ;;
train-eagle3)
  find_corpus
  # Features first (the target teacher-forced over --tokens of the corpus, cached in $eagle_features and
  # kept by a rerun), then training-time test on them until --max-minutes; the same call again resumes.
  run_logged "$OUT/train-eagle3.log" "$PYTHON" -m speccomplete train-eagle3 --data "$corpus" "${dev[@]}" \
    --out "$eagle_dir" --features "$eagle_features" --target "$SPECDEC_TARGET" "${eagle_device[@]}" \
    --tokens "$eagle_tokens" --train-tokens "$eagle_train_tokens" --batch-size "$train_batch" --lr 1e-3 \
    --max-minutes "$train_minutes" --with-head "${eagle_extra[@]}"
  rc=$?
  # The draft comes back through $OUT in files of at most 15 MiB, as train's. With --with-head, Gemma 3
  # 270M's is ~58 MB: 4 parts, config.json, README.md, the log and the summary make the tool's 8 files,
  # so the device facts go into the summary rather than a file of their own.
  mkdir -p "$OUT/draft"
  for f in config.json README.md; do [ -f "$eagle_dir/$f" ] && cp "$eagle_dir/$f" "$OUT/draft/"; done
  [ -f "$eagle_dir/model.safetensors" ] &&
    split -b 15M -d -a 2 "$eagle_dir/model.safetensors" "$OUT/draft/model.safetensors.part-"
  # tqdm's bars can make a long log: its last 4 MiB are enough to read what happened
  log_bytes=$(wc -c <"$OUT/train-eagle3.log")
  if [ "$log_bytes" -gt $((4 * 1024 * 1024)) ]; then
    tail -c $((4 * 1024 * 1024)) "$OUT/train-eagle3.log" >"$OUT/train-eagle3.log.tail"
    mv "$OUT/train-eagle3.log.tail" "$OUT/train-eagle3.log"
  fi
  "$PYTHON" - "$eagle_dir" "$eagle_features" "$OUT" "$rc" <<'EOF'
import hashlib, json, sys
from pathlib import Path
draft, features, out, rc = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
def read(path):
    return json.loads(path.read_text()) if path.exists() else {}
# decoder/training/eagle3.py: train_log.jsonl holds a record per optimizer step (loss, top1_s, acceptance_s,
# tokens_per_s) and one per dev eval ("dev": per language and "all", top1_s and acceptance_s per TTT step)
log = draft / "train_log.jsonl"
records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
steps = [r for r in records if "loss" in r]
evals = [r for r in records if "dev" in r]
state = read(draft / "checkpoint" / "state.json")
weights = draft / "model.safetensors"
def per_step(row, key):  # [row[key_0], row[key_1], ...]: one value per TTT step
    n = sum(1 for k in row if k.startswith(key + "_"))
    return [row[f"{key}_{s}"] for s in range(n)] if row else None
last = evals[-1]["dev"].get("all", {}) if evals else {}
first = evals[0]["dev"].get("all", {}) if evals else {}
device = out / "train-eagle3-device.json"
rows = {
    "exit": rc,
    "tokens": state.get("tokens"), "steps": state.get("step"), "complete": state.get("complete"),
    # tokens_per_s counts from the start of this call's loop, so the last step's is this call's rate
    "tokens_per_s": steps[-1]["tokens_per_s"] if steps else None,
    "last_loss": steps[-1]["loss"] if steps else None,
    "train_top1": per_step(steps[-1], "top1") if steps else None,  # the last batch's, per TTT step
    "features_tokens": read(features / "manifest.json").get("tokens"),
    # the last dev eval (a run stopped by --max-minutes evaluates every --eval-every steps, not at its end)
    "dev_eval_step": evals[-1]["step"] if evals else None,
    "dev_top1": per_step(last, "top1") if last else None,
    "dev_acceptance": per_step(last, "acceptance") if last else None,
    "dev_expected_acceptance": last.get("expected_acceptance"),
    "dev_first_top1": per_step(first, "top1") if first else None,  # the untrained (or --init) baseline
    "dev_last": evals[-1]["dev"] if evals else None,
    "model_sha256": hashlib.sha256(weights.read_bytes()).hexdigest() if weights.exists() else None,
    "parts": sorted(p.name for p in (out / "draft").glob("model.safetensors.part-*")),
    "join": "cat model.safetensors.part-* > model.safetensors",
    "device": read(device),
}
device.unlink(missing_ok=True)
json.dump(rows, open(out / "train-eagle3.json", "w"), indent=1)
print("\n".join(f"{k:>23}: {v}" for k, v in rows.items() if k != "dev_last"))
EOF
  exit "$rc"
  ;;
*)
  echo "unknown step $step: tests | bench | eval | train | bench-trained | train-eagle3 | bench-eagle3" >&2
  exit 2
  ;;
esac
