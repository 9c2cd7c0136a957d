#!/usr/bin/env bash
# Print the release notes of version VERSION (vX.Y.Z): its section of
# CHANGELOG.md, without the heading. Fails if there is no such section, so
# that a release cannot go out without its notes.
#
#   scripts/release-notes.sh v0.1.0 > /tmp/notes.md
set -euo pipefail
cd "$(dirname "$0")/.."
version=${1:?usage: $0 vX.Y.Z}
v=${version#v}
# The section ends at the next "## [" heading or at the link definitions
# ("[X.Y.Z]: https://...") at the bottom of the file.
notes=$(awk -v v="$v" '
  /^## \[/ { if (found) exit; if (index($0, "## [" v "]") == 1) { found = 1; next } }
  /^\[[^]]+\]: / { if (found) exit }
  found { print }
' CHANGELOG.md)
if [ -z "${notes//[[:space:]]/}" ]; then
  echo "release-notes: CHANGELOG.md has no section \"## [$v]\": move the [Unreleased] entries there first (RELEASING.md)" >&2
  exit 1
fi
printf '%s\n' "$notes"
