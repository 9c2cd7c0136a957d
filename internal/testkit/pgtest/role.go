package pgtest

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Role creates a role for the test's database behind pool (named prefix
// and the database's suffix, so that tests running at once do not
// collide: roles are cluster-wide), a member of inRole if not empty, with
// USAGE on schema pgbaton, and drops it when t ends. Tests switch to it
// with SET LOCAL ROLE.
func (e *Env) Role(t testing.TB, ctx context.Context, pool *pgxpool.Pool, prefix, inRole string) string {
	t.Helper()
	var db string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&db); err != nil {
		t.Fatalf("pgtest: role: %v", err)
	}
	role := prefix + "_" + strings.TrimPrefix(db, "pgbaton_t")
	id := pgx.Identifier{role}.Sanitize()
	sql := "CREATE ROLE " + id
	if inRole != "" {
		sql += " IN ROLE " + pgx.Identifier{inRole}.Sanitize()
	}
	if _, err := pool.Exec(ctx, sql); err != nil {
		t.Fatalf("pgtest: create role: %v", err)
	}
	t.Cleanup(func() {
		ctx := context.Background()
		if _, err := pool.Exec(ctx, "DROP OWNED BY "+id); err != nil {
			t.Errorf("pgtest: drop owned by %s: %v", role, err)
		}
		if _, err := e.admin.Exec(ctx, "DROP ROLE "+id); err != nil {
			t.Errorf("pgtest: drop role %s: %v", role, err)
		}
	})
	if _, err := pool.Exec(ctx, "GRANT USAGE ON SCHEMA pgbaton TO "+id); err != nil {
		t.Fatalf("pgtest: grant usage: %v", err)
	}
	return role
}
