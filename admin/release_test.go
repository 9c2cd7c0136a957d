package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/admin"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

func TestReleaseLeaseIsAudited(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{AdminToken: testToken})
	var oldToken int64
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT token FROM pgbaton.lease WHERE name = 'lease:a'`).Scan(&oldToken))

	code, body := post(t, ts, leaseForm(formToken(t, ts), "lease:a", "  worker-1 hung after deploy  ", testToken), nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="flash" class="ok"`)
	require.Contains(t, body, "released lease lease:a (was held by worker-1 with token "+fmt.Sprint(oldToken))
	require.NotContains(t, body, `<tr data-lease="lease:a">`, "the page after the release no longer lists the lease")
	require.Contains(t, body, "worker-1 hung after deploy", "the audit log on the page shows the release")

	require.Equal(t, "", leaseOwner(t, f.pool, "lease:a"))
	var actor, action, target, reason string
	var evOld, evNew, leaseToken int64
	require.NoError(t, f.pool.QueryRow(ctx,
		`SELECT actor, action, target, reason, old_token, new_token FROM pgbaton.event`).Scan(&actor, &action, &target, &reason, &evOld, &evNew))
	require.Equal(t, "force_release_lease", action)
	require.Equal(t, "lease:a", target)
	require.Equal(t, "worker-1 hung after deploy", reason)
	require.Equal(t, oldToken, evOld)
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT token FROM pgbaton.lease WHERE name = 'lease:a'`).Scan(&leaseToken))
	require.Equal(t, leaseToken, evNew, "the token was bumped, fencing the old holder")
	require.Greater(t, evNew, oldToken)
	var user string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT current_user`).Scan(&user))
	require.Equal(t, user, actor)

	// A second release of the same lease: not held any more.
	code, body = post(t, ts, leaseForm(formToken(t, ts), "lease:a", "again", testToken), nil)
	require.Equal(t, http.StatusNotFound, code)
	require.Contains(t, body, "is not held")
	require.Equal(t, 1, eventCount(t, f.pool))
}

// Every refusal leaves the lease held and the audit log empty.
func TestReleaseRefusals(t *testing.T) {
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{AdminToken: testToken})
	csrf := formToken(t, ts)
	good := func() url.Values { return leaseForm(csrf, "lease:a", "stuck", testToken) }
	with := func(k, v string) url.Values {
		form := good()
		form.Set(k, v)
		return form
	}
	for name, tc := range map[string]struct {
		form   url.Values
		header map[string]string
		status int
		msg    string
	}{
		"wrong admin token":   {form: with("admin_token", testToken+"x"), status: http.StatusForbidden, msg: "wrong admin token"},
		"empty admin token":   {form: with("admin_token", ""), status: http.StatusForbidden, msg: "wrong admin token"},
		"missing csrf field":  {form: with("csrf", ""), status: http.StatusForbidden, msg: "the form is stale"},
		"wrong csrf field":    {form: with("csrf", strings.Repeat("0", 64)), status: http.StatusForbidden, msg: "the form is stale"},
		"missing csrf cookie": {form: good(), header: map[string]string{"Cookie": "pgbaton_csrf=nope"}, status: http.StatusForbidden, msg: "the form is stale"},
		"cross-site fetch":    {form: good(), header: map[string]string{"Sec-Fetch-Site": "cross-site"}, status: http.StatusForbidden, msg: "cross-origin"},
		"foreign origin":      {form: good(), header: map[string]string{"Sec-Fetch-Site": "", "Origin": "http://evil.example"}, status: http.StatusForbidden, msg: "cross-origin"},
		"blank reason":        {form: with("reason", "   "), status: http.StatusBadRequest, msg: "a reason of 1 to 1000 bytes"},
		"oversized reason":    {form: with("reason", strings.Repeat("x", 1001)), status: http.StatusBadRequest, msg: "a reason of 1 to 1000 bytes"},
		"unknown kind":        {form: with("kind", "table"), status: http.StatusBadRequest, msg: "kind must be"},
		"missing lease name":  {form: with("name", ""), status: http.StatusBadRequest, msg: "lease name"},
		"unknown lease":       {form: with("name", "lease:nope"), status: http.StatusNotFound, msg: "no lease named lease:nope"},
	} {
		t.Run(name, func(t *testing.T) {
			code, body := post(t, ts, tc.form, tc.header)
			require.Equal(t, tc.status, code, body)
			require.Contains(t, body, tc.msg)
			require.Contains(t, body, `id="flash" class="error"`)
		})
	}

	req, err := http.NewRequest(http.MethodGet, ts.URL+"/release?"+good().Encode(), nil)
	require.NoError(t, err)
	resp, err := ts.Client().Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "GET never releases")

	// A form from an earlier server process is stale.
	other := serve(t, f.pool, admin.Config{AdminToken: testToken})
	code, body := post(t, other, leaseForm(csrf, "lease:a", "stuck", testToken), nil)
	require.Equal(t, http.StatusForbidden, code, body)

	require.Equal(t, "worker-1", leaseOwner(t, f.pool, "lease:a"))
	require.Zero(t, eventCount(t, f.pool))
}

