package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// Connect opens a plain connection to url with application_name app (so
// that pg_stat_activity and lock listings show who is who), closed when t
// ends. For sessions a test holds locks on or waits in.
func Connect(t testing.TB, url, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", redact(url), err)
	}
	cfg.RuntimeParams["application_name"] = app
	conn, err := pgx.ConnectConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: connect %s: %v", redact(url), err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}

// Blocked runs sql, which must wait for a lock, on a connection of its own
// named app, and returns once the server shows that backend waiting for a
// lock. The statement is cancelled and the connection closed when t ends.
// It returns the waiting backend's pid.
func Blocked(t testing.TB, url, app, sql string) uint32 {
	t.Helper()
	conn := Connect(t, url, app)
	pid := conn.PgConn().PID()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = conn.Exec(ctx, sql) // returns when t ends, or when granted
	}()
	// Registered after Connect's cleanup, so it runs first: the statement
	// ends before its connection is closed.
	t.Cleanup(func() { cancel(); <-done })
	watcher := Connect(t, url, app+"-watcher")
	Eventually(t, 30*time.Second, func() (bool, error) {
		var waiting bool
		err := watcher.QueryRow(context.Background(),
			`SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&waiting)
		return waiting, err
	}, "%s (pid %d) is not waiting for a lock: %s", app, pid, sql)
	return pid
}
