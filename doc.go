// Package pgbaton is a toolkit for distributed locking that needs nothing but
// the PostgreSQL an application already runs: no Redis, no etcd, no
// ZooKeeper.
//
// It has three layers, each its own package:
//
//   - advisory: session-held pg_advisory_lock on connections pgbaton owns.
//     Held exactly as long as the session lives, freed at once when the
//     holder dies. For "one node at a time" sections, leader election,
//     migrations.
//   - leasetable: rows of pgbaton.lease with an expiry by the database
//     clock and a fencing token that grows with every grant. Survive
//     connection loss and failover; visible to operators. For long jobs,
//     shards, work items, semaphores, leader election with terms.
//   - fencedwrite: writes that the database rejects when they carry a stale
//     token, atomically, in the write's own transaction.
//
// Built on them: jobs (cron slots run once across nodes, job runs with
// fenced checkpoints), retention (pruning of the tables outside
// leasetable's own), health (a readiness handler), databasesql (the
// transaction-scoped calls in a database/sql *sql.Tx) and migrations (the
// schema). Which call fits which job is in the [documentation index].
//
// Liveness versus safety: an advisory lock or a lease prevents wasted
// duplicate work; only a fenced write prevents corruption when a holder is
// paused past its lease. What each guarantee assumes is in [Safety].
//
// This package holds what the layers share: the errors every layer returns
// for unsafe setups and bad input, and the interfaces Querier and Tx that
// the transaction-scoped calls take (a pgx.Tx, or a *sql.Tx through
// databasesql.Wrap).
//
// The module github.com/pgbaton/pgbaton is the library alone (Go 1.25 or
// newer): a service that imports it gets pgx, the OpenTelemetry metric API
// and golang-migrate (used only by migrations.Up and Down, never linked by
// the layers) and nothing else. The admin page
// (github.com/pgbaton/pgbaton/admin), the operator's CLI
// (github.com/pgbaton/pgbaton/cmd/pgbaton) and the gocron integration
// (github.com/pgbaton/pgbaton/gocronlock) are modules of their own.
//
// # Conventions
//
// Every package of the library and the modules beside it follows these
// rules:
//
//   - Errors are tested with errors.Is and errors.As; the text around a
//     sentinel carries details and may change. Error strings start with
//     the name of the package that makes them ("advisory: ",
//     "leasetable: ", "fencedwrite: ", "jobs: ", "migrations: ",
//     "gocronlock: ", "admin: "); the sentinels every layer may return (this package's,
//     and migrations.ErrDirty) start with "pgbaton: ". An error that wraps
//     a sentinel starts with the sentinel's text and names no package
//     after it.
//   - Bad input (an empty or oversized name, a non-positive TTL, a nil
//     pool) returns an error wrapping ErrInvalidArgument and changes
//     nothing; a call on a closed Locker or Client returns ErrClosed.
//   - Work under a lock: when a lock or lease is lost while the work runs
//     (advisory's RunExclusive, leasetable's Do, jobs.Do), the error
//     returned wraps the loss (advisory.ErrLockLost,
//     leasetable.ErrLeaseLost) even when the work returned nil, and is
//     errors.Join(workErr, loss) when the work failed too.
//   - Not held versus lost: ErrNotHeld (advisory and leasetable) means a
//     call found the lock or lease no longer held by this holder and so
//     changed nothing; ErrLockLost and ErrLeaseLost are the loss itself,
//     the cause of the holder's context.
//   - Setup checks: a check that holds for a whole pool (schema version,
//     primary or standby) runs in the constructor, which then takes a
//     context (leasetable.New); a check that belongs to one connection (a
//     pooler in between) runs when that connection opens. advisory.New
//     therefore does no I/O, and a Locker's first lock returns what the
//     check of its connection found.
//   - Words: a "session" is a PostgreSQL session, a connection and its
//     backend (advisory locks are held by sessions); the row of
//     pgbaton.lease_session that keeps a leasetable client's leases alive
//     is its "lease session" (a session in leasetable's Go and SQL).
//   - Connection names: a connection pgbaton opens itself carries the
//     application_name "pgbaton <role> <owner>" (for example "pgbaton
//     advisory host:pid"), so pg_stat_activity shows whose it is.
//   - Logs go to a log/slog Logger given in the Config, silent by
//     default; a record that carries an error has it under the key
//     "error".
//
// [documentation index]: https://github.com/pgbaton/pgbaton/blob/main/docs/README.md
// [Safety]: https://github.com/pgbaton/pgbaton/blob/main/docs/safety.md
package pgbaton
