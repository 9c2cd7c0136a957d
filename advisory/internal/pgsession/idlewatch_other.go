//go:build !unix

package pgsession

import "syscall"

const canWatchIdle = false

// waitReadable is not available here: sessions rely on their pings.
func waitReadable(syscall.RawConn) bool { return false }
