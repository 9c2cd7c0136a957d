package main

import "golang.org/x/sys/unix"

// processClock is an instant in nanoseconds that every process of the
// machine reads alike: CLOCK_BOOTTIME, which also runs while the machine
// is suspended, as the lease's expiry in the database does.
func processClock() int64 {
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts)
	return ts.Nano()
}
