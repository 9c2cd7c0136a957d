//go:build unix

package pgsession

import (
	"errors"
	"syscall"
)

const canWatchIdle = true

// waitReadable blocks in the runtime's network poller until the socket
// has bytes or EOF (true), or its read deadline passes or it is closed
// (false). MSG_PEEK leaves the bytes for the session's reader.
func waitReadable(raw syscall.RawConn) bool {
	var b [1]byte
	readable := false
	err := raw.Read(func(fd uintptr) bool {
		_, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK)
		if errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EINTR) {
			return false // not readable yet: wait for the poller
		}
		readable = true // data, EOF or a socket error: the session reads it
		return true
	})
	return err == nil && readable
}
