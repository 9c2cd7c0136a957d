package leasetable

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/inflight"
	"github.com/pgbaton/pgbaton/internal/lockset"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// MaxSetNames bounds the names of one lease set (AcquireAll,
// TryAcquireAll); pgbaton.lease_attempt_all refuses more too.
const MaxSetNames = 1000

// LeaseSet is leases granted together by AcquireAll or TryAcquireAll:
// every name of the set, each with its own grant and token. The leases
// live and end one by one, as any Lease does; the set's Context ends when
// the first of them ends. Its methods are safe for concurrent use.
type LeaseSet struct {
	c      *Client
	leases []*Lease // in the order taken: names in byte order
	ends   *lockset.Ends[*Lease]
}

// Leases are the set's leases, in the order they were taken: their names
// in byte order.
func (s *LeaseSet) Leases() []*Lease { return slices.Clone(s.leases) }

// Lease is the set's lease of name, or nil when the set has none.
func (s *LeaseSet) Lease(name string) *Lease {
	if i, ok := slices.BinarySearchFunc(s.leases, name, func(l *Lease, n string) int { return strings.Compare(l.name, n) }); ok {
		return s.leases[i]
	}
	return nil
}

// Err is nil while every lease of the set is held, then the Err of the
// first that ended (wrapping ErrLeaseLost or ErrReleased). Like
// Lease.Err, it is non-nil from the instant a lease's local deadline
// passes.
func (s *LeaseSet) Err() error { return s.ends.Err() }

// Done is closed when the first lease of the set ends.
func (s *LeaseSet) Done() <-chan struct{} { return s.ends.Done() }

// Context is cancelled when the first lease of the set ends, with that
// lease's Err as its cause: run work that needs the whole set under it.
func (s *LeaseSet) Context() context.Context { return s.ends.Context() }

// Release gives back every lease of the set in one round trip, as
// Lease.Release gives back one: each ends first, then the database frees
// the rows and waiters are woken. Leases released or lost before are
// left as they are. It returns the error of the round trip when it could
// not reach the database (Client.Close tries again), else the leases'
// ErrNotHeld errors (taken over before the release) joined.
func (s *LeaseSet) Release(ctx context.Context) error {
	if err := s.c.releaseSet(ctx, s.leases); err != nil {
		return err
	}
	var errs []error
	for _, l := range s.leases {
		errs = append(errs, l.st.Load().ReleaseErr)
	}
	return errors.Join(errs...)
}

func (c *Client) newLeaseSet(leases []*Lease) *LeaseSet {
	// A lease's own context ends when the keeper sees it lost, or at its
	// release; Err looks at the deadlines in between.
	return &LeaseSet{c: c, leases: leases, ends: lockset.Watch(leases, func(l *Lease) context.Context { return l.context() })}
}

// releaseSet gives back leases in one round trip; what cannot be given
// back now goes to the keeper, tried again after the next keep-alive.
func (c *Client) releaseSet(ctx context.Context, leases []*Lease) error {
	stopped := stopReleased(leases)
	err := c.releaseAll(ctx, stopped, nil)
	if err != nil {
		c.k.giveBack(stopped)
	}
	return err
}

// setNames checks the names of a lease set and returns them in byte
// order (lockset.Names).
func setNames(names []string) ([]string, error) {
	return lockset.Names(names, MaxSetNames, func(n string) error { return checkName("lease name", n) })
}

