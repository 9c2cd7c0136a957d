// Package names checks the names pgbaton stores (lease names, groups,
// owners, job names) before anything is sent, the same way for every
// package that stores one, and makes leasetable's default owner.
package names

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
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

// Owner is a default owner, "hostname:pid:random", unique per call: its
// last max bytes when it is longer.
func Owner(max int) string {
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown"
	}
	var b [6]byte
	_, _ = rand.Read(b[:])
	owner := fmt.Sprintf("%s:%d:%s", host, os.Getpid(), hex.EncodeToString(b[:]))
	if len(owner) > max {
		owner = owner[len(owner)-max:]
	}
	return owner
}
