// Package admin is the HTTP side of `pgbaton serve`: Prometheus metrics read
// from the database at scrape time, and a small server-rendered admin page
// that shows who holds what and lets an operator force-release a stuck lock.
//
//	srv, err := admin.New(pool, admin.Config{AdminToken: os.Getenv("PGBATON_ADMIN_TOKEN")})
//	err = srv.ListenAndServe(ctx, "127.0.0.1:9187") // returns when ctx ends
//
// Routes:
//
//	GET  /         the admin page: advisory locks, leases, job runs, audit log
//	POST /release  force-release a lease, or terminate an advisory lock's holder
//	GET  /metrics  Prometheus text format, collected from the database per scrape
//	GET  /healthz  200 when the database answers
//
// Metrics come from a registry of the Server's own (no global state), and
// every gauge is read from the database when Prometheus scrapes, so several
// serve processes on one database report the same numbers and none of them
// has to be the one that took the locks. Label cardinality is bounded: lease
// groups and per-lease tokens are limited to Config.TopN series each.
//
// Releasing is guarded three times. The server must have been started with
// an admin token, which the form asks for; the form carries a per-process
// CSRF token that must match a SameSite=Strict cookie, is accepted only by
// POST and only from the page's own origin; and the release runs the SQL
// functions pgbaton.force_release_lease and pgbaton.terminate_advisory_holder,
// which refuse unless the connected user is a member of pgbaton_admin and
// write the audit row (pgbaton.event) in the release's own transaction.
// Without an admin token the page is read-only.
package admin
