#!/usr/bin/env bash
# Unpack one load of the GPU carry (`python -m tools.gpu.pack`, tools/gpu/pack.py; docs/gpu.md).
#
#   bash gpu/unpack.sh LOAD      LOAD: a load folder (.carry/load-1) or its name (load-1, under .carry/)
#
# Runs on the GPU machine, one call per load in the plan's order, and on the CPU for the rehearsal.
# Everything lands under $GPU_ROOT (default /tmp/gpu):
#   site/            the load's wheels (pip --target)
#   pkg/speccomplete our package, as links into this copy of the repo (pyproject.toml's package-dir)
#   gguf/            the model's pieces; once all are there: checked, joined, checked whole
#   models/<name>    the converted safetensors folder: written from the GGUF and the carried model-meta.tar.xz
#                    (decoder/gguf_safetensors.py, seconds), else by transformers (decoder/models.py, convert_gguf)
#   cases.jsonl      the dev cases, when the pack has them
#   packed/          the training corpus as packed source text (tools.gpu.pack --splits), gathered from its loads
#   corpus/          its train/ and dev/ shard folders: tokenized on every core (`specdec corpus --packed`) once
#                    packed.json (in the corpus's last load) and the model's tokenizer are here
#   env.sh           what later steps source (from the repo root): PYTHONPATH, PYTHONSAFEPATH,
#                    SPECDEC_TARGET (the model folder), SPECDEC_CACHE (so the packaged alias names it too),
#                    SPECDEC_CASES, SPECDEC_CORPUS when carried, and a `specdec` shell function
# and a report of what it did goes to $OUT/unpack.txt when OUT is set. What needs Python is in tools/gpu/unpack.py,
# run by its path (`unpack_py`): PYTHONSAFEPATH keeps the repo root, and so `python -m tools...`, off the path.
#
# Safe to rerun: a load already unpacked is unpacked again the same way, a model already converted is
# kept. Files live only while the machine is warm: a fresh machine (or a different pack) starts over from
# load-1, and a later load on a machine that has not seen the loads before it fails and says so.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
root=${GPU_ROOT:-/tmp/gpu}
py=${PYTHON:-python3}
# Python puts the current folder first on its path, and the repo root's speccomplete/ lacks the mapped
# subpackages: without this, `import speccomplete.decoder` from the repo root finds no decoder.
export PYTHONSAFEPATH=1
unpack_py() { "$py" "$repo/tools/gpu/unpack.py" "$@"; }
report=${OUT:+$OUT/unpack.txt}
if [ -n "$report" ]; then mkdir -p "$OUT"; fi

say() {
    echo "unpack: $*"
    if [ -n "$report" ]; then echo "$*" >>"$report"; fi
}
fail() {
    say "FAILED: $*"
    echo "unpack: FAILED: $*" >&2
    exit 1
}

