package pgcluster

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"time"
)

// ErrNoFaketime is returned by Start with Config.FakeClock when libfaketime
// is not installed.
var ErrNoFaketime = errors.New("pgcluster: libfaketime.so.1 not found (Debian/Ubuntu: apt-get install libfaketime, or make deps)")

// ErrNoFakeClock is returned by StepClock on a cluster started without
// Config.FakeClock.
var ErrNoFakeClock = errors.New("pgcluster: the cluster was started without FakeClock")

// faketimeLibs are where distributions install libfaketime; Debian's
// package puts it under the multiarch directory.
var faketimeLibs = []string{
	"/usr/lib/*/faketime/libfaketime.so.1",
	"/usr/lib/faketime/libfaketime.so.1",
	"/usr/local/lib/faketime/libfaketime.so.1",
}

// FindFaketime returns the path of libfaketime.so.1, or ErrNoFaketime.
func FindFaketime() (string, error) {
	for _, pattern := range faketimeLibs {
		if m, _ := filepath.Glob(pattern); len(m) > 0 {
			return m[0], nil
		}
	}
	return "", ErrNoFaketime
}

func (c *Cluster) clockFile() string { return filepath.Join(c.dir, "faketime.rc") }

// fakeClockEnv prepares the offset file, at "+0" when the cluster is new
// (a restart keeps the offset), and returns the postmaster's environment:
// libfaketime preloaded, which every backend inherits since backends are
// forked from the postmaster. Only the wall clock is faked, as an NTP step
// or a VM resume moves it: CLOCK_MONOTONIC, which the server times
// timeouts with, stays real.
func (c *Cluster) fakeClockEnv() ([]string, error) {
	lib, err := FindFaketime()
	if err != nil {
		return nil, err
	}
	if _, err := os.Stat(c.clockFile()); errors.Is(err, os.ErrNotExist) {
		if err := c.writeClockFile(0); err != nil {
			return nil, err
		}
	}
	return append(os.Environ(),
		"LD_PRELOAD="+lib,
		"FAKETIME_TIMESTAMP_FILE="+c.clockFile(),
		// Read the file on every call, so a step takes effect at once
		// (libfaketime caches it for 10s by default).
		"FAKETIME_NO_CACHE=1",
		"FAKETIME_DONT_FAKE_MONOTONIC=1",
	), nil
}

// StepClock steps the server's wall clock by d (negative: back) for every
// backend at once, new and running, as an NTP step would; the steps add up.
// Only for a cluster started with Config.FakeClock.
func (c *Cluster) StepClock(d time.Duration) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.cfg.FakeClock {
		return ErrNoFakeClock
	}
	if c.stopped {
		return ErrStopped
	}
	if err := c.writeClockFile(c.clockOffset + d); err != nil {
		return err
	}
	c.clockOffset += d
	return nil
}

// ClockOffset is how far the server's wall clock is ahead of the real one
// (negative: behind), the sum of the steps so far.
func (c *Cluster) ClockOffset() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.clockOffset
}

// writeClockFile writes offset in libfaketime's format: a sign, then
// seconds (fractions allowed), an offset from the real time rather than
// from the start. The file is replaced by a rename, so a backend never
// reads it half written.
func (c *Cluster) writeClockFile(offset time.Duration) error {
	spec := strconv.FormatFloat(offset.Seconds(), 'f', 6, 64)
	if offset >= 0 {
		spec = "+" + spec
	}
	tmp := c.clockFile() + ".tmp"
	if err := os.WriteFile(tmp, []byte(spec+"\n"), 0o644); err != nil {
		return fmt.Errorf("pgcluster: write clock offset: %w", err)
	}
	if err := os.Rename(tmp, c.clockFile()); err != nil {
		return fmt.Errorf("pgcluster: write clock offset: %w", err)
	}
	return nil
}
