package main

import (
	"fmt"

	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/migrations"
)

func newMigrateCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "migrate",
		Short: "Install, upgrade or remove the pgbaton schema",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{fmt.Errorf("migrate needs a subcommand: up, down or version")}
		},
	}
	var yes bool
	down := &cobra.Command{
		Use:   "down",
		Short: "Remove every pgbaton object (all locks, leases and runs are lost)",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if !yes {
				return usageError{fmt.Errorf("migrate down drops the pgbaton schema and all its data; pass --yes to confirm")}
			}
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := migrations.Down(cmd.Context(), pool); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, "pgbaton schema removed")
			return nil
		},
	}
	down.Flags().BoolVar(&yes, "yes", false, "confirm")
	cmd.AddCommand(&cobra.Command{
		Use:   "up",
		Short: "Apply every migration not yet applied",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := migrations.Up(cmd.Context(), pool); err != nil {
				return err
			}
			v, _, err := migrations.Version(cmd.Context(), pool)
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "pgbaton schema at version %d\n", v)
			return nil
		},
	}, down, &cobra.Command{
		Use:   "version",
		Short: "Print the schema version of the database and of this build",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
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
		},
	})
	return cmd
}
