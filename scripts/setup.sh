#!/usr/bin/env bash
# Sets up libtorch for orchestrate and prints the environment the build needs.
#
#   scripts/setup.sh            install (or reuse) the shared torch venv, write .setup/env.sh
#
# Where libtorch comes from, in order:
#   1. $LIBTORCH, if the user set it (an unpacked libtorch folder): used as is.
#   2. A venv holding torch==$TORCH_VERSION in a per-user cache folder named after the
#      torch version, shared by every clone (CI's included):
#        ${ORCHESTRATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orchestrate}/torch-$TORCH_VERSION/venv
#      A custom index (e.g. CPU-only wheels) is honoured through ORCHESTRATE_TORCH_INDEX_URL
#      or pip's own PIP_INDEX_URL / PIP_EXTRA_INDEX_URL.
#
# The build links tch through LIBTORCH_USE_PYTORCH=1 (or LIBTORCH) and build.rs bakes
# an rpath to torch/lib into every binary, so nothing needs exporting at run time.
set -euo pipefail

TORCH_VERSION="${ORCHESTRATE_TORCH_VERSION:-2.11.0}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cache_root="${ORCHESTRATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orchestrate}"
torch_dir="$cache_root/torch-$TORCH_VERSION"
venv="$torch_dir/venv"
env_file="$here/.setup/env.sh"

log() { printf 'setup: %s\n' "$*" >&2; }

ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1; then
    if [ -x "$HOME/.cargo/bin/cargo" ]; then
      export PATH="$HOME/.cargo/bin:$PATH"
    else
      log "cargo not found: install Rust (https://rustup.rs) and re-run"
      exit 2
    fi
  fi
}

install_venv() {
  local python="${ORCHESTRATE_PYTHON:-python3}"
  # numpy: torch warns without it. transformers and safetensors are only an
  # independent reference for tests (logit parity, the PyTorch benchmarks);
  # tensorboard reads back the event files `export tensorboard` writes;
  # pyarrow writes the Parquet files `dataset.import` is tested on, as
  # Hugging Face datasets write them; model-signing (OpenSSF) verifies the
  # packs `pack sign` signs, and imports pyOpenSSL without declaring it.
  local requirements="torch==$TORCH_VERSION numpy transformers==5.24.0 safetensors tensorboard==2.20.0 pyarrow==22.0.0 model-signing==1.1.1 pyopenssl==26.4.0"
  mkdir -p "$torch_dir"
  # One installer at a time per cache folder; other clones wait here instead of racing.
  exec 9>"$torch_dir/.lock"
  if command -v flock >/dev/null 2>&1; then
    flock 9
  fi
  if [ -f "$venv/.complete" ] && [ "$(cat "$venv/.complete")" = "$requirements" ]; then
    return 0
  fi
  if [ ! -x "$venv/bin/python" ]; then
    command -v "$python" >/dev/null 2>&1 || { log "no $python on PATH: a Python 3.10+ is needed to install torch"; exit 2; }
    log "creating $venv (shared by every clone; once per machine)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
  fi
  log "installing $requirements into $venv"
  local pip_args=(install --disable-pip-version-check --no-input)
  if [ -n "${ORCHESTRATE_TORCH_INDEX_URL:-}" ]; then
    pip_args+=(--index-url "$ORCHESTRATE_TORCH_INDEX_URL")
  fi
  # shellcheck disable=SC2086 # word-splitting the requirement list is intended
  "$venv/bin/python" -m pip "${pip_args[@]}" $requirements >&2
  # Only a finished install is marked; an interrupted one is completed on the next call.
  echo "$requirements" >"$venv/.complete"
}

main() {
  ensure_rust
  mkdir -p "$here/.setup"
  local tmp="$env_file.tmp.$$"
  if [ -n "${LIBTORCH:-}" ]; then
    [ -d "$LIBTORCH/lib" ] || { log "LIBTORCH=$LIBTORCH has no lib/ folder: expected an unpacked libtorch"; exit 2; }
    log "using LIBTORCH=$LIBTORCH"
    {
      echo "export LIBTORCH='$LIBTORCH'"
      echo "unset LIBTORCH_USE_PYTORCH"
      echo "export ORCHESTRATE_TORCH_LIB='$LIBTORCH/lib'"
    } >"$tmp"
  else
    install_venv
    local torch_lib
    torch_lib="$("$venv/bin/python" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
    {
      echo "export PATH='$venv/bin':\"\$PATH\""
      echo "export LIBTORCH_USE_PYTORCH=1"
      echo "export ORCHESTRATE_TORCH_LIB='$torch_lib'"
      echo "export ORCHESTRATE_PYTHON='$venv/bin/python'"
    } >"$tmp"
  fi
  echo "export PATH=\"\$HOME/.cargo/bin:\$PATH\"" >>"$tmp"
  mv "$tmp" "$env_file"
  log "wrote $env_file"
}

main "$@"
