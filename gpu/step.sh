#!/usr/bin/env bash
# One step of the GPU programme (docs/gpu.md), run on the device machine after gpu/unpack.sh:
#
#   bash gpu/step.sh STEP [--smoke]
#     STEP, in the runbook's order: train | cuda | bench-trained | bench | tests | eval | train-derived | bench-derived
#
# train trains the EAGLE-3 draft online (the target runs beside the draft, no feature files), the main
# reason a GPU is lent; bench-trained times it. cuda is the call after it, at most 3 minutes: the CUDA
# decoder tests, the bench (the trained draft among its rows when train ran on this machine) and the
# eval, in that order, each part under its own cap, so a capped part leaves the earlier parts' JSON.
# train-derived and bench-derived do the same for the derived-layer draft (`specdec finetune`).
#
# Each step sources $GPU_ROOT/env.sh (PYTHONPATH to the staged site, SPECDEC_TARGET to the converted
# target) and runs one command under its own `timeout`, so that it ends inside the device tool's
# 10 minutes. The command writes its own results under $OUT, the machine's facts inside its summary
# (harness/lib/facts.py): train.json or train-derived.json, after which the step puts the draft in draft/, its
# weights in parts of 15 MiB (tools/gpu/returns.py); bench.json and bench.txt (bench-trained.*, bench-derived.*);
# tests.json and tests.xml; eval.json, eval-events.jsonl. Its output goes to STEP.log (eval: eval.txt).
# The tool returns at most 8 files, of 16 MiB each: train's are its log, its summary, the draft's
# config.json, README.md and its weights without the head (the target's rows, rebuilt on load), ~15 MB in
# 1-2 parts. cuda's are its parts' JSON and one log for all three (cuda.log): cuda.json (each part's exit
# status, seconds and cap), tests.json, tests.xml, bench.json, bench.txt, eval.json, eval-events.jsonl.
# --smoke runs the same commands on the CPU with tiny budgets (the rehearsal in
# tests/harness/test_gpu_steps.py: a tiny target in SPECDEC_TARGET, two cases, a few tokens).
#
# Knobs, for a rerun after a timeout (docs/gpu.md says when):
#   STEP_TIMEOUT   seconds; default train 570 (with the 20 s to kill, inside the call's 600), train-derived,
#                  bench-trained and bench-derived 540, bench 480, tests and eval 300
#   CUDA_CAPS      cuda: the parts' caps in seconds, "TESTS BENCH EVAL" (default "40 80 45": 165 s, and
#                  5 s each to kill, inside 3 minutes)
#   CUDA_DRAFTS    cuda: the drafts benched beside the product's (default ngram,ngram+self,ngram+eagle3)
#   BENCH_LIMIT    the first N cases (default all; cuda 14); BENCH_EXTRA: more bench flags, word-split
#   TARGET_STEPS   how the target runs on CUDA (--steps): auto (default: recorded graphs, or compiled for a
#                  family they do not run), graphs, compiled
#   TRAIN_MINUTES  training time, loading and saving not counted: train 8, train-derived 6
#   TRAIN_TOKENS   the schedule's tokens: train 2000M, train-derived 100M (--max-minutes stops first)
#   TRAIN_BATCH    sequences of 512 a step: train 64, train-derived 32
#   TRAIN_INIT     train: draft:decoder/weights/gemma3-270m-eagle3, the shipped EAGLE-3 draft (fresh: a new one);
#                  train-derived: draft:decoder/weights/gemma3-270m-code, the shipped draft (derived: the
#                  target's layers)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1 # the repo root: docs/examples/cases.jsonl, tests/

