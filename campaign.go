package pgbaton

import "context"

// Callbacks are the hooks of a leader-election campaign, the same for both
// lock layers (advisory.Locker.Campaign, leasetable.Client.Campaign).
type Callbacks struct {
	// OnStartedLeading runs, on Campaign's goroutine, each time this
	// process becomes leader. term is the leadership's fencing token with
	// leases (larger for every new leader: fence writes with it), and 0
	// with advisory locks, which have none. Its context ends when
	// leadership is lost (cause ErrLockLost or ErrLeaseLost) or Campaign's
	// context ends. Leadership is kept until it returns (or is lost), then
	// resigned. Required.
	OnStartedLeading func(ctx context.Context, term int64)
	// OnStoppedLeading runs after each term, once OnStartedLeading has
	// returned and leadership was resigned or lost. Optional.
	OnStoppedLeading func()
}
