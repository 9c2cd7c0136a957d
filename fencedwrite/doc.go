// Package fencedwrite makes writes that a stale lock holder can never
// commit: fencing tokens (Kleppmann's fencing, Chubby's sequencers)
// enforced by PostgreSQL inside the write's own transaction.
//
// # Liveness versus safety
//
// A lease (package leasetable) or an advisory lock keeps two workers from
// doing the same work at the same time most of the time: that is liveness.
// It cannot keep a holder that was paused (a GC pause, a stopped VM, a
// network partition) past its lease from waking up and writing after
// another worker was granted the lease. Only a check at the moment of the
// write prevents that corruption: that is safety, and it is what this
// package gives. Because the lease and the data live in the same database,
// the check runs inside the write's transaction, atomically with it. Use
// both: the lease to decide who works, the fence to make sure only the
// current holder's writes land. See [Fenced writes] and [Safety].
//
// # Three ways to fence
//
//   - Guard (and InTx, which wraps begin, Guard, your function and commit)
//     checks inside the transaction that the lease is held with exactly
//     this token and not expired by the database clock, and locks the
//     lease row FOR SHARE until the transaction ends. A takeover, renewal
//     or release of the lease updates that row, so it waits until the
//     guarded transaction has committed or rolled back: every write made
//     after a successful Guard commits while the token is current, or not
//     at all. The SQL twin, usable from any client and inside any
//     statement, is pgbaton.assert_token(name, token).
//   - EnableFencing installs triggers on a table with a fence_token
//     bigint column: every UPDATE or DELETE of a fenced row must present a
//     token not older than the row's, from psql or any language. An UPDATE
//     presents the fence_token it assigns (SET ..., fence_token = $token),
//     any write the transaction's token (SetToken, or
//     pgbaton.present_token($token) inside the statement, as in DELETE
//     ... WHERE id = $1 AND pgbaton.present_token($2)). A write that
//     presents none fails: a forgotten token is a bug, not a pass. The
//     fence is per row and needs no lease row, so it protects data that
//     outlives a lease; but a stale holder that writes before the new
//     holder's first write is not caught, so read-modify-write under a
//     lease needs Guard.
//   - PutValue, CompareAndSwapValue, GetValue and DeleteValue keep small
//     JSON values (checkpoints, cursors) in pgbaton.fenced_value, written
//     only by tokens not older than the last writer's.
//
// Every rejection is SQLSTATE PB001 in the database and a *StaleTokenError
// (errors.Is ErrStaleToken) in Go, carrying the name, the presented token,
// the current one and the Reason (ReasonSuperseded, ReasonExpired,
// ReasonNoLease, ...), the same words the database writes into the error's
// DETAIL for clients in other languages. A token whose lease row is gone
// (leasetable deletes the row of a completed work item) is ReasonNoLease:
// "no such lease (completed, or never granted)". MapError converts errors
// from your own statements.
//
// # Loops that cannot go wrong
//
// The fenced write loop: hold a lease, write batch by batch, each batch in
// InTx, and stop at the first stale token (ExampleInTx_loop):
//
//	for batch := range batches {
//		err := fencedwrite.InTx(lease.Context(), pool, lease, func(tx pgx.Tx) error {
//			return apply(ctx, tx, batch)
//		})
//		switch {
//		case errors.Is(err, fencedwrite.ErrCommitUnknown):
//			return err // maybe committed: look at the data before writing the batch again
//		case err != nil:
//			return err // nothing of this batch was written (ErrStaleToken: never retry with this token)
//		case lease.Err() != nil:
//			return lease.Err() // this batch was written, but the lease is gone now: stop
//		}
//	}
//
// For claimed work items, complete each item in the transaction of its
// effects with leasetable's Client.CompleteTx (inside InTx when the
// transaction writes anything else that must be fenced): the effects and
// the completion commit together or not at all.
//
// The idempotent consumer loop: a broker delivers at least once.
// MarkProcessed records a message id in the transaction of its work
// (pgbaton.processed_message) and reports a repeat with
// ErrAlreadyProcessed, aborting that transaction so the repeat's work
// cannot commit; a concurrent duplicate waits for the first delivery's
// transaction and learns the outcome (ExampleMarkProcessed):
//
//	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
//		if err := fencedwrite.MarkProcessed(ctx, tx, "billing", msg.ID); err != nil {
//			return err
//		}
//		return charge(ctx, tx, msg)
//	})
//	switch {
//	case err == nil, errors.Is(err, fencedwrite.ErrAlreadyProcessed):
//		msg.Ack() // done, now or before
//	default:
//		msg.Nack() // nothing committed: it comes again
//	}
//
// Records are kept for a retention (DefaultRetention, 7 days) and deleted
// in small batches by PruneProcessed, pgbaton.prune_processed or package
// retention; a message redelivered after its record is gone is processed
// again, so choose a retention longer than the broker's redelivery window.
// See [Work queues].
//
// # database/sql
//
// Guard, GuardLease, SetToken, BypassFencing and MarkProcessed take a
// pgbaton.Tx: a pgx.Tx, or a *sql.Tx (GORM's, sqlx's, lib/pq's) wrapped
// by databasesql.Wrap; the value helpers, EnableFencing and PruneProcessed
// take a pgbaton.Querier, which databasesql.WrapQuerier makes of a
// *sql.DB, *sql.Conn or *sql.Tx. InSQLTx is InTx on a *sql.DB, with the
// same answer after a lost COMMIT reply. See package databasesql.
//
// # Operators
//
// An operator who must correct data in a fenced table calls
// BypassFencing (pgbaton.bypass_fencing(table, reason)) in the
// transaction: it needs role pgbaton_admin and a reason, writes an audit
// row to pgbaton.event, and lets the rest of that transaction write that
// table without a token, rows keeping their tokens. Presenting a made-up
// large token instead would stay in the rows and lock every holder out.
// Setting pgbaton.fence_bypass by hand bypasses nothing.
//
// # Traces
//
// InTx and InSQLTx take no Config, so they trace only inside a caller's
// trace: when ctx carries a recording OpenTelemetry span, each is a span
// "pgbaton.fencedwrite.tx" under it, on that span's TracerProvider, with
// pgbaton.name, pgbaton.token and pgbaton.outcome = committed | stale |
// error. Outside a trace they start none.
//
// # Standby
//
// Fenced writes need the primary. On a standby (pg_is_in_recovery) Guard,
// GuardLease, InTx, the value writes, EnableFencing, DisableFencing,
// BypassFencing, MarkProcessed and PruneProcessed fail with an error
// wrapping pgbaton.ErrStandby; a read-only transaction on the primary
// fails with PostgreSQL's own error (SQLSTATE 25006) instead. On
// PostgreSQL 13 a value write, MarkProcessed or BypassFencing inside your
// transaction on a standby returns only PostgreSQL's 25006 error.
//
// # Isolation level
//
// The guard assumes READ COMMITTED, PostgreSQL's default, and InTx uses it.
// Under READ COMMITTED the guard's SELECT ... FOR SHARE waits for a
// takeover in progress and then checks the row as that takeover left it, so
// it always decides on the latest committed lease state, and the row lock
// keeps that state fixed until commit. REPEATABLE READ or SERIALIZABLE add
// no safety: the guarantee comes from the row lock, which is taken on the
// newest row version at every isolation level, not from the snapshot. They
// only add failures: if the lease row changed after the transaction's
// snapshot was taken (a renewal by the holder's own keeper is enough), the
// guard fails with a serialization error (SQLSTATE 40001) instead of
// passing or reporting a stale token. If you must use them, make Guard the
// transaction's first statement and retry on 40001.
//
// # Cost
//
// The check is one index lookup and one row lock on the lease row, in the
// database. Written into the statement itself,
//
//	UPDATE accounts SET balance = $3
//	 WHERE id = $1 AND pgbaton.assert_token('payouts', $2)
//
// it costs no extra round trip; Guard and InTx cost one (the guard query)
// on top of the transaction's own. In such a statement PostgreSQL may skip
// the function when no row matches the rest of the WHERE clause, so check
// the number of rows written, or call Guard first. Several transactions
// guarding the same lease at once share the row lock (PostgreSQL records
// them in a MultiXact), so guarded writers do not serialize on the lease.
//
// # Keep guarded transactions short
//
// While a guarded transaction is open, the lease row is locked: the
// holder's own renewals wait too. A transaction that runs longer than the
// lease's renew margin makes the holder's client count the lease as lost
// (its local deadline passes) although nobody else can take it until the
// transaction ends. Safety holds either way; keep guarded transactions
// well under the renew interval so liveness does too. Do not wait, inside
// a guarded transaction, for a renewal or release of the same lease made
// on another connection: it waits for you.
//
// [Fenced writes]: https://github.com/pgbaton/pgbaton/blob/main/docs/fenced-writes.md
// [Safety]: https://github.com/pgbaton/pgbaton/blob/main/docs/safety.md
// [Work queues]: https://github.com/pgbaton/pgbaton/blob/main/docs/work-queues.md
package fencedwrite