# Our package: links from pkg/speccomplete into this copy of the repo, as pyproject.toml maps it. Each call
# brings a fresh copy of the repo, so env.sh redoes this (`--stage`) wherever it is sourced.
stage_package() {
    local pkg=$root/pkg/speccomplete
    rm -rf "$pkg"
    mkdir -p "$pkg"
    for entry in "$repo"/speccomplete/*; do
        [ "$(basename "$entry")" = __pycache__ ] || ln -s "$entry" "$pkg/"
    done
    unpack_py stage-map "$repo/pyproject.toml" | while read -r sub folder; do ln -s "$repo/$folder" "$pkg/$sub"; done
}

usage="usage: bash gpu/unpack.sh LOAD (a load folder, or its name under .carry/) | --stage"
[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
if [ "$1" = --stage ]; then
    stage_package
    exit 0
fi
load=$1
[ -d "$load" ] || load=.carry/$1
[ -f "$load/load.json" ] || fail "$1: not a load of the carry (no load.json); build one with python -m tools.gpu.pack"
load=$(cd "$load" && pwd)
read -r pack number loads name gguf_file < <(unpack_py load-info "$load/load.json")

mkdir -p "$root"
say "load $number of $loads (pack $pack) from $load into $root, $(du -sh "$load" | cut -f1)"

# A different pack, or none yet: start from a clean root. A later load needs every earlier one here.
if [ "$(cat "$root/pack" 2>/dev/null)" != "$pack" ]; then
    rm -rf "$root/site" "$root/pkg" "$root/gguf" "$root/models" "$root/corpus" "$root/packed" "$root/cases.jsonl" \
        "$root/env.sh" "$root/loads.done"
    echo "$pack" >"$root/pack"
fi
for ((earlier = 1; earlier < number; earlier++)); do
    grep -qx "load-$earlier" "$root/loads.done" 2>/dev/null ||
        fail "load-$earlier is not on this machine (a fresh machine?): start over from load-1"
done

# 1. The transfer: every file of the load against its own checksums.
(cd "$load" && sha256sum --quiet -c SHA256SUMS) || fail "checksums of $load do not match: send it again"
say "checksums: $(wc -l <"$load/SHA256SUMS") files OK"

# 2. Wheels into site/.
if compgen -G "$load/whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$root/site" \
        "$load"/whl/*.whl || fail "installing the wheels of $load failed"
    say "wheels: $(find "$load/whl" -name '*.whl' | wc -l) installed into $root/site"
fi

# 3. Our package, linked to this copy of the repo.
stage_package

# 4. The model: this load's pieces into gguf/; with the last piece, check, join, check and convert.
mkdir -p "$root/gguf"
if [ -d "$load/gguf" ]; then
    cp "$load"/gguf/* "$root/gguf/"
    say "gguf: $(find "$load/gguf" -name '*.part-*' | wc -l) pieces of $gguf_file"
fi
if [ -f "$load/model-meta.tar.xz" ]; then
    cp "$load/model-meta.tar.xz" "$root/gguf/"
    say "meta: model-meta.tar.xz, $(stat -c %s "$root/gguf/model-meta.tar.xz") bytes (the model's metadata and tensor map)"
fi
model_dir=$root/models/$name
if [ ! -f "$model_dir/config.json" ] && [ -f "$root/gguf/model.SHA256SUMS" ]; then
    missing=0
    while read -r _ piece; do
        case $piece in *.part-*) [ -f "$root/gguf/$piece" ] || missing=$((missing + 1)) ;; esac
    done <"$root/gguf/model.SHA256SUMS"
    if [ "$missing" -eq 0 ]; then
        (cd "$root/gguf" && grep '\.part-' model.SHA256SUMS | sha256sum --quiet -c) ||
            fail "a piece of $gguf_file is corrupt: start over from load-1"
        grep '\.part-' "$root/gguf/model.SHA256SUMS" | while read -r _ piece; do cat "$root/gguf/$piece"; done \
            >"$root/gguf/$gguf_file"
        (cd "$root/gguf" && grep -v '\.part-' model.SHA256SUMS | sha256sum --quiet -c) ||
            { rm -f "$root/gguf/$gguf_file"; fail "the joined $gguf_file does not match its checksum"; }
        say "gguf: $gguf_file joined, $(stat -c %s "$root/gguf/$gguf_file") bytes, sha256 OK"
        start=$(date +%s.%N)
        how="transformers (no meta carried)"
        if [ -f "$root/gguf/model-meta.tar.xz" ]; then
            how="the carried meta"
            PYTHONPATH="$root/pkg:$root/site${PYTHONPATH:+:$PYTHONPATH}" "$py" -m speccomplete.decoder.gguf_safetensors \
                "$root/gguf/$gguf_file" "$root/gguf/model-meta.tar.xz" "$model_dir" ||
                { how="transformers, after the meta failed"; say "converting with the meta failed: falling back"; }
        fi
        if [ ! -f "$model_dir/config.json" ]; then
            PYTHONPATH="$root/pkg:$root/site${PYTHONPATH:+:$PYTHONPATH}" unpack_py convert \
                "$root/gguf/$gguf_file" "$model_dir" || fail "converting $gguf_file failed"
        fi
        seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        rm -f "$root/gguf"/*.part-*  # kept until now, so a failed conversion can be rerun from this load
        say "converted to $model_dir with $how in $seconds s, $(du -sh "$model_dir" | cut -f1)"
    else
        say "gguf: $missing pieces still to come"
    fi
fi

# 5. Cases and corpus.
if [ -f "$load/cases.jsonl" ]; then
    cp "$load/cases.jsonl" "$root/cases.jsonl"
    say "cases: $(wc -l <"$root/cases.jsonl") into $root/cases.jsonl"
fi
if [ -d "$load/corpus" ]; then
    # the corpus may span loads (tools.gpu.pack --corpus-loads): each brings some of its compressed files
    mkdir -p "$root/packed"
    cp -r "$load"/corpus/. "$root/packed/"
    say "corpus: $(find "$load/corpus" -type f | wc -l) files; $(du -sh "$root/packed" | cut -f1) in $root/packed"
fi
if [ -f "$root/packed/packed.json" ] && [ ! -f "$root/corpus/train/manifest.json" ]; then
    if [ -f "$model_dir/config.json" ]; then
        # into corpus.tmp first: a failed or cut run leaves no corpus that looks whole
        rm -rf "$root/corpus" "$root/corpus.tmp"
        start=$(date +%s.%N)
        PYTHONPATH="$root/pkg:$root/site${PYTHONPATH:+:$PYTHONPATH}" "$py" -m speccomplete corpus \
            --packed "$root/packed" --tokenizer "$model_dir" --out "$root/corpus.tmp" --workers "$(nproc)" \
            >"$root/tokenize.log" 2>&1 || { tail -5 "$root/tokenize.log" >&2; fail "tokenizing the corpus failed"; }
        mv "$root/corpus.tmp" "$root/corpus"
        seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
        say "corpus: tokenized in $seconds s on $(nproc) cores; $(grep '^tokenized' "$root/tokenize.log")"
    else
        say "corpus: packed text is in; it is tokenized once the model (its tokenizer) is"
    fi
fi

# 6. env.sh for the later steps, rewritten after every load with what is here so far.
{
    echo "# written by gpu/unpack.sh (pack $pack); source it from the repo root"
    echo "export GPU_ROOT=$root"
    echo "export PYTHONPATH=$root/pkg:$root/site\${PYTHONPATH:+:\$PYTHONPATH}"
    # the packaged alias resolves to models/<name> too (decoder/packaged.py reads SPECDEC_CACHE)
    echo "export SPECDEC_CACHE=$root"
    echo "export PYTHONSAFEPATH=1  # the repo root's own speccomplete/ must not shadow the staged one"
    if [ -f "$model_dir/config.json" ]; then echo "export SPECDEC_TARGET=$model_dir"; fi
    if [ -f "$root/cases.jsonl" ]; then echo "export SPECDEC_CASES=$root/cases.jsonl"; fi
    if [ -f "$root/corpus/train/manifest.json" ]; then echo "export SPECDEC_CORPUS=$root/corpus"; fi
    echo "specdec() { \"\${PYTHON:-python3}\" -m speccomplete \"\$@\"; }"
    echo "export -f specdec"
    echo "# each call brings a fresh copy of the repo: point the package's links at this one"
    echo "if [ -f gpu/unpack.sh ]; then GPU_ROOT=$root bash gpu/unpack.sh --stage; fi"
} >"$root/env.sh"
grep -qx "load-$number" "$root/loads.done" 2>/dev/null || echo "load-$number" >>"$root/loads.done"
say "env: $root/env.sh"

if [ "$number" -eq "$loads" ]; then
    [ -f "$model_dir/config.json" ] || fail "the last load is in but $model_dir was not converted"
    mapfile -t wheels < <(find "$root/site" -maxdepth 1 -name '*.dist-info' -printf '%f\n' 2>/dev/null | sed 's/-[^-]*\.dist-info$//' | sort)
    # our package, and everything its commands import at load time, from pkg/ with the carried wheels
    facts=$(PYTHONPATH="$root/pkg:$root/site${PYTHONPATH:+:$PYTHONPATH}" unpack_py facts "$root/pkg" \
        ${wheels[@]+"${wheels[@]}"}) ||
        fail "the package does not import with the carried wheels"
    while read -r line; do say "$line"; done <<<"$facts"
    say "done: all $loads loads in; source $root/env.sh"
fi
