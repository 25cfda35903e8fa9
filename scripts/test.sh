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
main_log="$(mktemp)"
main_pid=
# On the way out (a failed test included), the main job or its build still
# running is stopped, rustc and the worker too: setsid gives it a process
# group of its own.
trap 'if [ -n "$main_pid" ]; then kill -- "-$main_pid" 2>/dev/null; fi; rm -rf "$log" "$main_log" "${main_slots:-}"' EXIT
# The README's main job, so it can never break silently again: the whole
# protocol on the embedded default (release build), failing the run if it
# exits non-zero. It starts now, beside the tests, at the lowest CPU priority:
# its release build first (another profile, so the two cargo commands do not
# wait on each other's lock), then `bash scripts/run-main.sh` itself. The tests
# leave about 40 % of 2 cores idle (a test mostly waits on the `orchestrate`
# processes it starts), which the build and then the job take instead of
# running after them; once the tests end, the job has both cores. Its figures
# do not depend on what runs beside it. ORCHESTRATE_SKIP_MAIN_JOB=1 skips it
# for a quick local run, and says so.
# Its CPU slots are its own (docs/specs.md, Threads): in the machine's, its
# 2-thread pretraining would hold both cores' slots for minutes and the tests'
# training nodes would wait for them; at nice 19 it takes only what they leave.
main_slots="$(mktemp -d)"
main_started=$SECONDS
if [ "${ORCHESTRATE_SKIP_MAIN_JOB:-}" != 1 ]; then
    ORCHESTRATE_CPU_SLOTS_DIR="$main_slots" setsid nice -n 19 bash -c 'cargo build --release --locked && echo "test: the release build done after $((SECONDS)) s" && bash scripts/run-main.sh' \
        >"$main_log" 2>&1 &
    main_pid=$!
fi
cargo test --locked --lib --bins --tests 2>&1 | tee "$log"
# Compile-fail examples (the guard's handle and the update path's types).
cargo test --locked --doc 2>&1 | tee -a "$log"
if [ "${ORCHESTRATE_SKIP_MAIN_JOB:-}" = 1 ]; then
    echo "test: ORCHESTRATE_SKIP_MAIN_JOB=1: the README's main job (bash scripts/run-main.sh) was NOT run"
else
    waited=$SECONDS
    echo "test: the README's main job (bash scripts/run-main.sh), started beside the tests $((SECONDS - main_started)) s ago: waiting for it"
    if ! wait "$main_pid"; then
        main_pid=
        cat "$main_log" >&2
        echo "test: the README's main job (or its release build) failed" >&2
        exit 1
    fi
    main_pid=
    grep -v '^running \|^done \|^cached \|^ *Compiling ' "$main_log"
    echo "test: the main job passed, $((SECONDS - main_started)) s after it started beside the tests ($((SECONDS - waited)) s after they ended)"
fi
# One closing line over every test binary; a test that could not run here
# (it printed SKIPPED: ...) counts as skipped, never as passed.
bash scripts/test-summary.sh "$log"