// TryAcquireAll takes every lease named, or none, in one statement
// (pgbaton.lease_attempt_all): each is granted as TryAcquire would grant
// it, with its own token, and if any is held, or free but waited for, the
// grants made before it are rolled back and it returns a *HeldError
// (errors.Is ErrHeld) for that name. The names are taken in byte order,
// so calls for {a, b} and {b, a} never deadlock. An empty set, a name
// given twice, an invalid name or more than MaxSetNames names are refused
// (pgbaton.ErrInvalidArgument) before anything is sent.
func (c *Client) TryAcquireAll(ctx context.Context, names ...string) (*LeaseSet, error) {
	sorted, err := setNames(names)
	if err != nil {
		return nil, err
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	leases, held, err := c.trySet(ctx, sorted, false, time.Now())
	switch {
	case err != nil:
		return nil, err
	case held != nil:
		return nil, held
	}
	return c.newLeaseSet(leases), nil
}

// AcquireAll takes every lease named, or none, waiting while any is held
// or waited for. The names are taken in byte order (Go's string order,
// PostgreSQL's COLLATE "C"), holding those taken while it waits in the
// queue of the next: every caller takes its names in that one order, so
// no two sets wait for each other in a cycle ({a, b} and {b, a} never
// deadlock), and each queue serves the oldest waiter first, so no set is
// overtaken forever. The names up to the first one held go in one round
// trip (pgbaton.lease_attempt_all, keeping the prefix), and so does the
// rest after each wait: a set nothing is in the way of is granted in one.
//
// When it fails (ctx ended, the client closed, a database error, or a
// lease taken early was lost while a later one was waited for, as far as
// the client knows: a forced release reaches it at the next keep-alive,
// as for any lease), the leases it had taken are given back before it
// returns: the caller holds all of the set or none of it. Bad input is
// refused as TryAcquireAll refuses it.
func (c *Client) AcquireAll(ctx context.Context, names ...string) (*LeaseSet, error) {
	sorted, err := setNames(names)
	if err != nil {
		return nil, err
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	start := time.Now()
	leases, err := lockset.Take(sorted, func(rest []string) ([]*Lease, string, error) {
		got, held, err := c.trySet(ctx, rest, true, start)
		if held == nil {
			return got, "", err
		}
		return got, held.Name, err
	}, func(name string) (*Lease, error) { return c.acquire(ctx, name, nil, 0) })
	if err != nil {
		_ = c.releaseSet(ctx, leases)
		return nil, fmt.Errorf("leasetable: acquire lease set %s: %w", quoteNames(sorted, 10), err)
	}
	return c.newLeaseSet(leases), nil
}

// trySet tries once to take names (checked and sorted), in one round
// trip, with the span and metrics of an attempt: the leases granted and,
// when a name was refused, why. Without keepPrefix a refusal leaves
// nothing granted; with it, the names before the refused one are granted.
func (c *Client) trySet(ctx context.Context, names []string, keepPrefix bool, waitStart time.Time) (leases []*Lease, held *HeldError, err error) {
	start := time.Now()
	ctx, span := c.tr.Start(ctx, spanAcquire, "lease")
	leases, held, err = c.attemptSet(ctx, names, keepPrefix, waitStart)
	switch {
	case held != nil:
		c.attemptFailed(ctx, held.Name, held, start)
	case err != nil:
		c.attemptFailed(ctx, names[0], err, start)
	}
	if span.IsRecording() {
		if err == nil && held != nil {
			err = held
		}
		c.endGrant(span, telemetry.NameKey, strings.Join(names, " "), start, leases, err)
	}
	return leases, held, err
}

// attemptSet is attempt for a set: sent so that a caller that gives up
// holds nothing of it (inFlight), safe to send again after a broken
// connection (the request id).
func (c *Client) attemptSet(ctx context.Context, names []string, keepPrefix bool, waitStart time.Time) ([]*Lease, *HeldError, error) {
	start := time.Now() // before the request: the local deadlines count from here
	s, err := c.sessionFor(ctx)
	if err != nil {
		return nil, nil, err
	}
	defer c.k.unuse()
	p := db.LeaseAttemptAllParams{Names: names, Owner: c.cfg.Owner, TtlMs: c.ttlMs, Session: s.Param(), Ref: inflight.NewRef(), KeepPrefix: keepPrefix,
		LockDelayMs: c.cfg.lockDelayMs()}
	rows, err := grant(c, ctx, s, p.Ref, nil, "acquire lease set "+quoteNames(names, 10), func(ctx context.Context) ([]db.LeaseAttemptAllRow, error) {
		return c.q.LeaseAttemptAll(ctx, c.pool, p)
	}, func(rows []db.LeaseAttemptAllRow) bool {
		// Grants come first: the first row says whether any was made.
		return len(rows) == 0 || rows[0].Acquired
	})
	if err != nil {
		return nil, nil, err
	}
	granted, r := lockset.Answer(rows)
	var held *HeldError
	if r != nil {
		if r.Grace {
			c.startGrace(ctx)
		}
		held = &HeldError{Name: r.Name, Holder: r.Holder, Token: r.Token, ExpiresAt: r.ExpiresAt,
			Grace: r.Grace, LockDelay: r.LockDelay, Ahead: int(r.Ahead), remaining: r.ExpiresAt.Sub(r.DbNow)}
	}
	if len(granted) == 0 {
		return nil, held, nil
	}
	leases, err := c.track("", granted, s, start, waitStart)
	return leases, held, err
}
