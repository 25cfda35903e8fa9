#!/usr/bin/env bash
# The one closing line over every test binary of a `cargo test` log (the file
# given, or stdin): passed, failed and skipped, where a test that announced
# `SKIPPED: ...` (tests/common's skip(): it could not run here, e.g. no root for
# a tmpfs, or ORCHESTRATE_SKIP_SLURM_TEST) counts as skipped, not as passed,
# beside the #[ignore]d ones. Each skipped test is listed first.
set -euo pipefail
log="${1:-/dev/stdin}"
awk '
  /^SKIPPED: / { s++; print "skipped: " substr($0, 10) }
  /^test result:/ { p += $4; f += $6; i += $8 }
  END { printf "all tests: %d passed, %d failed, %d skipped\n", p - s, f, i + s }
' "$log"
