package health_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/health"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

func get(t *testing.T, h http.Handler, method string) (int, health.Report) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(method, "/readyz", nil))
	var rep health.Report
	if method == http.MethodGet {
		require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
	}
	return rec.Code, rep
}

func TestHandlerReportsEachCheck(t *testing.T) {
	pool := env.DB(t).Pool(t)
	h := health.Handler(health.Checks{
		"database": health.CheckerFunc(pool.Ping),
	})
	code, rep := get(t, h, http.MethodGet)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok", rep.Status)
	require.Equal(t, "ok", rep.Checks["database"])

	pool.Close() // the database is gone for this process
	code, rep = get(t, h, http.MethodGet)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "unavailable", rep.Status)
	require.NotEqual(t, "ok", rep.Checks["database"])

	code, _ = get(t, h, http.MethodHead)
	require.Equal(t, http.StatusServiceUnavailable, code)
	code, _ = get(t, health.Handler(nil), http.MethodHead)
	require.Equal(t, http.StatusOK, code)
}

func TestHandlerRejectsOtherMethodsAndNilCheckers(t *testing.T) {
	h := health.Handler(health.Checks{"nil": nil, "bad": health.CheckerFunc(func(context.Context) error { return errors.New("renewals late") })})
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/readyz", nil))
	require.Equal(t, http.StatusMethodNotAllowed, rec.Code)
	code, rep := get(t, h, http.MethodGet)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "no checker", rep.Checks["nil"])
	require.Equal(t, "renewals late", rep.Checks["bad"])
}

// A degraded check keeps the service ready; a failed one does not, also
// when joined with a degraded one.
func TestHandlerDegraded(t *testing.T) {
	degraded := health.CheckerFunc(func(context.Context) error {
		return fmt.Errorf("%w: waiters poll", pgbaton.ErrDegraded)
	})
	failed := health.CheckerFunc(func(context.Context) error { return errors.New("down") })
	code, rep := get(t, health.Handler(health.Checks{"leases": degraded, "other": health.CheckerFunc(func(context.Context) error { return nil })}), http.MethodGet)
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "degraded", rep.Status)
	require.Contains(t, rep.Checks["leases"], "waiters poll")
	require.Equal(t, "ok", rep.Checks["other"])

	code, rep = get(t, health.Handler(health.Checks{"leases": degraded, "db": failed}), http.MethodGet)
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "unavailable", rep.Status)

	joined := health.CheckerFunc(func(ctx context.Context) error {
		return errors.Join(degraded(ctx), failed(ctx))
	})
	code, _ = get(t, health.Handler(health.Checks{"leases": joined}), http.MethodGet)
	require.Equal(t, http.StatusServiceUnavailable, code, "a real failure joined with a degraded mode")
}