func TestReleaseNeedsAdminRole(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	role := "reader_" + strings.TrimPrefix(f.db.Name, "pgbaton_t")
	_, err := f.pool.Exec(ctx, "CREATE ROLE "+pgx.Identifier{role}.Sanitize()+" LOGIN IN ROLE pgbaton_reader")
	require.NoError(t, err)
	cfg, err := pgx.ParseConfig(f.db.URL)
	require.NoError(t, err)
	readerPool := pgtest.Pool(t, strings.Replace(f.db.URL, cfg.User+"@", role+"@", 1))
	t.Cleanup(func() {
		readerPool.Close()
		_, _ = env.AdminPool().Exec(context.Background(), "DROP OWNED BY "+pgx.Identifier{role}.Sanitize())
		_, _ = env.AdminPool().Exec(context.Background(), "DROP ROLE "+pgx.Identifier{role}.Sanitize())
	})

	ts := serve(t, readerPool, admin.Config{AdminToken: testToken})
	code, body := get(t, ts, "/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "lease:a", "a reader sees the leases")
	require.Contains(t, body, "not a member of pgbaton_admin")

	code, body = post(t, ts, leaseForm(formToken(t, ts), "lease:a", "stuck", testToken), nil)
	require.Equal(t, http.StatusForbidden, code, body)
	require.Contains(t, body, "needs role pgbaton_admin")
	require.Equal(t, "worker-1", leaseOwner(t, f.pool, "lease:a"))
	require.Zero(t, eventCount(t, f.pool))
}

func TestTerminateAdvisoryHolderNeedsTheCheckbox(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{AdminToken: testToken})
	pid := f.holder.PgConn().PID()
	form := url.Values{"csrf": {formToken(t, ts)}, "kind": {"advisory"}, "pid": {fmt.Sprint(pid)},
		"target": {"job:admin"}, "reason": {"holder wedged"}, "admin_token": {testToken}}

	code, body := post(t, ts, form, nil)
	require.Equal(t, http.StatusBadRequest, code)
	require.Contains(t, body, "terminate the holder")
	require.NoError(t, f.holder.Ping(ctx), "the holder's session is untouched")

	for _, bad := range []string{"0", "-3", "x", ""} {
		bform := url.Values{}
		for k, v := range form {
			bform[k] = v
		}
		bform.Set("pid", bad)
		bform.Set("terminate", "yes")
		code, _ := post(t, ts, bform, nil)
		require.Equal(t, http.StatusBadRequest, code, "pid %q", bad)
	}

	form.Set("terminate", "yes")
	code, body = post(t, ts, form, nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, fmt.Sprintf("terminated backend %d, freeing job:admin and the 2 advisory lock(s)", pid))
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var n int
		err := f.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
		return n == 0, err
	}, "holder backend still alive")
	var action, target, reason string
	require.NoError(t, f.pool.QueryRow(ctx, `SELECT action, target, reason FROM pgbaton.event`).Scan(&action, &target, &reason))
	require.Equal(t, []string{"terminate_advisory_holder", "job:admin", "holder wedged"}, []string{action, target, reason})

	// The backend is gone: a second attempt is "not found" and not audited.
	code, _ = post(t, ts, form, nil)
	require.Equal(t, http.StatusNotFound, code)
	require.Equal(t, 1, eventCount(t, f.pool))
}
