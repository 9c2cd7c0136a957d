#!/usr/bin/env bash
# go mod tidy for every module of the workspace (go.work), or a check that
# each is tidy:
#
#   scripts/gomod.sh tidy     rewrite go.mod/go.sum where needed
#   scripts/gomod.sh check    print the diffs and fail if any module is untidy
#
# `go mod tidy` ignores go.work, and the modules beside the root require the
# root module (and each other) at versions not published yet. So each of
# them is tidied on a copy of its go.mod that replaces the repository's own
# modules by their folders here; the replace directives never reach the
# committed go.mod (a go.mod with replace directives breaks
# `go install github.com/pgbaton/pgbaton/cmd/pgbaton@latest`).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
case $mode in tidy | check) ;; *) echo "usage: $0 tidy|check" >&2; exit 2 ;; esac

root=$PWD
# module path -> folder, for every module in go.work
declare -A dir
while read -r path d; do dir[$path]=$d; done < <(go list -m -f '{{.Path}} {{.Dir}}')

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GOWORK=off GOFLAGS=-mod=mod
failed=0
for path in $(printf '%s\n' "${!dir[@]}" | sort); do
  d=${dir[$path]}
  rel=${d#"$root"}; rel=.${rel}
  if [ "$d" = "$root" ]; then
    if [ "$mode" = tidy ]; then
      (cd "$d" && go mod tidy)
    elif ! (cd "$d" && go mod tidy -diff); then
      echo "gomod: $rel is not tidy: run make tidy" >&2; failed=1
    fi
    continue
  fi
  m=$tmp/${path//\//_}
  mkdir -p "$m"
  cp "$d/go.mod" "$m/go.mod"
  [ -f "$d/go.sum" ] && cp "$d/go.sum" "$m/go.sum" || : >"$m/go.sum"
  for other in "${!dir[@]}"; do
    [ "$other" = "$path" ] || (cd "$d" && go mod edit -modfile="$m/go.mod" -replace="$other=${dir[$other]}")
  done
  if [ "$mode" = tidy ]; then
    (cd "$d" && go mod tidy -modfile="$m/go.mod")
    for other in "${!dir[@]}"; do
      [ "$other" = "$path" ] || (cd "$d" && go mod edit -modfile="$m/go.mod" -dropreplace="$other")
    done
    cp "$m/go.mod" "$d/go.mod"
    cp "$m/go.sum" "$d/go.sum"
  elif ! (cd "$d" && go mod tidy -modfile="$m/go.mod" -diff); then
    echo "gomod: $rel is not tidy: run make tidy" >&2; failed=1
  fi
done
exit $failed
