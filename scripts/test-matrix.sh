#!/usr/bin/env bash
# The PostgreSQL version matrix: the library's suites against each server
# major in turn, with server binaries installed by scripts/pg-install.sh.
#
#   scripts/test-matrix.sh            # every major in PG_VERSIONS
#   PG_VERSIONS="13 18" scripts/test-matrix.sh
#
# Each major gets one line, and a last line sums them up:
#   matrix: PostgreSQL 13.23 ok in 301s
#   matrix: 6 passed, 0 failed
# TESTFLAGS adds to go test's flags (e.g. -run X -v).
set -uo pipefail
cd "$(dirname "$0")/.."

PG_VERSIONS=${PG_VERSIONS:-13 14 15 16 17 18}
GO=${GO:-go}
# The suites whose behaviour depends on the server; the short chaos run
# (test/, TestChaos with its default duration) last.
PKGS=(./advisory/ ./leasetable/ ./fencedwrite/ ./migrations/ ./health/ ./gocronlock/...)
CHAOS=(-run 'TestChaos$' ./test/)

passed=0 failed=0 results=()
for v in $PG_VERSIONS; do
  if ! bin=$(scripts/pg-install.sh "$v"); then
    results+=("matrix: PostgreSQL $v FAILED to install")
    failed=$((failed + 1))
    continue
  fi
  version=$("$bin/postgres" --version)
  version=${version#postgres (PostgreSQL) }
  echo "=== matrix: PostgreSQL $version ($bin)"
  start=$SECONDS
  # A DSN would test that server instead: the matrix always starts its own.
  if env -u PGBATON_TEST_DSN PGBATON_PG_BINDIR="$bin" \
    $GO test -race -count=1 -timeout 20m ${TESTFLAGS:-} "${PKGS[@]}" &&
    env -u PGBATON_TEST_DSN PGBATON_PG_BINDIR="$bin" \
      $GO test -race -count=1 -timeout 10m ${TESTFLAGS:-} "${CHAOS[@]}"; then
    results+=("matrix: PostgreSQL $version ok in $((SECONDS - start))s")
    passed=$((passed + 1))
  else
    results+=("matrix: PostgreSQL $version FAILED in $((SECONDS - start))s")
    failed=$((failed + 1))
  fi
done
printf '%s\n' "${results[@]}"
echo "matrix: $passed passed, $failed failed"
[ "$failed" = 0 ]
