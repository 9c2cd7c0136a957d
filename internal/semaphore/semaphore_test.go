package semaphore

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/pgbaton/pgbaton"
)

func TestPermits(t *testing.T) {
	got, err := Permits("jobs", 3, 10, 255)
	if err != nil || !slices.Equal(got, []string{"jobs#0", "jobs#1", "jobs#2"}) {
		t.Fatalf("Permits = %q, %v", got, err)
	}
	// The longest permit name, "abcdef#9", fits in 8 bytes; "#10" would not.
	if _, err := Permits("abcdef", 10, 10, 8); err != nil {
		t.Fatalf("permit names of exactly the longest length: %v", err)
	}
	for _, c := range []struct {
		slots, max int
		want       string
	}{
		{0, 10, "semaphore slots must be in 1..10, got 0"},
		{-1, 10, "semaphore slots must be in 1..10, got -1"},
		{11, 10, "semaphore slots must be in 1..10, got 11"},
		{11, 20, `semaphore name "abcdef" too long for its slot names`},
	} {
		_, err := Permits("abcdef", c.slots, c.max, 8)
		if !errors.Is(err, pgbaton.ErrInvalidArgument) || !strings.HasSuffix(err.Error(), ": "+c.want) {
			t.Errorf("Permits(%d slots, at most %d) = %v; want %q", c.slots, c.max, err, c.want)
		}
	}
}

func TestCheckCount(t *testing.T) {
	if err := CheckCount("s", 4, 4); err != nil {
		t.Fatal(err)
	}
	err := CheckCount("s", 4, 5)
	if !errors.Is(err, pgbaton.ErrInvalidArgument) || !strings.HasSuffix(err.Error(), `: semaphore "s" has 4 slots, not 5: every caller must pass the same count`) {
		t.Fatalf("CheckCount = %v", err)
	}
}
