package admin_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/admin"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

const testToken = "correct-horse-battery-staple"

// fixture is a database with known locks, held by a session of its own:
// the advisory lock job:admin (registered name) and the pair (7,-8), a
// waiter on job:admin, the lease lease:a held by worker-1, one of two
// leases of group shards held by worker-2, and one finished job run.
type fixture struct {
	db     *pgtest.DB
	pool   *pgxpool.Pool
	holder *pgx.Conn
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	d := env.DB(t)
	holder := pgtest.Connect(t, d.URL, "admin-holder")
	for _, sql := range []string{
		`INSERT INTO pgbaton.advisory_name (key, name) VALUES (pgbaton.advisory_key('job:admin'), 'job:admin')`,
		`SELECT pg_advisory_lock(pgbaton.advisory_key('job:admin'))`,
		`SELECT pg_advisory_lock_shared(7, -8)`,
		`SELECT pgbaton.try_acquire('lease:a', 'worker-1', 600000)`,
		`SELECT pgbaton.register('shards', ARRAY['shard-0', 'shard-1'])`,
		`SELECT pgbaton.claim('shards', 'worker-2', 1, 600000)`,
		`INSERT INTO pgbaton.job_run (job, owner, token, status, finished_at, error)
		 VALUES ('nightly-export', 'worker-1', 1, 'failed', clock_timestamp(), 'disk full')`,
	} {
		_, err := holder.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	pgtest.Blocked(t, d.URL, "admin-waiter", `SELECT pg_advisory_lock(pgbaton.advisory_key('job:admin'))`)
	pool := d.Pool(t)
	return &fixture{db: d, pool: pool, holder: holder}
}

// serve starts an httptest server for an admin.Server on pool.
func serve(t *testing.T, pool *pgxpool.Pool, cfg admin.Config) *httptest.Server {
	t.Helper()
	srv, err := admin.New(pool, cfg)
	require.NoError(t, err)
	ts := httptest.NewServer(srv)
	t.Cleanup(ts.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	ts.Client().Jar = jar
	return ts
}

func get(t *testing.T, ts *httptest.Server, path string) (int, string) {
	t.Helper()
	resp, err := ts.Client().Get(ts.URL + path)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

var reCSRF = regexp.MustCompile(`name="csrf" value="([0-9a-f]+)"`)

// formToken loads the page (which sets the CSRF cookie) and returns the
// CSRF token of its forms.
func formToken(t *testing.T, ts *httptest.Server) string {
	t.Helper()
	code, body := get(t, ts, "/")
	require.Equal(t, http.StatusOK, code, body)
	m := reCSRF.FindStringSubmatch(body)
	require.NotNil(t, m, "no CSRF token in the page")
	return m[1]
}

// post sends form to /release (or to path) as a browser on the page's
// origin would, and follows the redirect that ends a successful POST.
func post(t *testing.T, ts *httptest.Server, form url.Values, header map[string]string, path ...string) (int, string) {
	t.Helper()
	target := ts.URL + "/release"
	if len(path) > 0 {
		target = ts.URL + path[0]
	}
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", ts.URL)
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for k, v := range header {
		if v == "" {
			req.Header.Del(k)
		} else {
			req.Header.Set(k, v)
		}
	}
	resp, err := ts.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// unlock types the admin token into the page's unlock form once, as an
// operator does at the start of a browser session.
func unlock(t *testing.T, ts *httptest.Server) {
	t.Helper()
	form := url.Values{"csrf": {formToken(t, ts)}, "action": {"unlock"}, "admin_token": {testToken}}
	code, body := post(t, ts, form, nil, "/session")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "releases unlocked in this browser")
}

func leaseForm(csrf, name, reason, token string) url.Values {
	return url.Values{"csrf": {csrf}, "kind": {"lease"}, "name": {name}, "reason": {reason}, "admin_token": {token}}
}

// leaseOwner is the lease's owner, "" when free.
func leaseOwner(t *testing.T, pool *pgxpool.Pool, name string) string {
	t.Helper()
	var owner *string
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT owner FROM pgbaton.lease WHERE name = $1`, name).Scan(&owner))
	if owner == nil {
		return ""
	}
	return *owner
}

func eventCount(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(context.Background(), `SELECT count(*) FROM pgbaton.event`).Scan(&n))
	return n
}
