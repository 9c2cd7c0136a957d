// Package fencedwrite makes writes that a stale lock holder can never
// commit: fencing tokens (Kleppmann's fencing, Chubby's sequencers)
// enforced by PostgreSQL inside the write's own transaction.
//
// # Liveness versus safety
//
// A lease (package leasetable) or an advisory lock keeps two workers from
// doing the same work at the same time most of the time: that is liveness,
// it saves wasted work. It cannot keep a holder that was paused (a GC
// pause, a stopped VM, a network partition) past its lease from waking up
// and writing, after another worker has been granted the lease and has
// written too. Only a check at the moment of the write prevents that
// corruption: that is safety, and it is what this package gives. Because
// the lease and the data live in the same database, the check runs inside
// the write's transaction, atomically with it; a lock service outside the
// database (Redis, etcd, ZooKeeper, blob leases) cannot do that without the
// storage's help. Use both: the lease to decide who works, the fence to
// make sure only the current holder's writes land.
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
//   - EnableFencing installs a trigger on a table with a fence_token
//     bigint column: an UPDATE or DELETE presenting a token older than the
//     row's fails, from psql or any language. The fence is per row and
//     needs no lease row, so it protects data that outlives a lease; but a
//     stale holder that writes before the new holder's first write is not
//     caught, so read-modify-write under a lease needs Guard.
//   - PutValue, CompareAndSwapValue, GetValue and DeleteValue keep small
//     JSON values (checkpoints, cursors) in pgbaton.fenced_value, written
//     only by tokens not older than the last writer's.
//
// Every rejection is SQLSTATE PB001 in the database and a *StaleTokenError
// (errors.Is ErrStaleToken) in Go, carrying the name, the presented token
// and the current one. MapError converts errors from your own statements.
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
package fencedwrite
