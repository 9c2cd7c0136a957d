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
package pgbaton