steps="train|cuda|bench-trained|bench|tests|eval|train-derived|bench-derived"
step=${1:?usage: gpu/step.sh $steps [--smoke]}
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
# the training steps' --out: a second call resumes from the checkpoint there while the machine is warm
eagle_dir=$GPU_ROOT/train/draft
derived_dir=$GPU_ROOT/train-derived/draft
if [ "$smoke" = --smoke ]; then
  device=(--device cpu --dtype float32 --steps eager)
  # two cases (eval has no --limit): one single-line, one multi-line (docs/examples/cases.jsonl)
  head -n 2 "$cases" >"$GPU_ROOT/smoke-cases.jsonl"
  cases=$GPU_ROOT/smoke-cases.jsonl
  bench_extra=(--max-new-tokens 4)
  eval_extra=(--max-tokens-single-line 4 --max-tokens-multi-line 4)
  test_device=cpu
  step_timeout=${STEP_TIMEOUT:-120}
  read -r -a cuda_caps <<<"${CUDA_CAPS:-120 120 120}"
  cuda_drafts=${CUDA_DRAFTS:-ngram} # the tiny target has no shipped draft
  # the cuda step's tests: a few that need no GPU, from both files
  cuda_tests=(tests/decoder/test_target_steps.py tests/decoder/test_graph_target.py
    -k "row_buckets or span_buckets or fixed_cache_refuses")
  # stops after a step or a few: the rehearsal checks resuming
  train_minutes=${TRAIN_MINUTES:-0.0005}
  derived_minutes=$train_minutes
  train_device=(--device cpu --dtype float32) # the training commands have no --steps
  # the tiny target has no shipped draft: a fresh one unless TRAIN_INIT says otherwise
  train_init=${TRAIN_INIT:-fresh}
  train_extra=(--train-tokens "${TRAIN_TOKENS:-4k}" --batch-size "${TRAIN_BATCH:-2}" --draft-vocab 64
    --eval-sequences 1 --warmup-tokens 128 --eval-every 10 --checkpoint-every 10)
  derived_extra=(--init "${TRAIN_INIT:-derived}" --tokens "${TRAIN_TOKENS:-16k}" --batch-size "${TRAIN_BATCH:-2}"
    --precision fp32 --warmup-tokens 128 --eval-sequences 1 --eval-tokens 32 --draft-vocab 64 --layers 0)
elif [ -n "$smoke" ]; then
  echo "unknown flag $smoke (only --smoke)" >&2
  exit 2
else
  device=(--device cuda --dtype bfloat16 --steps "${TARGET_STEPS:-auto}")
  bench_extra=()
  [ -n "${BENCH_LIMIT:-}" ] && bench_extra=(--limit "$BENCH_LIMIT")
  # BENCH_EXTRA="--hf-gammas= --prompt-lookup 0" keeps two HF rows of six
  read -r -a more <<<"${BENCH_EXTRA:-}"
  bench_extra+=("${more[@]}")
  eval_extra=()
  test_device=cuda
  read -r -a cuda_caps <<<"${CUDA_CAPS:-40 80 45}"
  cuda_drafts=${CUDA_DRAFTS:-ngram,ngram+self,ngram+eagle3}
  # the recorded graphs first (graph_target.py, the EAGLE-3 chain), then the fixed steps; torch.compile's
  # tests are left out: compiling takes longer than the part's cap
  cuda_tests=(tests/decoder/test_graph_target.py tests/decoder/drafts/test_eagle3_chain.py
    tests/decoder/test_target_steps.py -k "not compiled")
  # each step's share of the session's device minutes (docs/gpu.md); a rerun can give more
  case $step in
  tests | eval) step_timeout=${STEP_TIMEOUT:-300} ;;
  bench) step_timeout=${STEP_TIMEOUT:-480} ;;
  train) step_timeout=${STEP_TIMEOUT:-570} ;;
  *) step_timeout=${STEP_TIMEOUT:-540} ;;
  esac
  train_minutes=${TRAIN_MINUTES:-8}
  derived_minutes=${TRAIN_MINUTES:-6}
  train_device=(--device cuda --dtype bfloat16)
  train_init=${TRAIN_INIT:-draft:decoder/weights/gemma3-270m-eagle3}
  # --log-every 20: each read of the losses waits for the GPU. Dev fitness before and after only, and a
  # checkpoint every 500 steps: evaluations and checkpoints are device time the draft does not learn in.
  train_extra=(--train-tokens "${TRAIN_TOKENS:-2000M}" --batch-size "${TRAIN_BATCH:-64}" --log-every 20
    --eval-every 1000000000 --checkpoint-every 500)
  # the shipped draft's recipe (decoder/weights/gemma3-270m-code/README.md), at a GPU's batch and budget
  derived_extra=(--init "${TRAIN_INIT:-draft:decoder/weights/gemma3-270m-code}" --tokens "${TRAIN_TOKENS:-100M}"
    --batch-size "${TRAIN_BATCH:-32}" --precision bf16 --warmup-tokens 2M --eval-sequences 2 --eval-tokens 256
    --log-every 20)
fi
[ "$train_init" != fresh ] && train_extra+=(--init "$train_init")

