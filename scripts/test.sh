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
slurm_log="$(mktemp)"
slurm_tests=
cleanup() {
    # The Slurm tests' own session (setsid below): cargo, the test binary and its
    # children; without setsid, cargo alone.
    if [ -n "$slurm_tests" ]; then kill -- -"$slurm_tests" 2>/dev/null || kill "$slurm_tests" 2>/dev/null || true; fi
    rm -f "$log" "$slurm_log"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# Two tests per core: most integration tests wait (on a Slurm job, a local
# server, Chromium, a subprocess), and their numerical nodes take the
# machine-wide CPU slots like any run's, so the cores stay shared fairly. On 2
# cores the integration binary took 340 s with libtest's default (one per core)
# and 276 s with 4. RUST_TEST_THREADS set beforehand wins.
threads="${RUST_TEST_THREADS:-$((2 * $(nproc)))}"
# The two Slurm tests (tests/it/slurm.rs, every name with `slurm::`) mostly wait,
# on the cluster's scheduler and on each other (they share one cluster), about
# 80 s. libtest starts tests in name order, so they ran last, beside an idle
# core. They run in a `cargo test` of their own, beside the rest, instead: the
# same filter puts each test in exactly one of the two (329 → 315 s on 2 cores).
# Their output follows the rest's.
session=()
command -v setsid >/dev/null 2>&1 && session=(setsid)
RUST_TEST_THREADS="$threads" "${session[@]}" cargo test --locked --lib --bins --tests -- slurm:: >"$slurm_log" 2>&1 &
slurm_tests=$!
status=0
RUST_TEST_THREADS="$threads" cargo test --locked --lib --bins --tests -- --skip slurm:: 2>&1 | tee "$log" || status=$?
wait "$slurm_tests" || status=$?
slurm_tests=
tee -a "$log" <"$slurm_log"
[ "$status" = 0 ] || exit "$status"
# Compile-fail examples (the guard's handle and the update path's types).
cargo test --locked --doc 2>&1 | tee -a "$log"
# The README's main job itself, so it can never break silently again: the whole
# protocol on the embedded default, failing the run if it exits non-zero.
# ORCHESTRATE_SKIP_MAIN_JOB=1 skips it for a quick local run, and says so.
# It runs from the build the tests used (ORCHESTRATE_MAIN_PROFILE=dev), not
# from a release build of its own: the job's time is libtorch's kernels, so
# the dev binaries took 557 s where release took 510 s (2026-12-04), with the
# same results table byte for byte, and the 10-minute release build is not
# paid for (it ran beside the tests, and slowed them from about 300 to 516 s).
# The dev profile optimizes the crates a worker runs over every example, such
# as the tokenizer (Cargo.toml), since 2026-12-07.
if [ "${ORCHESTRATE_SKIP_MAIN_JOB:-}" = 1 ]; then
    echo "test: ORCHESTRATE_SKIP_MAIN_JOB=1: the README's main job (bash scripts/run-main.sh) was NOT run"
else
    echo "test: the README's main job: ORCHESTRATE_MAIN_PROFILE=dev bash scripts/run-main.sh"
    main_started=$SECONDS
    ORCHESTRATE_MAIN_PROFILE=dev bash scripts/run-main.sh
    echo "test: the main job passed in $((SECONDS - main_started)) s"
fi
# One closing line over every test binary; a test that could not run here
# (it printed SKIPPED: ...) counts as skipped, never as passed.
bash scripts/test-summary.sh "$log"
