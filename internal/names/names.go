// Package names checks the names pgbaton stores (lease names, groups,
// owners, job names) before anything is sent, the same way for every
// package that stores one.
package names

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Problem says what the database would refuse in the name s (what it is
// called in the message, e.g. "job name"), or "" if nothing: empty, longer
// than max bytes, a NUL byte, invalid UTF-8.
func Problem(what, s string, max int) string {
	switch {
	case s == "":
		return "empty " + what
	case len(s) > max:
		return fmt.Sprintf("%s is %d bytes, at most %d allowed", what, len(s), max)
	case strings.IndexByte(s, 0) >= 0:
		return what + " contains a NUL byte"
	case !utf8.ValidString(s):
		return what + " is not valid UTF-8"
	}
	return ""
}
