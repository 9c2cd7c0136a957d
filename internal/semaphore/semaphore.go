// Package semaphore is what a leasetable semaphore is made of: permits,
// one lease row "name#i" each, in group name. Every caller of a
// semaphore must pass the same count of them.
package semaphore

import (
	"fmt"
	"strconv"

	"github.com/pgbaton/pgbaton"
)

// Permits checks the count of slots of semaphore name (1 to maxSlots) and
// names its permits, "name#0" to "name#<slots-1>", each at most maxLen
// bytes long. The name itself is checked by the caller.
func Permits(name string, slots, maxSlots, maxLen int) ([]string, error) {
	if slots <= 0 || slots > maxSlots {
		return nil, fmt.Errorf("%w: semaphore slots must be in 1..%d, got %d", pgbaton.ErrInvalidArgument, maxSlots, slots)
	}
	if len(name)+1+len(strconv.Itoa(slots-1)) > maxLen {
		return nil, fmt.Errorf("%w: semaphore name %q too long for its slot names", pgbaton.ErrInvalidArgument, name)
	}
	names := make([]string, slots)
	for i := range names {
		names[i] = name + "#" + strconv.Itoa(i)
	}
	return names, nil
}

// CheckCount refuses a count of permits, want, other than the registered
// one, have: a caller that passes another count would share the permits
// with a different idea of the bound.
func CheckCount(name string, have, want int) error {
	if have != want {
		return fmt.Errorf("%w: semaphore %q has %d slots, not %d: every caller must pass the same count", pgbaton.ErrInvalidArgument, name, have, want)
	}
	return nil
}
