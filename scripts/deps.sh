#!/usr/bin/env bash
# Makes sure the programs the tests (or the demo) start are installed, and
# installs the missing ones with apt-get when run as root on Debian or
# Ubuntu. Otherwise it stops at once and prints the exact command to run.
#
#   scripts/deps.sh NEED...
#
# NEED is any of:
#   cc         a C compiler, for `go test -race` (cgo)      Debian: gcc libc6-dev
#   postgres   the PostgreSQL server (initdb, postgres)     Debian: postgresql
#   pgbouncer  PgBouncer, for the transaction-pooling tests Debian: pgbouncer
#   faketime   libfaketime, for the server clock-step tests Debian: libfaketime
#   ip         ip(8), for the network-namespace partition   Debian: iproute2
#   chromium   headless Chromium, for the admin page's test Debian: chromium
#   patroni    Patroni with its etcd client, for make test-ha  Debian: patroni python3-etcd
#   etcd       etcd, Patroni's store, for make test-ha      Debian: etcd-server etcd-client
#   npm        npm and node, for scripts/pg-install.sh      Debian: npm
set -euo pipefail

have() { command -v "$1" >/dev/null 2>&1; }
any_file() { for f in "$@"; do [ -x "$f" ] && return 0; done; return 1; }

# missing NEED: exit 0 when NEED is installed.
installed() {
  case $1 in
    cc) have "$(go env CC 2>/dev/null || echo gcc)" ;;
    postgres)
      # Where internal/testkit/pgcluster looks: PATH, pg_config, Debian's layout.
      { have initdb && have postgres; } ||
        { have pg_config && any_file "$(pg_config --bindir)/initdb"; } ||
        compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null ;;
    pgbouncer) have pgbouncer || any_file /usr/sbin/pgbouncer ;;
    # Where internal/testkit/pgcluster looks (FindFaketime).
    faketime)
      compgen -G "/usr/lib/*/faketime/libfaketime.so.1" >/dev/null ||
        [ -f /usr/lib/faketime/libfaketime.so.1 ] || [ -f /usr/local/lib/faketime/libfaketime.so.1 ] ;;
    ip) have ip || any_file /usr/sbin/ip /sbin/ip /usr/bin/ip ;;
    chromium) have chromium || have chromium-browser || have google-chrome ;;
    # Patroni's etcd3 store imports python-etcd; its script runs /usr/bin/python3.
    patroni) have patroni && have patronictl && /usr/bin/python3 -c 'import etcd' 2>/dev/null ;;
    etcd) have etcd && have etcdctl ;;
    npm) have npm && have node ;;
    *) echo "deps: unknown need $1" >&2; exit 2 ;;
  esac
}

packages() {
  case $1 in
    cc) echo gcc libc6-dev ;;
    postgres) echo postgresql ;;
    pgbouncer) echo pgbouncer ;;
    faketime) echo libfaketime ;;
    ip) echo iproute2 ;;
    chromium) echo chromium ;;
    patroni) echo patroni python3-etcd ;;
    etcd) echo etcd-server etcd-client ;;
    npm) echo npm ;;
  esac
}

pkgs=()
for need in "$@"; do
  if ! installed "$need"; then
    read -ra p <<<"$(packages "$need")"
    pkgs+=("${p[@]}")
  fi
done
((${#pkgs[@]})) || exit 0

# Chromium keeps its recommended packages (fonts and the like), as Debian
# means it to be installed; the rest need none.
base=() browser=()
for p in "${pkgs[@]}"; do
  if [ "$p" = chromium ]; then browser+=("$p"); else base+=("$p"); fi
done
cmd="apt-get update"
((${#base[@]})) && cmd+=" && apt-get install -y --no-install-recommends ${base[*]}"
((${#browser[@]})) && cmd+=" && apt-get install -y ${browser[*]}"

if ! have apt-get; then
  echo "deps: missing ${pkgs[*]} (Debian package names); install them with your system's package manager" >&2
  exit 1
fi
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing ${pkgs[*]}; install them, then run make again:" >&2
  echo "  sudo sh -c '$cmd'" >&2
  exit 1
fi
echo "deps: installing ${pkgs[*]}"
echo "+ $cmd"
DEBIAN_FRONTEND=noninteractive sh -c "$cmd"
