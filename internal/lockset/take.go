package lockset

import (
	"fmt"
	"slices"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Names checks the names of a lease set (1 to max of them, each one
// passing check) and returns them in byte order (Go's string order, which
// is PostgreSQL's COLLATE "C"): the one order every set is taken in.
func Names(names []string, max int, check func(string) error) ([]string, error) {
	if len(names) == 0 || len(names) > max {
		return nil, fmt.Errorf("%w: a lease set must have 1 to %d names, got %d", pgbaton.ErrInvalidArgument, max, len(names))
	}
	sorted := slices.Clone(names)
	for _, n := range sorted {
		if err := check(n); err != nil {
			return nil, err
		}
	}
	slices.Sort(sorted)
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return nil, fmt.Errorf("%w: lease %q is named twice in a lease set", pgbaton.ErrInvalidArgument, sorted[i])
		}
	}
	return sorted, nil
}

// Take takes every one of names (sorted, as Names returns them), holding
// those taken while it waits in the queue of the next: every caller takes
// its names in that one order, so no two sets wait for each other in a
// cycle, and each queue serves the oldest waiter first, so no set is
// overtaken forever.
//
// try takes the names of rest up to the first one held in one round trip,
// keeping that prefix, and names the one in the way ("" when it got them
// all); wait waits in that one's queue. Take returns every member it took,
// also when it fails: then the caller gives them back, so that it holds
// all of the set or none of it. A member taken early and lost while a
// later one was waited for fails it too.
func Take[M Member](names []string, try func(rest []string) (got []M, held string, err error), wait func(name string) (M, error)) ([]M, error) {
	taken := make([]M, 0, len(names))
	for rest := names; len(rest) > 0; {
		got, held, err := try(rest)
		taken = append(taken, got...)
		if err != nil {
			return taken, err
		}
		if held == "" {
			break
		}
		// Wait in the queue of the name in the way, holding those before it.
		m, err := wait(held)
		if err != nil {
			return taken, err
		}
		taken = append(taken, m)
		i := slices.Index(rest, held)
		if i < 0 {
			return taken, fmt.Errorf("the database refused %q, which the set does not name", held)
		}
		rest = rest[i+1:]
	}
	for _, m := range taken {
		if err := m.Err(); err != nil {
			return taken, err // lost while the rest were waited for
		}
	}
	return taken, nil
}

// Answer reads the rows of one pgbaton.lease_attempt_all: the grants it
// made, as a claim's rows, and the row of the name it refused, if any.
func Answer(rows []db.LeaseAttemptAllRow) (granted []db.LeaseClaimRow, refused *db.LeaseAttemptAllRow) {
	granted = make([]db.LeaseClaimRow, 0, len(rows))
	for i, r := range rows {
		if r.Acquired {
			granted = append(granted, db.LeaseClaimRow{Name: r.Name, Token: r.Token, ExpiresAt: r.ExpiresAt})
		} else {
			refused = &rows[i]
		}
	}
	return granted, refused
}
