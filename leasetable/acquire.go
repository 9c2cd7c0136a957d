package leasetable

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/inflight"
	"github.com/pgbaton/pgbaton/internal/leasestate"
	"github.com/pgbaton/pgbaton/internal/listener"
	"github.com/pgbaton/pgbaton/internal/pgerr"
	"github.com/pgbaton/pgbaton/internal/session"
	"github.com/pgbaton/pgbaton/internal/telemetry"
)

// TryAcquire takes the lease name if nobody holds a live grant of it and
// nobody waits for it, in one round trip. When someone holds it, it
// returns a *HeldError (errors.Is ErrHeld) naming the holder and the
// grant's expiry; when it is free but callers wait for it (a free lease
// goes to the oldest waiter), the *HeldError's Ahead says how many.
func (c *Client) TryAcquire(ctx context.Context, name string) (*Lease, error) {
	if err := checkName("lease name", name); err != nil {
		return nil, err
	}
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	return first(c.once(ctx, spanAcquire, telemetry.NameKey, name, func(ctx context.Context, start time.Time) ([]*Lease, error) {
		return c.attempt(ctx, name, nil, start, nil)
	}))
}

// attempt tries once to take name, as waiter w of its queue (nil: behind
// every waiter). waitStart is when the caller began asking, for the
// wait-duration metric of a grant.
func (c *Client) attempt(ctx context.Context, name string, metadata []byte, waitStart time.Time, w *listener.Waiter) ([]*Lease, error) {
	// The local deadline counts from before the request is sent: the
	// database's expiry can only be later.
	start := time.Now()
	s, err := c.sessionFor(ctx)
	if err != nil {
		return nil, err
	}
	defer c.k.unuse()
	// The request id makes the attempt safe to send again after a broken
	// connection: a repeat finds the grant the first one made.
	p := db.LeaseAttemptParams{Name: name, Owner: c.cfg.Owner, TtlMs: c.ttlMs, Metadata: metadata, Session: s.Param(), Ref: inflight.NewRef(), Waiter: w.Param(), LockDelayMs: c.cfg.lockDelayMs(),
		Rank: w.RankParam(), Polls: w.Polls()}
	row, err := grant(c, ctx, s, p.Ref, w, "acquire "+name, func(ctx context.Context) (db.LeaseAttemptRow, error) {
		return c.q.LeaseAttempt(ctx, c.pool, p)
	}, func(row db.LeaseAttemptRow) bool { return row.Acquired })
	if err != nil {
		return nil, err
	}
	if !row.Acquired {
		if row.GraceUntil != nil {
			c.startGrace(ctx)
		}
		return nil, &HeldError{Name: name, Holder: row.Holder, Token: row.Token, ExpiresAt: row.ExpiresAt,
			Grace: row.GraceUntil != nil, LockDelay: row.LockDelayUntil != nil, Ahead: int(row.Ahead), remaining: row.ExpiresAt.Sub(row.DbNow)}
	}
	return c.track("", []db.LeaseClaimRow{{Name: name, Token: row.Token, ExpiresAt: row.ExpiresAt}}, s, start, waitStart)
}

// track creates the Leases for grants made in one round trip, bound to
// session s, records each as an acquired attempt and has the keeper keep
// them. If the client closed while they were in flight, they are given
// back at once and it returns pgbaton.ErrClosed.
func (c *Client) track(group string, rows []db.LeaseClaimRow, s *session.Session, start, waitStart time.Time) ([]*Lease, error) {
	leases := newLeases(c, group, rows, s, start)
	if !c.k.add(leases) {
		for _, l := range leases {
			l.transition(leasestate.Released, fmt.Errorf("%w: %q token %d: client closed", ErrReleased, l.name, l.token), "")
		}
		// Best effort, as Close gives back what it holds: the session ends
		// with the client, so what fails here expires at its TTL.
		if err := c.releaseAll(context.Background(), nil, leases); err != nil {
			c.log.Warn("pgbaton: giving back grants that arrived after Close failed", "error", err)
		}
		return nil, pgbaton.ErrClosed
	}
	for _, l := range leases {
		c.tel.AttemptSince(context.Background(), l.metricName(), telemetry.Acquired, waitStart)
	}
	return leases, nil
}