find_corpus() { # sets corpus and dev (the training steps), or exits
  # the corpus pack (gpu/unpack.sh: $GPU_ROOT/corpus, one `specdec corpus` folder), or train/ and dev/ in it
  corpus=${SPECDEC_CORPUS:-$GPU_ROOT/corpus}
  [ -f "$corpus/manifest.json" ] || corpus=$corpus/train
  [ -f "$corpus/manifest.json" ] || {
    echo "no training corpus in ${SPECDEC_CORPUS:-$GPU_ROOT/corpus}: the pack holds one only when" \
      "python -m tools.gpu.pack was given --splits (.carry/PLAN.md says 'Corpus: ...')" >&2
    exit 2
  }
  dev=()
  [ -f "$(dirname "$corpus")/dev/manifest.json" ] && dev=(--dev "$(dirname "$corpus")/dev")
}

need_draft() { # need_draft FILE: the bench of a trained draft needs the train step's output on this machine
  [ -f "$1" ] || {
    echo "no trained draft at $1: run the step that trains it first, on this warm machine" >&2
    exit 2
  }
}

one_log= # the cuda step: every part's output in this one log
run_logged() { # run_logged LOG CMD...: the command under the step's timeout, its output in LOG (appended;
  # the cuda step's one log instead) and on stdout (stop_signal INT for pytest: interrupted, it still
  # writes its summary and its junit file)
  local log=${one_log:-$1}
  shift
  timeout --signal="${stop_signal:-TERM}" --kill-after="${kill_after:-20}" "$step_timeout" "$@" 2>&1 | tee -a "$log"
  return "${PIPESTATUS[0]}"
}

return_draft() { # return_draft FOLDER SMALL-FILE...: a trained draft as the tool brings it back, in $OUT/draft:
  # its small files, and its weights in parts of 15 MiB (the tool returns 16 MiB a file at most), which
  # tools/ratchet.py joins and checks against the summary's model_sha256
  local folder=$1 name
  shift
  mkdir -p "$OUT/draft"
  for name in "$@"; do
    if [ -f "$folder/$name" ]; then cp "$folder/$name" "$OUT/draft/"; fi
  done
  # by its path: PYTHONSAFEPATH keeps the repo root (and `python -m tools...`) off the path; standard library only
  "$PYTHON" tools/gpu/returns.py split "$folder/model.safetensors" "$OUT/draft"
}

run_bench() { # run_bench NAME FLAGS...: the bench of the cases on the target, into $OUT/NAME.json and .txt
  local name=$1
  shift
  run_logged "$OUT/$name.log" "$PYTHON" -m speccomplete bench --cases "$cases" --target "$SPECDEC_TARGET" \
    "${device[@]}" "${bench_extra[@]}" "$@" --json "$OUT/$name.json"
}

