package main

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/migrations"
)

// statusReport is what `pgbaton status` shows.
type statusReport struct {
	ServerVersion string   `json:"server_version"`
	Database      string   `json:"database"`
	User          string   `json:"user"`
	Standby       bool     `json:"standby"`
	SchemaVersion uint     `json:"schema_version"`
	SchemaDirty   bool     `json:"schema_dirty"`
	LatestVersion uint     `json:"latest_schema_version"`
	LockTableUsed int64    `json:"lock_table_used"`
	LockTableCap  int64    `json:"lock_table_capacity"`
	AdvisoryLocks int64    `json:"advisory_locks"`
	Warnings      []string `json:"warnings"`
}

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show server version, schema version, lock-table usage and warnings",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			return runStatus(cmd.Context(), g, pool)
		},
	}
}

func runStatus(ctx context.Context, g *globals, pool *pgxpool.Pool) error {
	rep, err := readStatus(ctx, pool)
	if err != nil {
		return err
	}
	return g.render(rep, []string{"FIELD", "VALUE"}, func() [][]string {
		rows := [][]string{
			{"server", rep.ServerVersion},
			{"database", rep.Database},
			{"user", rep.User},
			{"standby", fmt.Sprint(rep.Standby)},
			{"schema version", fmt.Sprintf("%d (this build: %d)", rep.SchemaVersion, rep.LatestVersion)},
			{"lock table", fmt.Sprintf("%d of ~%d (%d advisory)", rep.LockTableUsed, rep.LockTableCap, rep.AdvisoryLocks)},
		}
		for _, w := range rep.Warnings {
			rows = append(rows, []string{"warning", w})
		}
		return rows
	})
}

func readStatus(ctx context.Context, pool *pgxpool.Pool) (*statusReport, error) {
	q := db.New()
	info, err := q.ServerInfo(ctx, pool)
	if err != nil {
		return nil, err
	}
	rep := &statusReport{
		ServerVersion: info.ServerVersion, Database: info.Database, User: info.CurrentUserName,
		Standby: info.InRecovery, LatestVersion: migrations.Latest(), Warnings: []string{},
	}
	if rep.SchemaVersion, rep.SchemaDirty, err = migrations.Version(ctx, pool); err != nil {
		return nil, err
	}
	usage, err := q.LockTableUsage(ctx, pool)
	if err != nil {
		return nil, err
	}
	rep.LockTableUsed, rep.LockTableCap, rep.AdvisoryLocks = usage.Used, usage.Capacity, usage.Advisory
	if rep.Standby {
		rep.Warnings = append(rep.Warnings, "server is a standby: locks and leases need the primary")
	}
	if err := migrations.Check(ctx, pool); err != nil {
		rep.Warnings = append(rep.Warnings, err.Error())
	}
	if pooled, err := behindTransactionPooler(ctx, pool); err != nil {
		return nil, err
	} else if pooled {
		rep.Warnings = append(rep.Warnings, "a transaction pooler (PgBouncer pool_mode=transaction?) sits between this client and the server: "+
			"session advisory locks will be refused; use advisory XactLock or leasetable, or connect directly")
	}
	if rep.LockTableCap > 0 && rep.LockTableUsed*10 >= rep.LockTableCap*8 {
		rep.Warnings = append(rep.Warnings, "lock table above 80% of capacity: raise max_locks_per_transaction or hold fewer locks")
	}
	return rep, nil
}

// behindTransactionPooler reports whether the server backend changes under
// one client connection, or two client connections share one backend: what a
// transaction pooler does, and what session locks cannot survive.
func behindTransactionPooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	q := db.New()
	a, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer a.Release()
	b, err := pool.Acquire(ctx)
	if err != nil {
		return false, err
	}
	defer b.Release()
	var pids [3]int32
	for i, c := range []*pgxpool.Conn{a, a, b} {
		if pids[i], err = q.AdvisoryBackendPID(ctx, c); err != nil {
			return false, err
		}
	}
	return pids[0] != pids[1] || pids[0] == pids[2] || pids[1] == pids[2], nil
}