// inFlight sends a statement that may grant leases so that no grant is
// left to a caller that gave up (internal/inflight): send's context is
// bounded by the TTL (a later reply is of no use), abandoned's by
// ReleaseTimeout, and Close waits for both.
//
// The statements a wait sends between its looks (the waiter's
// registration, the listen-slot question, a group's next expiry, a lease
// session's opening) go through here too, with abandoned nil when a reply
// nobody reads needs no cleanup: a wait normally ends by its context, and
// each one given up mid-statement would otherwise cost the pool a
// connection (TestWaitsGivenUpCloseNoPoolConnection).
func inFlight[T any](c *Client, ctx context.Context, send func(context.Context) (T, error), abandoned func(context.Context, T, error)) (T, error) {
	v, _, err := inflight.Send(ctx, c.k, c.cfg.TTL, c.cfg.ReleaseTimeout, send, abandoned)
	return v, err
}

// grant sends a statement that may grant leases in session s under
// request id ref (inFlight), once more on a fresh connection when that may
// cure its failure (retry: the request id makes it safe to repeat), and
// has the keeper give back by ref what it granted, or may have granted, to
// a caller that gave up or whose reply was lost (a broken connection): the
// grant is bound to the session, so without that it would be kept alive
// with it. op names the statement in its error.
//
// The statement counts a use of s (sessionFor) of its own, which the
// give-back of a caller that gave up ends: the session is not closed idle
// before that give-back is queued, as it finds the grants by their
// session.
//
// w is the waiter the statement looks as (nil for none). A look puts a
// waiter that is not queued at the end of the queue (requeue), so one that
// comes back after its caller gave up may have queued the waiter again
// after the caller's stop removed it: it is removed once more then.
func grant[T any](c *Client, ctx context.Context, s *session.Session, ref pgtype.UUID, w *listener.Waiter, op string, send func(context.Context) (T, error), granted func(T) bool) (T, error) {
	c.k.using.Add(1)
	v, gaveUp, err := inflight.Send(ctx, c.k, c.cfg.TTL, c.cfg.ReleaseTimeout, func(ctx context.Context) (v T, err error) {
		err = c.retry(ctx, true, func(ctx context.Context) (err error) {
			v, err = send(ctx)
			return err
		})
		return v, err
	}, func(_ context.Context, v T, err error) {
		if err != nil || granted(v) {
			c.k.giveBackRef(s, ref)
		}
		if w != nil {
			c.ln.Leave(w.Name, w.ID)
		}
		c.k.unuse()
	})
	if !gaveUp {
		c.k.using.Add(-1) // the caller's use goes on
	}
	if f, _ := pgerr.Classify(context.Background(), err); f == pgerr.Ambiguous {
		c.k.giveBackRef(s, ref)
	}
	if err != nil {
		return v, c.dbError(op, err)
	}
	return v, nil
}

// releaseRef gives back whatever request ref granted in session s, when
// its reply was lost or its caller gave up without knowing the tokens.
// ctx bounds it: ReleaseTimeout in the keeper's queue, Close's own bound
// at Close.
func (c *Client) releaseRef(ctx context.Context, s *session.Session, ref pgtype.UUID) error {
	var freed []string
	err := c.retry(ctx, true, func(ctx context.Context) (err error) {
		freed, err = c.q.LeaseReleaseRef(ctx, c.pool, db.LeaseReleaseRefParams{Owner: c.cfg.Owner, Session: s.ID, Ref: ref})
		return err
	})
	c.notifyWaiters(ctx, freed)
	return err
}

// Acquire takes the lease name, waiting while someone else holds it or
// others wait for it before this call: waiters queue in the database and
// are served in the order they came (the package doc, "Waiting"). It
// wakes when its turn comes (LISTEN/NOTIFY on the client's one listening
// connection) or at the holder's known expiry plus a little jitter; with
// Config.NoListen, or where notifications are not delivered, it looks
// again every Config.PollInterval instead, keeping its place. It returns
// ctx's error when ctx ends first: the caller did not get the lease, and
// left the queue.
func (c *Client) Acquire(ctx context.Context, name string) (*Lease, error) {
	if err := checkName("lease name", name); err != nil {
		return nil, err
	}
	return c.acquire(ctx, name, nil, 0)
}

// acquire waits for name as a candidate of rank rank (0 but for an
// election's preferred candidates).
func (c *Client) acquire(ctx context.Context, name string, metadata []byte, rank int32) (*Lease, error) {
	if err := c.checkOpen(); err != nil {
		return nil, err
	}
	start := time.Now()
	return first(c.waitCall(ctx, spanAcquire, telemetry.NameKey, start, want{kind: "lease", name: name, rank: rank, look: func(ctx context.Context, w *listener.Waiter) ([]*Lease, error) {
		return c.attempt(ctx, name, metadata, start, w)
	}}))
}
