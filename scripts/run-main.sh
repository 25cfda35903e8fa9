#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the main job: the whole GRPO
# protocol (experiments/grpo-main.yaml) on the embedded tiny model, on CPU
# (8½ to 16 minutes on 2 cores), ending with the results table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck source=/dev/null
. .setup/env.sh
# ORCHESTRATE_MAIN_PROFILE=dev runs it from the dev build (what scripts/test.sh
# does, reusing the build its tests used); the default is release.
case "${ORCHESTRATE_MAIN_PROFILE:-release}" in
    release) cargo build --release --locked; bin=./target/release/orchestrate ;;
    # --all-targets, as scripts/test.sh builds: a plain `cargo build` unifies
    # features without the dev-dependencies and rebuilt crates (36 s on a clean clone).
    dev) cargo build --all-targets --locked; bin=./target/debug/orchestrate ;;
    *) echo "run-main: ORCHESTRATE_MAIN_PROFILE is '${ORCHESTRATE_MAIN_PROFILE}'; expected release or dev" >&2; exit 2 ;;
esac
"$bin" run experiments/grpo-main.yaml --profile tiny "$@"