run_tests() { # run_tests PYTEST-ARGS...: the decoder tests on the device, into $OUT/tests.json and tests.xml
  # A test file not in this checkout is left out: pytest stops on a path it cannot find.
  local args=() arg
  for arg in "$@"; do
    [[ $arg == tests/*.py && ! -f $arg ]] && continue
    args+=("$arg")
  done
  # -v and --durations: a run cut by its cap still says which tests passed and what took the time;
  # --summary-json (tests/conftest.py) is written at the end, the cap's SIGINT included
  stop_signal=INT SPECDEC_TEST_DEVICE=$test_device run_logged "$OUT/tests.log" "$PYTHON" -m pytest -v --maxfail=10 \
    --durations=15 -p no:cacheprovider --junitxml="$OUT/tests.xml" --summary-json="$OUT/tests.json" "${args[@]}"
}

run_eval() { # run_eval: the cases through the language server, into $OUT/eval.json and eval-events.jsonl
  run_logged "$OUT/eval.txt" "$PYTHON" -m speccomplete eval "$cases" --target "$SPECDEC_TARGET" "${device[@]}" \
    "${eval_extra[@]}" --telemetry "$OUT/eval-events.jsonl" --summary "$OUT/eval.json"
}

cuda_parts=() # the cuda step's parts so far, as JSON members
cuda_part() { # cuda_part NAME CAP CMD...: one part of the cuda step under CAP seconds, noted in cuda.json
  local name=$1 cap=$2 start=$SECONDS status=0
  shift 2
  echo "== cuda step: $name (cap ${cap} s)" | tee -a "$one_log"
  step_timeout=$cap kill_after=5 "$@" || status=$?
  local seconds=$((SECONDS - start)) capped=false
  [ "$status" = 124 ] || [ "$status" = 137 ] && capped=true
  echo "== cuda step: $name exit $status in ${seconds} s (capped: $capped)" | tee -a "$one_log"
  cuda_parts+=("\"$name\": {\"exit\": $status, \"seconds\": $seconds, \"cap_s\": $cap, \"capped\": $capped}")
  local IFS=,
  printf '{"parts": {%s}}\n' "${cuda_parts[*]}" >"$OUT/cuda.json"
  [ "$cuda_status" = 0 ] && cuda_status=$status
  return 0
}

case $step in
train)
  find_corpus
  # The target runs beside the draft (no feature files), until --max-minutes; the same call again resumes.
  run_logged "$OUT/train.log" "$PYTHON" -m speccomplete train-eagle3 --online --data "$corpus" "${dev[@]}" \
    --out "$eagle_dir" --target "$SPECDEC_TARGET" "${train_device[@]}" "${train_extra[@]}" --lr 1e-3 \
    --max-minutes "$train_minutes" --summary "$OUT/train.json" &&
    return_draft "$eagle_dir" config.json README.md
  ;;
cuda)
  # One call after train, at most 3 minutes (docs/gpu.md): the tests, the bench, the eval, each under
  # its own cap (CUDA_CAPS), so that a capped part leaves the earlier parts' JSON; the bench writes its
  # tables after every case, so a capped bench leaves the cases it finished. Exits with the first
  # failing part's status, after running all three.
  one_log=$OUT/cuda.log
  cuda_status=0
  # the recorded graphs' tests and the fixed and compiled steps', greedy identity of every captured size
  cuda_part tests "${cuda_caps[0]}" run_tests "${cuda_tests[@]}"
  # 14 cases or more, 64 tokens, greedy: our AR and speculation with each draft (the trained one too when
  # train ran on this machine), HF greedy and HF assisted with its default schedule
  drafts=$cuda_drafts
  [ -f "$eagle_dir/config.json" ] && drafts+=",ngram+$eagle_dir"
  cuda_part bench "${cuda_caps[1]}" run_bench bench --limit "${BENCH_LIMIT:-14}" --compare-drafts "$drafts" \
    --hf-gammas= --prompt-lookup 0
  # latency p50 and p95, single-line and multi-line, and ready_s, through the language server
  cuda_part eval "${cuda_caps[2]}" run_eval
  exit "$cuda_status"
  ;;
bench-trained)
  need_draft "$eagle_dir/config.json"
  # the EAGLE-3 draft behind the lookup, against the product default, the draft alone and the lookup alone
  run_bench "$step" --draft "ngram+$eagle_dir" --compare-drafts "ngram+self,$eagle_dir,ngram" --no-hf
  ;;
bench)
  # our AR and spec, HF greedy and HF assisted, and the bandwidth bound, in one run; and the lookup
  # alone: the self draft runs the target's layers for every draft, which on a GPU costs an AR step
  # (docs/gpu.md, the second session), so `ngram` may be the CUDA default's better draft
  run_bench "$step" --compare-drafts ngram
  ;;
tests)
  # The decoder tests on the device (SPECDEC_TEST_DEVICE, tests/helpers/tiny_models.py): greedy identity of eager,
  # fixed, compiled and recorded steps, the sampling test, no recompiles. Not -x: one failure must not
  # hide the rest. The target's steps and the engine first: the second session's 200 s ran the first 85
  # tests of the other order (all passed) and stopped inside test_target_steps.py (docs/gpu.md).
  selected=(tests/decoder/test_graph_target.py tests/decoder/test_target_steps.py tests/decoder/test_engine.py
    tests/decoder/test_greedy_identity.py tests/decoder/test_sampling_lossless.py)
  [ "$smoke" = --smoke ] && selected=(tests/decoder/test_target_steps.py -k "row_buckets or fixed_cache_refuses")
  run_tests "${selected[@]}"
  ;;
eval)
  run_eval
  ;;
train-derived)
  find_corpus
  run_logged "$OUT/train-derived.log" "$PYTHON" -m speccomplete finetune --data "$corpus" "${dev[@]}" \
    --out "$derived_dir" --target "$SPECDEC_TARGET" "${device[@]}" "${derived_extra[@]}" --objective kd \
    --lr 5e-4 --checkpoint-every 200 --eval-every 100000000 --max-minutes "$derived_minutes" \
    --summary "$OUT/train-derived.json" &&
    return_draft "$derived_dir" draft.json README.md
  ;;
bench-derived)
  need_draft "$derived_dir/draft.json"
  # the derived-layer draft behind the lookup, against the product default and the shipped trained draft
  run_bench "$step" --draft "ngram+$derived_dir" --compare-drafts ngram+self,ngram+auto --no-hf
  ;;
*)
  echo "unknown step $step: $steps" >&2
  exit 2
  ;;
esac
