#!/usr/bin/env bash
# Checks that the library (the root module, outside the workspace) builds
# for the Go release its go directive names, the oldest one still
# supported:
#   - no module in its build list needs a newer Go (their go directives);
#   - the compiler's -lang, set from the go directive, rejects newer
#     language features;
#   - vet's stdversion check rejects standard-library API newer than it.
# With GO_MIN set to a go binary of that release (e.g. GO_MIN=go1.25.9,
# installed with golang.org/dl), it also builds and vets with it.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOWORK=off GOTOOLCHAIN=local
want=$(go list -m -f '{{.GoVersion}}')
echo "check-min-go: the library's go directive is $want"
mods=$(go list -m -f '{{if .GoVersion}}{{.Path}} {{.GoVersion}}{{end}}' all)
newer=""
while read -r mod gv; do
  if [ "$(printf '%s\n%s\n' "$gv" "$want" | sort -V | tail -1)" != "$want" ]; then
    newer+="  $mod needs go $gv"$'\n'
  fi
done <<<"$mods"
if [ -n "$newer" ]; then
  printf 'check-min-go: these dependencies need a newer Go than %s:\n%s' "$want" "$newer" >&2
  exit 1
fi
go build ./...
go vet ./...
if [ -n "${GO_MIN:-}" ]; then
  "$GO_MIN" version
  "$GO_MIN" build ./...
  "$GO_MIN" vet ./...
fi
echo "check-min-go: ok"
