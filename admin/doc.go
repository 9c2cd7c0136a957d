// Package admin is pgbaton's admin page and Prometheus metrics as an
// http.Handler: mount it in your own server, behind your own
// authentication, or run it with `pgbaton serve`. It is a module of its
// own (github.com/pgbaton/pgbaton/admin), so its dependencies (Prometheus'
// client) never enter the build of a service that imports only the
// library.
//
//	srv, err := admin.New(pool, admin.Config{AdminToken: os.Getenv("PGBATON_ADMIN_TOKEN")})
//	mux.Handle("/ops/pgbaton/", yourAuth(http.StripPrefix("/ops/pgbaton", srv)))
//
// or on a port of its own: srv.ListenAndServe(ctx, "127.0.0.1:9187").
//
// Routes, relative to where it is mounted:
//
//	GET  /         the page: advisory locks, leases (held, expired, free),
//	               lease waiters (by queue position), job runs, the audit log
//	POST /session  unlock releases in this browser with the admin token, or lock
//	POST /release  force-release a lease, or terminate an advisory lock's holder
//	GET  /metrics  Prometheus text format, collected from the database per scrape
//	GET  /healthz  200 when the database answers
//
// The page's query string is its view, so a view can be bookmarked: q
// (name prefix), holder (lease owner, advisory holder's application or pid,
// lease waiter's owner or id), state (leases: held, expired, free, all), locks (advisory: held,
// waiting, contended), after and offset (the next page of leases and of
// advisory locks, TopN rows per page) and refresh (reload every 5, 15 or 60
// seconds, by a <meta> tag: the page has no JavaScript). Every link, form
// and redirect is relative, so the page works under any path prefix.
//
// Metrics come from a registry of the Server's own (no global state), and
// every gauge is read from the database when Prometheus scrapes, so several
// serve processes on one database report the same numbers and none of them
// has to be the one that took the locks. Label cardinality is bounded: lease
// groups and per-lease tokens are limited to Config.TopN series each. A
// server with its own registry registers Server.Collector instead of
// routing /metrics. The names follow Prometheus' conventions (checked by
// promlint in the tests); deploy/grafana/pgbaton.json is a dashboard of them.
//
// Releasing is guarded three times. The server must have been given an
// admin token, which the operator types once per browser session (a
// cookie signed with the token, valid Config.SessionTTL; scripts may send
// it with each form instead); every form carries a per-process CSRF token
// that must match a SameSite=Strict cookie, and is accepted only by POST
// and only from the page's own origin; and the release runs the SQL
// functions pgbaton.force_release_lease and pgbaton.terminate_advisory_holder,
// which refuse unless the connected user is a member of pgbaton_admin and
// write the audit row (pgbaton.event) in the release's own transaction. A
// release that happened redirects back to the view it came from
// (POST-redirect-GET), so a reload never repeats it. Without an admin token
// the page is read-only. Your own authentication in front of the handler
// decides who reaches the page at all; the database user of the pool
// decides what it may see (pgbaton_reader) and release (pgbaton_admin).
//
// The package reads the database only through its own generated queries
// (admindb, from queries/), never through the library's internal packages.
// The metrics, the dashboard and the CLI are in [Operating].
//
// [Operating]: https://github.com/pgbaton/pgbaton/blob/main/docs/operating.md
package admin
