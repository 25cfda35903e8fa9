#!/usr/bin/env bash
# Sets everything up on a fresh machine and runs the whole test suite.
# (.ci/run runs exactly this.)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/setup.sh
# shellcheck source=/dev/null
. .setup/env.sh
# The report test renders HTML in headless Chromium (Debian's package). Install
# it when it is missing and this machine can; the test fails loudly without it.
# The Slurm test starts a single-node cluster on localhost (tests/slurm/cluster.sh)
# from Debian's slurmctld, slurmd, slurm-client and munge; likewise installed.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v sbatch >/dev/null 2>&1 || missing+=(slurm-client)
[ -x /usr/sbin/slurmctld ] || missing+=(slurmctld)
[ -x /usr/sbin/slurmd ] || missing+=(slurmd)
[ -x /usr/sbin/munged ] || missing+=(munge)
if [ ${#missing[@]} -gt 0 ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test: installing Debian's ${missing[*]} for the report and Slurm tests"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >/dev/null 2>&1; then
        echo "test: could not install ${missing[*]}; the report or Slurm test will fail" >&2
    fi
fi
# The remote-cache tests start moto's S3 server on 127.0.0.1 (`moto_server`).
# The machine image has it; elsewhere it goes into the project's venv.
if ! command -v moto_server >/dev/null 2>&1; then
    echo "test: installing moto[server] into the venv for the remote-cache tests"
    "$ORCHESTRATE_PYTHON" -m pip install --disable-pip-version-check --no-input -q 'moto[server]==5.2.1' >&2 \
        || echo "test: could not install moto[server]; the remote-cache tests will fail" >&2
fi
cargo fmt --check
cargo build --all-targets --locked
log="$(mktemp)"
release_log="$(mktemp)"
release_pid=
# On the way out (a failed test included), a build still running is stopped, rustc
# processes too: setsid gives it a process group of its own.
trap 'if [ -n "$release_pid" ]; then kill -- "-$release_pid" 2>/dev/null; fi; rm -f "$log" "$release_log"' EXIT
# The main job's release build starts now, at the lowest CPU priority, beside the
# tests: they leave about 40 % of 2 cores idle (a test mostly waits on the
# `orchestrate` processes it starts),
# which the build takes instead of running after them (another profile, so the two
# cargo commands do not wait on each other's lock). run-main.sh's own
# `cargo build --release` then finds it done.
if [ "${ORCHESTRATE_SKIP_MAIN_JOB:-}" != 1 ]; then
    setsid nice -n 19 cargo build --release --locked >"$release_log" 2>&1 &
    release_pid=$!
fi
cargo test --locked --lib --bins --tests 2>&1 | tee "$log"
# Compile-fail examples (the guard's handle and the update path's types).
cargo test --locked --doc 2>&1 | tee -a "$log"
# The README's main job itself, so it can never break silently again: the whole
# protocol on the embedded default (release build), failing the run if it exits
# non-zero. ORCHESTRATE_SKIP_MAIN_JOB=1 skips it for a quick local run, and says so.
if [ "${ORCHESTRATE_SKIP_MAIN_JOB:-}" = 1 ]; then
    echo "test: ORCHESTRATE_SKIP_MAIN_JOB=1: the README's main job (bash scripts/run-main.sh) was NOT run"
else
    waited=$SECONDS
    if ! wait "$release_pid"; then
        release_pid=
        cat "$release_log" >&2
        echo "test: the release build for the main job failed" >&2
        exit 1
    fi
    release_pid=
    echo "test: the release build ($(tail -n 1 "$release_log" | sed 's/^ *//')), waited $((SECONDS - waited)) s for it after the tests"
    echo "test: the README's main job: bash scripts/run-main.sh"
    main_started=$SECONDS
    bash scripts/run-main.sh
    echo "test: the main job passed in $((SECONDS - main_started)) s"
fi
# One closing line over every test binary; a test that could not run here
# (it printed SKIPPED: ...) counts as skipped, never as passed.
bash scripts/test-summary.sh "$log"
