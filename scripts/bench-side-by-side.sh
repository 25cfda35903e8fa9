#!/usr/bin/env bash
# Two builds of orchestrate side by side, in one go, on the engine bench's
# shapes: a 200-stage lattice (8 layers x 25, two parents each: its first run
# and its no-op re-run) and a 10,000-node one (100 x 100: `validate` and a
# fresh `plan`). Each pair alternates which build goes first (whichever runs
# first in a pair is a few per cent faster), and each figure is a median.
#
#   bash scripts/bench-side-by-side.sh OLD_BINARY NEW_BINARY [PAIRS]
#
# e.g. after `git worktree add /tmp/old REV && (cd /tmp/old && cargo build
# --release --bin orchestrate)`: OLD_BINARY /tmp/old/target/release/orchestrate,
# NEW_BINARY target/release/orchestrate. Wall-clock figures include starting
# `date`, so they sit a little above `cargo bench --bench engine`'s.
set -euo pipefail
if [ $# -lt 2 ]; then
    echo "usage: bash scripts/bench-side-by-side.sh OLD_BINARY NEW_BINARY [PAIRS]" >&2
    exit 2
fi
old=$(realpath "$1")
new=$(realpath "$2")
pairs=${3:-15}
for b in "$old" "$new"; do
    [ -x "$b" ] || { echo "bench-side-by-side: $b is not an executable" >&2; exit 2; }
done
root=$(mktemp -d)
trap 'rm -rf "$root"' EXIT

# A lattice spec of LAYERS x WIDTH shell stages, PARENTS parents each.
lattice() {
    python3 - "$1" "$2" "$3" "$4" <<'EOF'
import sys
layers, width, parents, path = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
f = lambda l, s: f"d/l{l}s{s}.txt"
y = "name: lattice\nnodes:\n"
for l in range(layers):
    for s in range(width):
        out = f(l, s)
        deps = [] if l == 0 else [f(l - 1, (s + k) % width) for k in range(parents)]
        cmd = f"echo {s} > {out}" if l == 0 else f"cat {' '.join(deps)} > {out}; echo {l} >> {out}"
        y += f"  l{l}s{s}:\n    op: shell\n    params: {{cmd: '{cmd}', deps: [{', '.join(deps)}], outs: [{out}]}}\n"
open(path, "w").write(y)
EOF
}

# Microseconds the command took (its output discarded; it must succeed).
took() {
    local start end
    start=$(date +%s%N)
    "$@" >/dev/null 2>&1 || { echo "bench-side-by-side: $* failed" >&2; exit 1; }
    end=$(date +%s%N)
    echo $(((end - start) / 1000))
}

median() { printf '%s\n' "$@" | sort -n | awk '{v[NR] = $1} END {printf "%.1f", v[int((NR + 1) / 2)] / 1000}'; }

# In each pair, the build that goes first alternates.
order() { if [ $(($1 % 2)) = 0 ]; then echo "old new"; else echo "new old"; fi; }
bin() { if [ "$1" = old ]; then echo "$old"; else echo "$new"; fi; }

for side in old new; do
    mkdir -p "$root/$side/d"
    lattice 8 25 2 "$root/$side/p.yaml"
done
declare -A first noop validate plan
for i in $(seq "$pairs"); do
    for side in $(order "$i"); do
        dir="$root/$side"
        rm -rf "$dir/.orchestrate" "$dir/d" && mkdir "$dir/d"
        first[$side]+=" $(cd "$dir" && took "$(bin "$side")" run --quiet p.yaml)"
    done
done
for i in $(seq $((pairs * 2))); do
    for side in $(order "$i"); do
        noop[$side]+=" $(cd "$root/$side" && took "$(bin "$side")" run --quiet p.yaml)"
    done
done
big="$root/big"
mkdir -p "$big"
lattice 100 100 1 "$big/big.yaml"
for i in $(seq "$pairs"); do
    for side in $(order "$i"); do
        validate[$side]+=" $(cd "$big" && took "$(bin "$side")" validate big.yaml)"
        rm -rf "$big/.orchestrate"
        plan[$side]+=" $(cd "$big" && took "$(bin "$side")" plan big.yaml)"
        rm -rf "$big/.orchestrate"
    done
done
# shellcheck disable=SC2086 # the lists are words on purpose
{
    echo "old: $old"
    echo "new: $new"
    echo "medians, in ms (old → new), $pairs pairs ($((pairs * 2)) for the no-op), the order alternating:"
    echo "  200-stage lattice, first run       $(median ${first[old]}) → $(median ${first[new]})"
    echo "  200-stage lattice, no-op re-run    $(median ${noop[old]}) → $(median ${noop[new]})"
    echo "  10,000 nodes, validate             $(median ${validate[old]}) → $(median ${validate[new]})"
    echo "  10,000 nodes, plan (fresh)         $(median ${plan[old]}) → $(median ${plan[new]})"
}
