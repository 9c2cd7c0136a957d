package leasetable

import (
	"errors"
	"fmt"
	"testing"
)

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
