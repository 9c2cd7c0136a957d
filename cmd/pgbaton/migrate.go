package main

import (
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/migrations"
)

func newMigrateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Install, upgrade or remove the pgbaton schema",
		Example: `  pgbaton migrate up
  pgbaton migrate version -o json
  pgbaton migrate down --yes   # drops every lock, lease and run`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{fmt.Errorf("migrate needs a subcommand: up, down or version")}
		},
	}
	var yes bool
	down := &cobra.Command{
		Use:     "down",
		Short:   "Remove every pgbaton object (all locks, leases and runs are lost)",
		Example: `  pgbaton migrate down --yes`,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !yes {
				return usageError{fmt.Errorf("migrate down drops the pgbaton schema and all its data; pass --yes to confirm")}
			}
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				if err := migrations.Down(cmd.Context(), pool); err != nil {
					return err
				}
				fmt.Fprintln(g.stdout, "pgbaton schema removed")
				return nil
			})
		},
	}
	down.Flags().BoolVarP(&yes, "yes", "y", false, "confirm")
	cmd.AddCommand(&cobra.Command{
		Use:   "up",
		Short: "Apply every migration not yet applied",
		Example: `  pgbaton migrate up
  PGHOST=db1 PGUSER=owner PGDATABASE=app pgbaton migrate up`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				if err := migrations.Up(cmd.Context(), pool); err != nil {
					return err
				}
				v, _, err := migrations.Version(cmd.Context(), pool)
				if err != nil {
					return err
				}
				fmt.Fprintf(g.stdout, "pgbaton schema at version %d\n", v)
				return nil
			})
		},
	}, down, &cobra.Command{
		Use:     "version",
		Short:   "Print the schema version of the database and of this build",
		Example: `  pgbaton migrate version`,
		Args:    exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				v, dirty, err := migrations.Version(cmd.Context(), pool)
				if err != nil {
					return err
				}
				rep := struct {
					Database uint `json:"database"`
					Dirty    bool `json:"dirty"`
					Build    uint `json:"build"`
				}{v, dirty, migrations.Latest()}
				return g.render(rep, []string{"DATABASE", "DIRTY", "BUILD"}, func() [][]string {
					return [][]string{{fmt.Sprint(v), fmt.Sprint(dirty), fmt.Sprint(rep.Build)}}
				})
			})
		},
	})
	return cmd
}
