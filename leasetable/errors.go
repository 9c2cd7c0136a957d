package leasetable

import (
	"errors"
	"fmt"
	"time"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/pgerr"
)

var (
	// ErrHeld is returned by TryAcquire when another grant is live. The
	// error is a *HeldError that says who holds the lease and until when.
	ErrHeld = errors.New("leasetable: lease is held")

	// ErrLeaseLost is the cause of a lease's context when it ended without
	// Release: a renewal was refused or the local deadline passed first.
	// Stop work done under the lease; another holder may have it now.
	ErrLeaseLost = errors.New("leasetable: lease lost")

	// ErrClockStep is wrapped, beside ErrLeaseLost, by the cause of a lease
	// lost because the database's wall clock stepped forward by more than
	// Config.SafetyMargin (an NTP step, a VM resume): the database may have
	// let it go before its local deadline (see the package doc).
	ErrClockStep = errors.New("leasetable: database clock stepped forward")

	// ErrReleased is the cause of a lease's context after Release or
	// Complete.
	ErrReleased = errors.New("leasetable: lease released")

	// ErrNotHeld means that a call found the lease no longer held by this
	// grant, so it changed nothing: Renew, Release and Complete return it
	// when the database no longer has the grant (it expired and was taken
	// over, or was released), Complete also after Release or a loss. It is
	// the same condition as advisory.ErrNotHeld. A loss itself (the cause
	// of the lease's context) is ErrLeaseLost.
	ErrNotHeld = errors.New("leasetable: lease no longer held by this grant")

	// ErrNoLeader is returned by Client.Leader when nobody holds the
	// election's lease.
	ErrNoLeader = errors.New("leasetable: no leader")

	// ErrDrained is returned by ClaimUntilDrained when the group holds no
	// item any more: every item registered in it was completed.
	ErrDrained = errors.New("leasetable: group drained")

	// ErrResignRequested is wrapped by Leadership.ResignReason, and by the
	// cause of a Campaign term's context, when someone asked the leader to
	// step down.
	ErrResignRequested = errors.New("leasetable: leader asked to resign")
)

// HeldError is the error TryAcquire returns when someone else holds the
// lease; when nobody does but callers wait for it (Ahead is their number,
// Holder empty: a free lease goes to the oldest waiter, as etcd's TryLock
// refuses a lock with waiters queued); or when nobody does but a failover
// grace holds every grant back (Grace is true, Holder empty, ExpiresAt the
// grace's end: a grant the old primary made may be lost, and its holder
// may still be working until then); or when the last grant was lost and
// its lock-delay has not ended (LockDelay is true, Holder and Token the
// lost grant's, ExpiresAt the delay's end: Config.LockDelay).
// errors.Is(err, ErrHeld) is true for it.
type HeldError struct {
	Name      string    // the lease asked for
	Holder    string    // owner of the live grant (with LockDelay: of the lost one)
	Token     int64     // token of the live grant (with LockDelay: of the lost one)
	ExpiresAt time.Time // when the grant expires unless renewed, database clock
	Grace     bool      // not granted for a failover grace, until ExpiresAt
	LockDelay bool      // not granted for the lock-delay of Holder's lost grant, until ExpiresAt
	Ahead     int       // callers queued for the lease before this one: for a free lease, or a caller that waits

	// remaining is ExpiresAt minus the database clock when it was read, so a
	// waiter needs no agreement between clocks.
	remaining time.Duration
}

func (e *HeldError) Error() string {
	if e.Grace {
		return fmt.Sprintf("leasetable: lease %q is not granted before %s: failover grace (a grant the previous primary made may be lost, and its holder working)",
			e.Name, e.ExpiresAt.Format(time.RFC3339Nano))
	}
	if e.LockDelay {
		return fmt.Sprintf("leasetable: lease %q is in lock-delay until %s: %q (token %d) lost it, and may still be finishing its writes",
			e.Name, e.ExpiresAt.Format(time.RFC3339Nano), e.Holder, e.Token)
	}
	if e.Holder == "" && e.Ahead > 0 {
		return fmt.Sprintf("leasetable: lease %q is free but %d waiting callers are queued for it first", e.Name, e.Ahead)
	}
	return fmt.Sprintf("leasetable: lease %q is held by %q (token %d) until %s",
		e.Name, e.Holder, e.Token, e.ExpiresAt.Format(time.RFC3339Nano))
}

// Is makes errors.Is(err, ErrHeld) true.
func (e *HeldError) Is(target error) bool { return target == ErrHeld }

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{pgbaton.ErrInvalidArgument}, args...)...)
}

// dbError maps server errors to the shared sentinels, keeping the cause,
// and logs refusals: they need an operator, not a retry.
func (c *Client) dbError(op string, err error) error {
	err = mapDBError(op, err)
	if errors.Is(err, pgbaton.ErrStandby) || errors.Is(err, pgbaton.ErrNotMigrated) {
		c.log.Error("pgbaton: database refused leasetable", "op", op, "error", err)
	}
	return err
}

func mapDBError(op string, err error) error {
	if mapped, ok := pgerr.Map(op, err); ok {
		return mapped
	}
	return fmt.Errorf("leasetable: %s: %w", op, err)
}
