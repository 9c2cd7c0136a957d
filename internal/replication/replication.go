// Package replication reads what stands between a failover and a lease
// granted twice, as leasetable reports it: how the primary's standbys
// protect acknowledged grants (Status, its rules, and the change-only
// logging of its warning) and the failover grace (Grace).
//
// leasetable's ReplicationStatus and FailoverGrace are these structs with
// the same fields, documented there, converted in one line; its
// ErrNoSyncStandby is the sentinel Status.Err wraps.
package replication

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"

	"github.com/pgbaton/pgbaton/internal/db"
)

// Status is leasetable.ReplicationStatus.
type Status struct {
	Standbys                int
	SyncStandbys            int // -1 when the role may not see it
	SynchronousStandbyNames string
	SynchronousCommit       string
}

// Read reads the replication status of the primary behind pool; its
// error is the query's, for the caller to wrap.
func Read(ctx context.Context, pool db.DBTX) (Status, error) {
	row, err := db.New().ReplicationInfo(ctx, pool)
	if err != nil {
		return Status{}, err
	}
	s := Status{Standbys: int(row.Standbys), SyncStandbys: int(row.SyncStandbys),
		SynchronousStandbyNames: row.SynchronousStandbyNames, SynchronousCommit: row.SynchronousCommit}
	if row.UnknownState > 0 && s.SyncStandbys == 0 {
		s.SyncStandbys = -1
	}
	return s, nil
}

// Err is nil when no acknowledged grant can be lost in a failover to one
// of the standbys (or there is no standby), and an error wrapping noSync
// saying why otherwise.
func (s Status) Err(noSync error) error {
	switch {
	case s.Standbys == 0:
		return nil
	case s.SyncStandbys == 0, s.SyncStandbys < 0 && s.SynchronousStandbyNames == "":
		return fmt.Errorf("%w (%d standby(s), synchronous_standby_names %q)", noSync, s.Standbys, s.SynchronousStandbyNames)
	case s.SynchronousCommit == "off" || s.SynchronousCommit == "local":
		return fmt.Errorf("%w: synchronous_commit is %s, so commits do not wait for the synchronous standby", noSync, s.SynchronousCommit)
	}
	return nil
}

// Log logs the replication warning when it appears, changes or goes
// away, not on every Check.
type Log struct{ last atomic.Value } // the last warning, "" for none

// Observe reads the replication status and logs a change: a warning when
// grants can be lost in a failover (Err with noSync). Errors reading it
// are left to the caller's other checks.
func (l *Log) Observe(ctx context.Context, pool db.DBTX, log *slog.Logger, noSync error) {
	s, err := Read(ctx, pool)
	if err != nil {
		return
	}
	msg := ""
	if err := s.Err(noSync); err != nil {
		msg = err.Error()
	}
	last, _ := l.last.Swap(msg).(string)
	changed := msg != last
	switch {
	case !changed:
	case msg != "":
		log.Warn("pgbaton: acknowledged grants can be lost in a failover; use synchronous replication",
			"standbys", s.Standbys, "sync_standbys", s.SyncStandbys, "error", msg)
	default:
		log.Info("pgbaton: a synchronous standby protects acknowledged grants again", "standbys", s.Standbys)
	}
}
