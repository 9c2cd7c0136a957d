package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/internal/pgcluster"
	"github.com/pgbaton/pgbaton/migrations"
)

func newDemoCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "demo",
		Short: "Run the demo (starts a throwaway PostgreSQL unless --dsn or DATABASE_URL is set)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			if g.connString() == "" && os.Getenv("PGHOST") == "" {
				start := time.Now()
				cluster, err := pgcluster.Start(ctx, pgcluster.Config{})
				if err != nil {
					return err
				}
				defer cluster.Stop()
				fmt.Fprintf(g.stderr, "demo: throwaway PostgreSQL on 127.0.0.1:%d up in %s\n", cluster.Port(), time.Since(start).Round(time.Millisecond))
				g.dsn = cluster.URL("postgres")
			}
			pool, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := migrations.Up(ctx, pool); err != nil {
				return err
			}
			// Until the full scenario lands, the demo shows what `pgbaton
			// status` sees.
			return runStatus(ctx, g, pool)
		},
	}
}
