//go:build !linux

package main

import "golang.org/x/sys/unix"

// processClock is an instant in nanoseconds that every process of the
// machine reads alike: CLOCK_MONOTONIC (CLOCK_BOOTTIME is Linux's).
func processClock() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
