package pgtest

import (
	"context"
	"testing"

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
