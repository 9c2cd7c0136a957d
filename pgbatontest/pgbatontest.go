// Package pgbatontest makes, in a user's own tests, the faults a service on
// pgbaton must survive, at once instead of after a TTL: a lease lost as if
// it expired, as if the database clock stepped past it, or as if another
// process took it over; an operator's forced release; a leader change. It
// also tells who holds what.
//
// Every helper works on a real server through the pool the code under test
// uses (no mock of pgbaton): it makes in the database what the real fault
// would leave there, and tells the lease's client at once, so that
// Lease.Done is closed and Lease.Err says why when the helper returns.
// Nothing sleeps; ChangeLeader waits, up to ctx, for another term to
// begin.
//
//	l, _ := client.Acquire(ctx, "nightly-report")
//	go job(l)                                   // the code under test
//	pgbatontest.TakeOver(ctx, l, "other-node")  // as if it lost the lease
//	// job must stop: its fenced writes now fail with the old token.
//
// The helpers return errors wrapping pgbaton.ErrInvalidArgument for bad
// input and leasetable.ErrNotHeld when the lease is not held any more (a
// fault needs a live grant); the Require helpers fail the test instead.
// ForceRelease and ChangeLeader write the audit row an operator's release
// writes, and need what it needs: a superuser or a member of pgbaton_admin.
package pgbatontest

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/leasefault"
	"github.com/pgbaton/pgbaton/internal/pgerr"
	"github.com/pgbaton/pgbaton/leasetable"
)

// Expire ends l as if its TTL ran out while its holder was paused: the
// database sees it expired (the next Acquire is granted at once, or once
// the lock-delay l was granted with has passed, with a larger token; the
// old token's fenced writes fail), its waiters are woken, and l's client
// has lost it: l.Err wraps leasetable.ErrLeaseLost.
func Expire(ctx context.Context, l *leasetable.Lease) error {
	return expire(ctx, l, leasetable.CauseExpired)
}

// StepClock ends l as if the database's clock stepped forward past its
// expiry: in the database as Expire, and l.Err wraps
// leasetable.ErrClockStep beside leasetable.ErrLeaseLost.
func StepClock(ctx context.Context, l *leasetable.Lease) error {
	return expire(ctx, l, leasetable.CauseClockStep)
}

func expire(ctx context.Context, l *leasetable.Lease, cause string) error {
	f, err := fault(l)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, f.Pool, func(tx pgx.Tx) error {
		group, err := db.New().TestkitExpire(ctx, tx, db.TestkitExpireParams{Name: f.Name, Token: f.Token})
		if err != nil {
			return notHeld(f, err)
		}
		return db.New().TestkitNotify(ctx, tx, names(f.Name, group.String))
	})
	if err != nil {
		return err
	}
	f.Lose(cause)
	return nil
}

// TakeOver gives l to owner, as if owner took it over after l's holder was
// paused past its expiry: owner holds it with a new, larger token (which
// TakeOver returns) for l's client's TTL, without a session to keep it
// alive, and l's client has lost it: l.Err wraps leasetable.ErrLeaseLost
// and leasetable.ErrNotHeld.
func TakeOver(ctx context.Context, l *leasetable.Lease, owner string) (token int64, err error) {
	f, err := fault(l)
	if err != nil {
		return 0, err
	}
	if owner == "" {
		return 0, fmt.Errorf("%w: pgbatontest: empty owner", pgbaton.ErrInvalidArgument)
	}
	err = pgx.BeginFunc(ctx, f.Pool, func(tx pgx.Tx) error {
		row, err := db.New().TestkitTakeOver(ctx, tx, db.TestkitTakeOverParams{
			NewOwner: owner, TtlMs: f.TTL.Milliseconds(), Name: f.Name, Token: f.Token})
		if err != nil {
			return notHeld(f, err)
		}
		token = row.Token.Int64
		return nil
	})
	if err != nil {
		return 0, err
	}
	f.Lose(leasetable.CauseSuperseded)
	return token, nil
}

// ForceRelease frees l as `pgbaton release NAME --reason reason` does: a
// new token (the old one's fenced writes fail), the waiters woken, an
// audit row in pgbaton.event; and l's client has lost it: l.Err wraps
// leasetable.ErrLeaseLost and leasetable.ErrNotHeld.
func ForceRelease(ctx context.Context, l *leasetable.Lease, reason string) error {
	f, err := fault(l)
	if err != nil {
		return err
	}
	err = pgx.BeginFunc(ctx, f.Pool, func(tx pgx.Tx) error {
		// Only l's own grant: a later holder's is not this fault's.
		tok, err := db.New().TestkitLockToken(ctx, tx, f.Name)
		if err == nil && tok.Int64 != f.Token {
			err = pgx.ErrNoRows
		}
		if err != nil {
			return notHeld(f, err)
		}
		_, err = db.New().TestkitForceRelease(ctx, tx, db.TestkitForceReleaseParams{Name: f.Name, Reason: reason})
		return notHeld(f, err)
	})
	if err != nil {
		return err
	}
	f.Lose(leasetable.CauseSuperseded)
	return nil
}

