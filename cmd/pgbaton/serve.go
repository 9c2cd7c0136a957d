package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/admin"
)

func newServeCmd(g *globals) *cobra.Command {
	var listen, token string
	var topN int
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Serve Prometheus /metrics and an admin page (locks, leases, runs, audit log, force release)",
		Long: `Serve Prometheus metrics read from the database at each scrape, and a
small admin page: advisory locks and held leases, job runs, the audit log,
and a form to force-release a lease or terminate an advisory lock's holder.

Releasing needs the admin token given at start-up (--admin-token, or better
` + envAdminToken + `, which ps does not show), typed once per browser
session on the page, and a database user in role pgbaton_admin; without a
token the page is read-only. Every release is written to the audit log
(pgbaton events). Listen on loopback: the page has no TLS of its own. To
put the page in your own server behind your own login, mount the Go
package github.com/pgbaton/pgbaton/admin instead.

Routes: / (page), /metrics, /healthz. Stops cleanly on Ctrl-C or SIGTERM.`,
		Example: `  PGBATON_ADMIN_TOKEN=$(openssl rand -hex 16) pgbaton serve --listen 127.0.0.1:9187
  pgbaton serve --dsn postgres://pgbaton_reader@db1/app   # read-only page and metrics
  curl -s 127.0.0.1:9187/metrics | grep ^pgbaton_leases`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if token == "" {
				token = g.getenv(envAdminToken)
			}
			if _, _, err := net.SplitHostPort(listen); err != nil {
				return usageError{fmt.Errorf("--listen must be host:port, e.g. 127.0.0.1:9187: %w", err)}
			}
			ctx := cmd.Context()
			return g.withPool(ctx, func(pool *pgxpool.Pool) error {
				logger := slog.New(slog.NewTextHandler(g.stderr, nil))
				bv := buildVersion()
				srv, err := admin.New(pool, admin.Config{AdminToken: token, Logger: logger, TopN: topN, Version: bv.Version, Revision: bv.Commit})
				if errors.Is(err, pgbaton.ErrInvalidArgument) {
					return usageError{err}
				}
				if err != nil {
					return err
				}
				var lc net.ListenConfig
				ln, err := lc.Listen(ctx, "tcp", listen)
				if err != nil {
					return fmt.Errorf("listen on %s: %w", listen, err)
				}
				mode := "read-only (no admin token)"
				if token != "" {
					mode = "releases enabled with the admin token"
				}
				fmt.Fprintf(g.stderr, "pgbaton serve: http://%s/ (metrics at /metrics), %s\n", ln.Addr(), mode)
				return srv.Serve(ctx, ln)
			})
		},
	}
	cmd.Flags().StringVar(&listen, "listen", "127.0.0.1:9187", "host:port to listen on (port 0 picks a free one)")
	cmd.Flags().StringVar(&token, "admin-token", "", "token an operator must type to release (default $"+envAdminToken+"; empty: read-only)")
	cmd.Flags().IntVar(&topN, "top", 50, "rows per table on the page, and series per lease group / per lease token in /metrics")
	return cmd
}
