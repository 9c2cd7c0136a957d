package session

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/internal/db"
)

// DB is how a client's sessions reach the database: its statements on the
// sessions of Owner, of TTLms by the database's clock and Local locally
// (the TTL less the safety margin).
type DB struct {
	Queries *db.Queries
	Pool    *pgxpool.Pool
	// Retry runs op and, if a fresh connection may cure its failure, once
	// more (repeatable: even after a broken connection).
	Retry func(ctx context.Context, repeatable bool, op func(context.Context) error) error
	Owner string
	TTLms int64
	Local time.Duration
}

// Open opens a lease session. A repeat after a broken connection may
// leave a session unused until its TTL.
func (d DB) Open(ctx context.Context) (*Session, error) {
	start := time.Now()
	var row db.SessionOpenRow
	err := d.Retry(ctx, true, func(ctx context.Context) (err error) {
		row, err = d.Queries.SessionOpen(ctx, d.Pool, db.SessionOpenParams{Owner: d.Owner, TtlMs: d.TTLms})
		return err
	})
	if err != nil {
		return nil, err
	}
	return New(row.ID, row.Epoch, start, row.ExpiresAt, time.Duration(d.TTLms)*time.Millisecond, d.Local), nil
}

// Keepalive sends s's keep-alive and returns its reply, for its owner to
// Read once Answered.
func (d DB) Keepalive(ctx context.Context, s *Session) (r Reply) {
	var row db.SessionKeepaliveRow
	r.Sent = time.Now()
	r.Err = d.Retry(ctx, true, func(ctx context.Context) (err error) {
		row, err = d.Queries.SessionKeepalive(ctx, d.Pool, db.SessionKeepaliveParams{ID: s.ID, TtlMs: d.TTLms})
		return err
	})
	r.Replied = time.Now()
	r.Alive, r.Expires, r.Revoked, r.Epoch, r.DBNow = row.Alive, row.ExpiresAt, row.Revoked, row.Epoch, row.ServerNow
	return r
}

// Lost returns which of the grants (names, tokens) of s the database no
// longer has: force-released, or lost with the old primary.
func (d DB) Lost(ctx context.Context, s *Session, names []string, tokens []int64) (map[string]bool, error) {
	lost, err := d.Queries.SessionLost(ctx, d.Pool, db.SessionLostParams{Session: s.ID, Names: names, Tokens: tokens, Owner: d.Owner})
	if err != nil {
		return nil, err
	}
	gone := make(map[string]bool, len(lost))
	for _, n := range lost {
		gone[n] = true
	}
	return gone, nil
}
