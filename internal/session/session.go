// Package session is a lease client's lease session: a row of
// pgbaton.lease_session that keeps every lease the client holds alive with
// one keep-alive statement per renew interval while one needs it (KeepDue).
// A lease is held locally until the later of its own deadline and its
// session's, so what leases and grants read of the session (its deadline,
// its state, whether keep-alives are in trouble) are atomics read without
// asking; the rest is its owner's, the client's keeper goroutine, and not
// safe for concurrent use.
//
// The package also holds the rules its owner follows (keepalive.go): the
// client's timing, when a keep-alive is due, when the session is closed
// idle instead, what a reply means (Read: kept, gone, retried, a clock
// step, grants to look for), and, for the leases it carries, their
// deadline, whether a loss is a renewal failure and when they are overdue
// (carried.go); and its statements (DB). What a verdict does to the
// leases, and the errors their holders see, are leasetable's.
package session

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A session is alive until its owner ends it, once: dead (its local
// deadline passed, or the database no longer has it) or closed (by Close
// or after a TTL idle: a keep-alive it cancels is not a failure).
const (
	Alive uint32 = iota
	Dead
	Closed
)

// Session is one lease session.
type Session struct {
	ID int64

	// base carries the monotonic clock; deadline is an offset from it.
	base     time.Time
	deadline atomic.Int64 // time.Duration since base
	expires  atomic.Int64 // database clock, unix ns, as of the last keep-alive

	State    atomic.Uint32 // Alive, then Dead or Closed
	Failing  atomic.Bool   // the last keep-alive failed
	Inflight atomic.Bool   // a keep-alive is on its way
	Closing  atomic.Bool   // the owner is deciding to close it idle
	used     atomic.Bool   // a grant took it since the owner's last look (Use)
	looking  atomic.Int32  // waiters' looks on their way (Look)

	// The owner's own.
	KeepAt    time.Time          // when the next keep-alive is due
	Keeping   bool               // a keep-alive is on its way
	StopKeep  context.CancelFunc // ends the keep-alive on its way
	RenewedAt time.Time          // when the last successful keep-alive was sent
	IdleSince time.Time          // the first look since the last use that found it unused, or zero
	// Recheck: looking for lost grants failed; look after the next
	// keep-alive.
	Recheck bool
	revoked int64
	// epoch is the token epoch the last keep-alive saw: a new one is a
	// timeline change, which may have lost grants of a session that
	// reached the new primary itself.
	epoch int64
	// sentAt (monotonic) and dbAt (database clock) are when the last
	// request that told the database's clock was sent and ran (ClockStep).
	sentAt, dbAt time.Time
}

// New is session id of token epoch epoch, opened by a request sent at
// start that the database made expire at expires, dbTTL after its clock
// then; its local deadline is local (the TTL less the safety margin)
// after start.
func New(id, epoch int64, start, expires time.Time, dbTTL, local time.Duration) *Session {
	s := &Session{ID: id, epoch: epoch, base: start, RenewedAt: start, IdleSince: start, sentAt: start, dbAt: expires.Add(-dbTTL)}
	s.deadline.Store(int64(local))
	s.expires.Store(expires.UnixNano())
	return s
}

// Param is the session as the grant functions take it.
func (s *Session) Param() pgtype.Int8 { return pgtype.Int8{Int64: s.ID, Valid: true} }

// Until is the session's local deadline.
func (s *Session) Until() time.Time { return s.base.Add(time.Duration(s.deadline.Load())) }

// Expires is the session's expiry by the database clock, as of the last
// keep-alive.
func (s *Session) Expires() time.Time { return time.Unix(0, s.expires.Load()) }

// Carries reports whether the session keeps leases alive now: it has not
// ended and its deadline has not passed.
func (s *Session) Carries(now time.Time) bool {
	return s.State.Load() == Alive && now.Before(s.Until())
}

// Trouble reports whether keep-alives are failing or one hangs in flight:
// a loss now is a renewal failure rather than an expiry.
func (s *Session) Trouble() bool { return s.Failing.Load() || s.Inflight.Load() }

// Extend moves the session's deadline (to local after sent) and
// expiry forward after a keep-alive sent at sent found it alive (one is on
// its way at a time). Called on the keep-alive's goroutine, not when the
// owner reads the reply: a lease's Err must not see a deadline the
// keep-alive moved.
func (s *Session) Extend(sent, expires time.Time, local time.Duration) {
	if d := sent.Add(local).Sub(s.base); d > time.Duration(s.deadline.Load()) {
		s.deadline.Store(int64(d))
		s.expires.Store(expires.UnixNano())
	}
}

// Kept records a successful keep-alive's view of the session: its
// revocation count and token epoch. It reports whether grants may have
// gone since the last one: some were force-released (revoked), or the
// epoch changed (failedOver, a timeline change), or the last look for lost
// grants failed.
func (s *Session) Kept(revoked, epoch int64) (look, failedOver bool) {
	look, failedOver = revoked != s.revoked || epoch != s.epoch || s.Recheck, epoch != s.epoch
	s.revoked, s.epoch, s.Recheck = revoked, epoch, false
	return look, failedOver
}

// ClockStep returns how much further the database's clock moved than the
// client's monotonic clock since the last request that told it, up to the
// keep-alive sent at sent, answered at replied, that ran at dbNow (the
// next one's reference). The client's side counts from the earlier send
// to this reply, so a slow round trip never looks like a step
// (docs/safety.md).
func (s *Session) ClockStep(sent, replied, dbNow time.Time) time.Duration {
	step := dbNow.Sub(s.dbAt) - replied.Sub(s.sentAt)
	s.sentAt, s.dbAt = sent, dbNow
	return step
}

// Use records that a grant took the session. The owner looks only when a
// keep-alive is due, and a client that holds leases a few milliseconds at
// a time holds none then: without this, a session used all along was
// closed idle a TTL after it opened and a new one opened at the next
// grant (a fleet of 500 such clients on 2 cores: 45 sessions opened in
// 8 s, and opening and closing them were 5 of the 17 statements running
// at a time).
func (s *Session) Use() { s.used.Store(true) }

// Idle reports whether the session has been unused for ttl at now, and
// should be closed rather than kept alive for nothing; busy says it
// carries leases or is in use without one (waiters, grants on their way).
// A grant that took it since the last look (Use) counts as busy.
func (s *Session) Idle(busy bool, now time.Time, ttl time.Duration) bool {
	switch {
	case s.used.Swap(false) || busy:
		s.IdleSince = time.Time{}
	case s.IdleSince.IsZero():
		s.IdleSince = now
	default:
		return now.Sub(s.IdleSince) >= ttl
	}
	return false
}

// AwaitIdleConn waits until one of pool's connections is idle (or none is
// open) and no waiter's look is on its way (Look), for at most a quarter
// of renew or of what is left of the session, so that the keep-alive sent
// next takes that connection: sent while every connection was busy, it
// made the pool open one more for good (500 clients with pools of 2 on 2
// cores: 0.9 connections opened per client in 10 s). It only reads the
// pool's counts: AcquireAllIdle would skip the pool's stale-connection
// checks and keep connections from ageing out.
func (s *Session) AwaitIdleConn(ctx context.Context, pool *pgxpool.Pool, renew time.Duration) {
	ctx, cancel := context.WithTimeout(ctx, min(renew, time.Until(s.Until()))/idleWaitShare)
	defer cancel()
	awaitIdle(ctx, func() bool { return poolBusy(pool) || s.looking.Load() > 0 })
}

// Look is the other half of AwaitIdleConn, for a wait about to look (a
// statement on the pool): while the session's keep-alive is on
// its way and the pool has no idle connection, it waits for the keep-alive
// to end (it is bounded by the session's deadline) or ctx to; then it
// counts the look as on its way until done is called. A look sent beside
// the keep-alive made the pool open a second connection: in a fleet of
// 500 clients with pools of 2 on 2 cores, 405 of the 418 times a pool grew
// in 15 s, and backends started by the hundred while the fleet ran. A nil
// session (none open) sends no keep-alive: the look goes at once.
func (s *Session) Look(ctx context.Context, pool *pgxpool.Pool) (done func()) {
	if s == nil {
		return func() {}
	}
	for {
		s.looking.Add(1)
		if !s.Inflight.Load() || !poolBusy(pool) {
			return func() { s.looking.Add(-1) }
		}
		s.looking.Add(-1)
		awaitIdle(ctx, func() bool { return s.Inflight.Load() && poolBusy(pool) })
		if ctx.Err() != nil {
			return func() {}
		}
	}
}

// poolBusy reports that pool has connections open and none idle: a
// statement now would make it open another.
func poolBusy(pool *pgxpool.Pool) bool {
	st := pool.Stat()
	return st.IdleConns() == 0 && st.TotalConns() > 0
}

// awaitIdle waits while busy reports true, looking every idlePoll, or
// until ctx ends.
func awaitIdle(ctx context.Context, busy func() bool) {
	t := time.NewTicker(idlePoll)
	defer t.Stop()
	for busy() {
		select {
		case <-t.C:
		case <-ctx.Done():
			return
		}
	}
}

const (
	idlePoll      = 5 * time.Millisecond // how often AwaitIdleConn looks
	idleWaitShare = 4
)