// ChangeLeader ends the current term of election name as an operator's
// forced release does (audited, with reason), and waits, up to ctx, until
// a new term begins: some candidate, maybe the old leader's client again,
// holds the election with a larger token. It returns the new holder. The
// old leader's client learns of the loss at its next keep-alive, as from a
// real forced release (within its RenewInterval): until then it may still
// believe it leads, which is what fencing its writes with the term is
// for. With a single candidate, the new term begins only after that: give
// the test's clients a short TTL. ErrNoLeader when nobody leads name.
func ChangeLeader(ctx context.Context, pool *pgxpool.Pool, name, reason string) (Holding, error) {
	if pool == nil || name == "" {
		return Holding{}, fmt.Errorf("%w: pgbatontest: nil pool or empty election name", pgbaton.ErrInvalidArgument)
	}
	var ended int64
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		row, err := db.New().TestkitForceRelease(ctx, tx, db.TestkitForceReleaseParams{Name: name, Reason: reason})
		ended = row.NewToken
		return err
	})
	if pgerr.Code(err) == pgerr.NotFound {
		return Holding{}, fmt.Errorf("pgbatontest: end the term of %q: %w", name, leasetable.ErrNoLeader)
	}
	if err != nil {
		return Holding{}, fmt.Errorf("pgbatontest: end the term of %q: %w", name, err)
	}
	for {
		h, err := Holder(ctx, pool, name)
		if err != nil {
			return Holding{}, err
		}
		if h.Held && h.Token > ended {
			return h, nil
		}
		select {
		case <-ctx.Done():
			return Holding{}, fmt.Errorf("pgbatontest: no new term of %q began: %w", name, context.Cause(ctx))
		case <-time.After(pollEvery):
		}
	}
}

// pollEvery is how often ChangeLeader looks for the new term: a candidate
// takes it within one wake-up of the release.
const pollEvery = 5 * time.Millisecond

// Holding is what the database says of a lease now.
type Holding struct {
	Held      bool
	Owner     string    // the last holder's owner, also after it expired; "" when free
	Token     int64     // the last token granted; 0 before the first grant
	ExpiresAt time.Time // zero when free
}

// Holder reads lease name from pgbaton.lease_status. A name with no row
// is free.
func Holder(ctx context.Context, pool *pgxpool.Pool, name string) (Holding, error) {
	if pool == nil || name == "" {
		return Holding{}, fmt.Errorf("%w: pgbatontest: nil pool or empty lease name", pgbaton.ErrInvalidArgument)
	}
	row, err := db.New().TestkitHolder(ctx, pool, name)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return Holding{}, nil
	case err != nil:
		return Holding{}, fmt.Errorf("pgbatontest: read lease %q: %w", name, err)
	}
	h := Holding{Held: row.Held.Bool, Owner: row.Owner.String, Token: row.Token.Int64}
	if row.ExpiresAt != nil {
		h.ExpiresAt = *row.ExpiresAt
	}
	return h, nil
}

// TB is the part of testing.TB the Require helpers use.
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// RequireHeld fails t unless owner holds lease name now; it returns the
// holder's token.
func RequireHeld(t TB, pool *pgxpool.Pool, name, owner string) int64 {
	t.Helper()
	h, err := Holder(context.Background(), pool, name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if !h.Held || h.Owner != owner {
		t.Fatalf("pgbatontest: lease %q: want held by %q, is %s", name, owner, h)
	}
	return h.Token
}

// RequireFree fails t if anyone holds lease name now.
func RequireFree(t TB, pool *pgxpool.Pool, name string) {
	t.Helper()
	h, err := Holder(context.Background(), pool, name)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if h.Held {
		t.Fatalf("pgbatontest: lease %q: want free, is %s", name, h)
	}
}

// String says who holds it, for test failures.
func (h Holding) String() string {
	if !h.Held {
		return "free"
	}
	return fmt.Sprintf("held by %q with token %d until %s", h.Owner, h.Token, h.ExpiresAt.Format(time.RFC3339Nano))
}

func fault(l *leasetable.Lease) (leasefault.Lease, error) {
	if l == nil {
		return leasefault.Lease{}, fmt.Errorf("%w: pgbatontest: nil lease", pgbaton.ErrInvalidArgument)
	}
	if err := l.Err(); err != nil {
		return leasefault.Lease{}, fmt.Errorf("pgbatontest: lease %q already ended: %w", l.Name(), err)
	}
	return leasefault.Of(l), nil
}

// notHeld says that the grant the fault needs is not held (any more).
func notHeld(f leasefault.Lease, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, pgx.ErrNoRows) || pgerr.Code(err) == pgerr.NotFound {
		return fmt.Errorf("pgbatontest: %w: %q token %d", leasetable.ErrNotHeld, f.Name, f.Token)
	}
	return fmt.Errorf("pgbatontest: %q token %d: %w", f.Name, f.Token, err)
}

func names(name, group string) []string {
	if group == "" {
		return []string{name}
	}
	return []string{name, group}
}
