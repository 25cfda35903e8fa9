#!/usr/bin/env bash
# The remote cache's benchmark: push, no-op push and pull against a local S3
# server (moto_server on a free loopback port), orchestrate and DVC side by side
# in one run on the same files:
#   1. N small nodes (default 1,000), one small file each;
#   2. the tiny grpo-main's cache (every output of experiments/grpo-main.yaml
#      --profile tiny), when this workspace has it (after scripts/run-main.sh).
# Usage: bash scripts/bench-remote.sh [N]
# DVC: $DVC, else the venv ${ORCHESTRATE_CACHE:-~/.cache/orchestrate}/dvc-venv
# (created with `pip install "dvc[s3]"` when missing). Both use 8 parallel jobs.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
n=${1:-1000}
# shellcheck source=/dev/null
. .setup/env.sh
cargo build --release --quiet
O="$root/target/release/orchestrate"
cache="${ORCHESTRATE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/orchestrate}"
if [ -z "${DVC:-}" ]; then
    if [ ! -x "$cache/dvc-venv/bin/dvc" ]; then
        echo "bench: installing dvc[s3] into $cache/dvc-venv" >&2
        python3 -m venv "$cache/dvc-venv"
        "$cache/dvc-venv/bin/pip" install -q "dvc[s3]" >&2
    fi
    DVC="$cache/dvc-venv/bin/dvc"
fi

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
moto_server -H 127.0.0.1 -p "$port" >/dev/null 2>&1 &
moto=$!
work=$(mktemp -d)
trap 'kill $moto 2>/dev/null; rm -rf "$work"' EXIT
for _ in $(seq 100); do curl -sf -o /dev/null -X PUT "http://127.0.0.1:$port/orch" && break; sleep 0.1; done
curl -sf -o /dev/null -X PUT "http://127.0.0.1:$port/dvc"
export AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1 AWS_ENDPOINT_URL="http://127.0.0.1:$port"
unset ORCHESTRATE_REMOTE AWS_PROFILE

# Seconds a command takes (its output discarded).
secs() {
    local start end
    start=$(date +%s.%N)
    "$@" >/dev/null 2>"$work/last.err" || { cat "$work/last.err" >&2; return 1; }
    end=$(date +%s.%N)
    python3 -c "print(f'{$end - $start:.2f}')"
}

# DVC on the files of folder $1 (copied, then `dvc add`ed as one folder), remote prefix $2.
dvc_bench() {
    local files=$1 prefix=$2
    mkdir -p "$work/dvc-$prefix/a" "$work/dvc-$prefix/b"
    (
        cd "$work/dvc-$prefix/a"
        "$DVC" init --no-scm -q
        cp -r "$files" data
        "$DVC" add -q data
        "$DVC" remote add -q -d s3 "s3://dvc/$prefix"
        "$DVC" remote modify -q s3 endpointurl "http://127.0.0.1:$port"
        echo "$(secs "$DVC" push -j 8) $(secs "$DVC" push -j 8)"
    ) >"$work/dvc-push"
    (
        cd "$work/dvc-$prefix/b"
        "$DVC" init --no-scm -q
        cp "$work/dvc-$prefix/a/data.dvc" .
        cp "$work/dvc-$prefix/a/.dvc/config" .dvc/config
        secs "$DVC" pull -j 8
    ) >"$work/dvc-pull"
    echo "$(cat "$work/dvc-push") $(cat "$work/dvc-pull")"
}

row() { printf '| %-34s | %8s | %8s | %8s | %8s | %8s | %8s |\n' "$@"; }

echo "bench: $n small nodes"
mkdir -p "$work/a" "$work/b"
{
    echo "name: many"
    echo "nodes:"
    for i in $(seq 0 $((n - 1))); do
        echo "  n$i: {op: shell, params: {cmd: 'echo node $i > o$i.txt', outs: [o$i.txt]}}"
    done
} >"$work/a/many.yaml"
cp "$work/a/many.yaml" "$work/b/"
(cd "$work/a" && "$O" run -q -j 2 many.yaml >/dev/null)
ours_push=$(cd "$work/a" && secs "$O" push many.yaml --remote s3://orch/many -j 8)
ours_noop=$(cd "$work/a" && secs "$O" push many.yaml --remote s3://orch/many -j 8)
ours_pull=$(cd "$work/b" && secs "$O" pull many.yaml --remote s3://orch/many -j 8)
test "$(cat "$work/b/o7.txt")" = "node 7"
mkdir -p "$work/many-files"
cp "$work"/a/o*.txt "$work/many-files/"
read -r dvc_push dvc_noop dvc_pull <<<"$(dvc_bench "$work/many-files" many)"

echo
row "seconds" "push" "no-op" "pull" "DVC push" "no-op" "pull"
row "----------------------------------" "--------" "--------" "--------" "--------" "--------" "--------"
row "$n small nodes ($n files)" "$ours_push" "$ours_noop" "$ours_pull" "$dvc_push" "$dvc_noop" "$dvc_pull"

# The tiny grpo-main's cache, when this workspace has all of it.
spec=experiments/grpo-main.yaml
if "$O" plan "$spec" --profile tiny | grep -q ' 0 to run, 0 pending'; then
    ours_push=$(secs "$O" push "$spec" --profile tiny --remote s3://orch/main -j 8)
    ours_noop=$(secs "$O" push "$spec" --profile tiny --remote s3://orch/main -j 8)
    mkdir -p "$work/main"
    cp -r experiments gates "$work/main/"
    ours_pull=$(cd "$work/main" && secs "$O" pull "$spec" --profile tiny --remote s3://orch/main -j 8)
    objects=$(find "$work/main/.orchestrate/objects" -type f | wc -l)
    bytes=$(du -sb "$work/main/.orchestrate/objects" | cut -f1)
    # DVC on exactly those bytes: the pulled objects (each output's file or folder).
    read -r dvc_push dvc_noop dvc_pull <<<"$(dvc_bench "$work/main/.orchestrate/objects" main)"
    row "tiny grpo-main ($objects files, $((bytes / 1048576)) MiB)" "$ours_push" "$ours_noop" "$ours_pull" "$dvc_push" "$dvc_noop" "$dvc_pull"
else
    echo "(the tiny grpo-main is not wholly cached here: run bash scripts/run-main.sh first for its row)"
fi
