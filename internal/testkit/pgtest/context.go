package pgtest

import (
	"context"
	"database/sql"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
)

// Context returns a context that ends after d or with the test.
func Context(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// ProxiedPool is a pool on d whose connections pass through a fault proxy
// that the test can stall or cut (so they are not direct connections).
// It needs the throwaway cluster's TCP port, and skips the test with
// PGBATON_TEST_DSN.
func (e *Env) ProxiedPool(t testing.TB, d *DB, configure ...func(*pgxpool.Config)) (*pgxpool.Pool, *faultproxy.Proxy) {
	t.Helper()
	proxy := e.proxy(t)
	pool := Pool(t, d.URL, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Host = "127.0.0.1"
		cfg.ConnConfig.Port = uint16(proxy.Port())
		for _, f := range configure {
			f(cfg)
		}
	})
	return pool, proxy
}

// ProxiedSQLDB is ProxiedPool for database/sql: a handle on d through
// pgx's stdlib driver and a fault proxy.
func (e *Env) ProxiedSQLDB(t testing.TB, d *DB) (*sql.DB, *faultproxy.Proxy) {
	t.Helper()
	proxy := e.proxy(t)
	return SQLDB(t, d.URL, func(cfg *pgx.ConnConfig) {
		cfg.Host = "127.0.0.1"
		cfg.Port = uint16(proxy.Port())
	}), proxy
}

// proxy starts a fault proxy to the throwaway cluster, closed when t ends.
func (e *Env) proxy(t testing.TB) *faultproxy.Proxy {
	t.Helper()
	c := e.Cluster()
	if c == nil {
		t.Skip("needs the throwaway cluster's TCP port") // only with PGBATON_TEST_DSN
	}
	proxy, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", c.Port()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = proxy.Close() })
	return proxy
}
