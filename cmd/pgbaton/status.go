package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/admin/admindb"
	"github.com/pgbaton/pgbaton/cmd/pgbaton/internal/opdb"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// statusReport is what `pgbaton status` shows.
type statusReport struct {
	ServerVersion string `json:"server_version"`
	Database      string `json:"database"`
	User          string `json:"user"`
	Standby       bool   `json:"standby"`
	SchemaVersion uint   `json:"schema_version"`
	SchemaDirty   bool   `json:"schema_dirty"`
	LatestVersion uint   `json:"latest_schema_version"`
	LockTableUsed int64  `json:"lock_table_used"`
	LockTableCap  int64  `json:"lock_table_capacity"`
	AdvisoryLocks int64  `json:"advisory_locks"`
	// Standbys streaming from a primary, and how many are synchronous
	// (-1: the role may not see it).
	Standbys     int `json:"standbys"`
	SyncStandbys int `json:"sync_standbys"`
	// The failover grace: after a timeline change nothing is granted
	// until the longest TTL in use has passed.
	FailoverGrace leasetable.FailoverGrace `json:"failover_grace"`
	Warnings      []string                 `json:"warnings"`
}

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show server version, schema version, lock-table usage and warnings",
		Example: `  pgbaton status
  pgbaton status --dsn "host=db1 user=oncall dbname=app" -o json`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				return runStatus(cmd.Context(), g, pool)
			})
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
		if !rep.Standby {
			rows = append(rows, []string{"replication", replicationSummary(rep.Standbys, rep.SyncStandbys)})
		}
		rows = append(rows, []string{"failover grace", rep.FailoverGrace.String()})
		for _, w := range rep.Warnings {
			rows = append(rows, []string{"warning", w})
		}
		return rows
	})
}

func readStatus(ctx context.Context, pool *pgxpool.Pool) (*statusReport, error) {
	q := opdb.New()
	info, err := q.ServerStatus(ctx, pool)
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
	usage, err := admindb.New().LockTableUsage(ctx, pool)
	if err != nil {
		return nil, err
	}
	rep.LockTableUsed, rep.LockTableCap, rep.AdvisoryLocks = usage.Used, usage.Capacity, usage.Advisory
	if rep.Standby {
		rep.Warnings = append(rep.Warnings, "server is a standby: locks and leases need the primary")
	} else {
		rs, err := leasetable.ReplicationOf(ctx, pool)
		if err != nil {
			return nil, err
		}
		rep.Standbys, rep.SyncStandbys = rs.Standbys, rs.SyncStandbys
		if err := rs.Err(); err != nil {
			rep.Warnings = append(rep.Warnings, err.Error()+"; use synchronous replication (Patroni: synchronous_mode)")
		}
	}
	if err := migrations.Check(ctx, pool); err != nil {
		rep.Warnings = append(rep.Warnings, err.Error())
	} else if rep.FailoverGrace, err = leasetable.FailoverGraceOf(ctx, pool); err != nil {
		return nil, err
	} else if rep.FailoverGrace.Active {
		rep.Warnings = append(rep.Warnings, "failover grace: no lease is granted for "+rep.FailoverGrace.Remaining.Round(time.Second).String()+
			" more (a grant the previous primary made may be lost while its holder still works)")
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

func replicationSummary(standbys, sync int) string {
	switch {
	case standbys == 0:
		return "no standby streams from this server"
	case sync < 0:
		return fmt.Sprintf("%d standby(s), synchronous unknown (needs pg_read_all_stats)", standbys)
	case standbys == 1:
		return fmt.Sprintf("1 standby, %d synchronous", sync)
	}
	return fmt.Sprintf("%d standbys, %d synchronous", standbys, sync)
}

// behindTransactionPooler reports whether the server backend changes under
// one client connection, or two client connections share one backend: what a
// transaction pooler does, and what session locks cannot survive.
func behindTransactionPooler(ctx context.Context, pool *pgxpool.Pool) (bool, error) {
	q := opdb.New()
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
		if pids[i], err = q.BackendPID(ctx, c); err != nil {
			return false, err
		}
	}
	return pids[0] != pids[1] || pids[0] == pids[2] || pids[1] == pids[2], nil
}
