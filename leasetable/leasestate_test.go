package leasetable

import (
	"errors"
	"fmt"
	"testing"
)

// The lease's life only moves forward: no state is entered twice, and
// released and lost are final.
func TestLeaseTransitions(t *testing.T) {
	allowed := map[[2]leaseState]bool{
		{leaseHeld, leaseHandedOff}:     true,
		{leaseHeld, leaseReleased}:      true,
		{leaseHeld, leaseLost}:          true,
		{leaseHandedOff, leaseReleased}: true,
		{leaseHandedOff, leaseLost}:     true,
	}
	for from := range leaseState(leaseStates) {
		for to := range leaseState(leaseStates) {
			if got, want := leaseTransitions[from][to], allowed[[2]leaseState{from, to}]; got != want {
				t.Errorf("%s -> %s allowed: %v, want %v", from, to, got, want)
			}
		}
		if final := from == leaseReleased || from == leaseLost; from.ended() != final {
			t.Errorf("%s ended: %v, want %v", from, from.ended(), final)
		}
	}
}

// TestReleasedErrorReadsAsBefore: the lazily formatted cause of a released
// lease says what fmt.Errorf said, and is ErrReleased.
func TestReleasedErrorReadsAsBefore(t *testing.T) {
	err := error(&releasedError{"job \"a\"", 42})
	if want := fmt.Errorf("%w: %q token %d", ErrReleased, "job \"a\"", 42).Error(); err.Error() != want {
		t.Fatalf("got %q, want %q", err.Error(), want)
	}
	if !errors.Is(err, ErrReleased) {
		t.Fatal("not ErrReleased")
	}
}
