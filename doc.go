// Package pgbaton is a toolkit for distributed locking that needs nothing but
// the PostgreSQL an application already runs.
//
// It has three layers, each its own package:
//
//   - advisory: session-held pg_advisory_lock on connections pgbaton owns.
//     Held exactly as long as the session lives and freed at once when the
//     holder dies. For cron singletons, leader election, "run once" sections.
//   - leasetable: rows in pgbaton.lease with an expiry by the database clock
//     and a fencing token that grows with every grant. Survives connection
//     loss and failover; visible to operators. For long jobs, sharded work,
//     work items, semaphores, leader election with terms.
//   - fencedwrite: guarded writes that the database rejects when they carry a
//     stale token, atomically, in the write's own transaction.
//
// Liveness versus safety: an advisory lock or a lease prevents wasted
// duplicate work; only a fenced write prevents corruption when a holder is
// paused past its lease.
//
// This package holds what the layers share: the errors every layer returns
// for unsafe setups and bad input. Package migrations installs the schema.
package pgbaton
