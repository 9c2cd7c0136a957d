package pgtest

import (
	"database/sql"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
)

// SQLDB opens a database/sql handle on url through pgx's stdlib driver
// (what GORM's postgres driver and most sqlx users run on), closed when t
// ends. configure, if given, may change the connection configuration
// first (a fault proxy's host and port).
func SQLDB(t testing.TB, url string, configure ...func(*pgx.ConnConfig)) *sql.DB {
	t.Helper()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", redact(url), err)
	}
	for _, f := range configure {
		f(cfg)
	}
	db := stdlib.OpenDB(*cfg)
	t.Cleanup(func() { _ = db.Close() })
	return db
}

// SQLDB opens a database/sql handle on the test's database (see SQLDB).
func (d *DB) SQLDB(t testing.TB) *sql.DB {
	t.Helper()
	return SQLDB(t, d.URL)
}
