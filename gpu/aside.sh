#!/usr/bin/env bash
# Move the shipped weights out of the working tree for the load calls of the GPU programme, and back.
#
#   bash gpu/aside.sh out    # before `python -m tools.gpu.pack` and the load calls
#   bash gpu/aside.sh back   # before the step calls (bench and train read the shipped drafts)
#
# Every device call carries the working tree and its loads, 64 MiB in all. The tracked *.safetensors
# under decoder/weights/ are ~38 MiB of a ~41 MiB tree: with them aside, the target's GGUF and the
# wheels travel in 5 loads instead of 12 (docs/gpu.md). They wait in .git/aside/, which never travels.
set -euo pipefail
cd "$(dirname "$0")/.."
aside=.git/aside
case ${1:-} in
out)
  git ls-files 'decoder/weights/*.safetensors' | while read -r f; do
    [ -f "$f" ] || continue
    mkdir -p "$aside/$(dirname "$f")"
    mv "$f" "$aside/$f"
    echo "aside: $f"
  done
  ;;
back)
  [ -d "$aside" ] || { echo "aside: nothing aside"; exit 0; }
  (cd "$aside" && find . -type f) | while read -r f; do
    f=${f#./}
    mv "$aside/$f" "$f"
    echo "back: $f"
  done
  rm -rf "$aside"
  git diff --quiet -- decoder/weights || { echo "aside: decoder/weights differs from HEAD" >&2; exit 1; }
  ;;
*)
  echo "usage: bash gpu/aside.sh out|back" >&2
  exit 2
  ;;
esac
