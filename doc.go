// Package pgbaton is a toolkit for distributed locking that needs nothing but
// the PostgreSQL an application already runs.
//
// It has three layers, each its own package:
//
//   - advisory: session-held pg_advisory_lock on connections pgbaton owns.
//     Held exactly as long as the session lives and freed at once when the
//     holder dies. For "one node at a time" sections, leader election,
//     migrations. (A cron job that must run once per scheduled slot claims
//     the slot with jobs.ClaimSlot; package gocronlock does it for
//     gocron.)
//   - leasetable: rows in pgbaton.lease with an expiry by the database clock
//     and a fencing token that grows with every grant. Survives connection
//     loss and failover; visible to operators. For long jobs, sharded work,
//     work items, semaphores, leader election with terms.
//   - fencedwrite: guarded writes that the database rejects when they carry a
//     stale token, atomically, in the write's own transaction.
//
// Above the layers: jobs (job runs with fenced checkpoints, and cron slots
// claimed once across nodes, over leasetable and fencedwrite) and
// retention (pruning the tables outside leasetable's, which a Client prunes
// itself). Imports go downward only: no layer imports another layer or a
// package above it (deps_test.go ranks every package and checks).
//
// Liveness versus safety: an advisory lock or a lease prevents wasted
// duplicate work; only a fenced write prevents corruption when a holder is
// paused past its lease.
//
// This package holds what the layers share: the errors every layer returns
// for unsafe setups and bad input. Package migrations installs the schema.
//
// The module github.com/pgbaton/pgbaton is the library alone (the layers,
// jobs, retention, migrations and health; Go 1.25 or newer): a service that imports it gets
// pgx, the OpenTelemetry metric API and golang-migrate (used only by
// migrations.Up and Down, never linked by the layers) and nothing else. The
// operator's CLI (github.com/pgbaton/pgbaton/cmd/pgbaton), the gocron
// integration (github.com/pgbaton/pgbaton/gocronlock), the test suite, the
// demo and the benchmarks are modules of their own.
//
// # Conventions
//
// The packages of this module and package gocronlock follow one set of
// rules, written down here once:
//
//   - Error strings start with the name of the package that makes them:
//     "advisory: ", "leasetable: ", "fencedwrite: ", "migrations: ",
//     "health: ", "gocronlock: ". The sentinels every layer may return
//     (this package's, and migrations.ErrDirty) say "pgbaton: ", and so
//     does any error of an internal package. An error that wraps a
//     sentinel names it first ("%w: detail"), so that it starts with the
//     sentinel's prefix, and names no package after it.
//   - Logs: every slog record that carries an error carries it under the
//     key "error".
//   - Connection names: a connection pgbaton opens itself carries the
//     application_name "pgbaton <role> <owner>" ("pgbaton advisory
//     host:pid"), made in one place (internal/appname).
//   - SQLSTATEs: each code pgbaton acts on is named once, in
//     internal/pgerr, which alone maps codes to the shared sentinels
//     (ErrNotMigrated, ErrStandby, ErrInvalidArgument). A layer maps the
//     codes that mean one of its own errors itself, with those constants.
//   - Constructors and setup checks: a check that holds for a whole pool
//     (schema version, primary or standby, a server that breaks the token
//     sequence) runs in the constructor, which then takes a context
//     (leasetable.New); a check that belongs to one connection (a pooler
//     between client and server, the backend's pid, the keepalives) runs
//     when that connection opens, because the pool's connection says
//     nothing about the one a lock will live on. advisory.New therefore
//     does no I/O: its locks need no schema (its name registry reports
//     ErrNotMigrated when used), every session connection is checked as
//     it opens, and the first lock returns what the check found.
//   - Work under a lock: when a lock or lease is lost while the work runs
//     (advisory's RunExclusive, leasetable's Do, jobs.Do), the error
//     returned always wraps the loss (ErrLockLost, ErrLeaseLost), even when the work
//     returned nil, and is errors.Join(workErr, loss) when the work failed
//     too.
//   - Not held versus lost: ErrNotHeld (advisory and leasetable) means
//     one thing, that a call on a lock or lease found it no longer held
//     by this holder and so changed nothing; ErrLockLost and ErrLeaseLost
//     are the loss itself, the cause of the holder's context.
//   - Tests: a helper that more than one package's tests need lives once
//     in internal/testkit (pgtest.Context, pgtest.Env.ProxiedPool,
//     metertest), not copied into each package.
//   - Words: "session" is a PostgreSQL session, a connection and its
//     backend (advisory locks are held by sessions); leasetable's row of
//     pgbaton.lease_session that keeps a client's leases alive is its
//     "lifeline". To "retire" a session or lifeline is to close it; an
//     idle advisory session kept for later is "parked" as a spare.
package pgbaton
