package admin_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/admin"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// noRedirect is a client of ts that shares its cookies but stops at
// redirects, to look at them.
func noRedirect(ts *httptest.Server) *http.Client {
	return &http.Client{Transport: ts.Client().Transport, Jar: ts.Client().Jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func postRaw(t *testing.T, c *http.Client, origin, target string, form url.Values) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, target, strings.NewReader(form.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", origin)
	site := "same-origin"
	if !strings.HasPrefix(target, origin+"/") {
		site = "cross-site"
	}
	req.Header.Set("Sec-Fetch-Site", site)
	resp, err := c.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	return resp
}

// The operator types the admin token once per browser session: before, the
// page has no release forms and refuses a release without the token; after
// unlocking, forms carry no token field and releases go through; a session
// cookie not signed with the token is worthless; locking ends it.
func TestTokenOncePerSession(t *testing.T) {
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{AdminToken: testToken})
	_, body := get(t, ts, "/")
	require.Contains(t, body, `id="unlock"`)
	require.NotContains(t, body, `action="release"`)

	csrf := formToken(t, ts)
	code, body := post(t, ts, url.Values{"csrf": {csrf}, "kind": {"lease"}, "name": {"lease:a"}, "reason": {"r"}}, nil)
	require.Equal(t, http.StatusForbidden, code, "locked: a release needs the token")
	require.Contains(t, body, "wrong admin token")

	code, body = post(t, ts, url.Values{"csrf": {csrf}, "action": {"unlock"}, "admin_token": {"not-the-token-at-all"}}, nil, "/session")
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "wrong admin token: releases stay locked")

	// A forged session cookie does not unlock.
	u, err := url.Parse(ts.URL)
	require.NoError(t, err)
	exp := time.Now().Add(time.Hour).Unix()
	ts.Client().Jar.SetCookies(u, []*http.Cookie{{Name: "pgbaton_admin_session", Value: strings.Repeat("0", 10) + "." + strings.Repeat("ab", 32)}})
	_, body = get(t, ts, "/")
	require.NotContains(t, body, `action="release"`, "forged session cookie (exp %d)", exp)

	unlock(t, ts)
	_, body = get(t, ts, "/")
	require.Contains(t, body, `id="lock"`)
	require.Contains(t, body, `data-lease="lease:a"`)
	require.NotContains(t, body, `name="admin_token"`, "no form asks for the token again")
	code, body = post(t, ts, url.Values{"csrf": {csrf}, "kind": {"lease"}, "name": {"lease:a"}, "reason": {"unlocked once"}}, nil)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "released lease lease:a")
	require.Equal(t, "", leaseOwner(t, f.pool, "lease:a"))

	// The same cookie on a server with another token is worthless.
	other := serve(t, f.pool, admin.Config{AdminToken: testToken + "-rotated"})
	ou, err := url.Parse(other.URL)
	require.NoError(t, err)
	other.Client().Jar.SetCookies(ou, ts.Client().Jar.Cookies(u))
	_, body = get(t, other, "/")
	require.NotContains(t, body, `action="release"`, "a new token ends old sessions")

	code, body = post(t, ts, url.Values{"csrf": {csrf}, "action": {"lock"}}, nil, "/session")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="unlock"`)
	code, _ = post(t, ts, url.Values{"csrf": {csrf}, "kind": {"lease"}, "name": {"shard-0"}, "reason": {"r"}}, nil)
	require.Equal(t, http.StatusForbidden, code, "locked again")
	require.Equal(t, "worker-2", leaseOwner(t, f.pool, "shard-0"))
	require.Equal(t, 1, eventCount(t, f.pool))
}

// A release answers 303 See Other to the view its form was on; the
// outcome shows once on that page and not on a reload.
func TestReleaseRedirectsBackToTheView(t *testing.T) {
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{AdminToken: testToken})
	form := leaseForm(formToken(t, ts), "lease:a", "prg", testToken)
	form.Set("return", "q=lease%3A&state=all&evil=https://example.com")
	resp := postRaw(t, noRedirect(ts), ts.URL, ts.URL+"/release", form)
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "./?q=lease%3A&state=all", resp.Header.Get("Location"), "only the filter's keys survive")

	_, body := get(t, ts, "/?q=lease%3A&state=all")
	require.Contains(t, body, `id="flash" class="ok"`)
	require.Contains(t, body, "released lease lease:a")
	require.Contains(t, body, `<tr data-lease="lease:a" data-state="free">`, "the view it came from: all leases named lease:…")
	_, body = get(t, ts, "/?q=lease%3A&state=all")
	require.NotContains(t, body, `id="flash"`, "a reload does not repeat the outcome")

	// A refused release is not redirected: its page says why, with an error status.
	form = leaseForm(formToken(t, ts), "lease:a", "again", testToken)
	resp = postRaw(t, noRedirect(ts), ts.URL, ts.URL+"/release", form)
	require.Equal(t, http.StatusNotFound, resp.StatusCode)
}

// Filters by name prefix, holder and state, the free and expired leases,
// the lease waiters, and pages of TopN rows.
func TestFiltersStatesWaitersAndPages(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	for _, sql := range []string{
		`SELECT pgbaton.try_acquire('lease:expired', 'worker-3', 1)`,
		`SELECT pgbaton.wait_for('lease:a', 'waiter-7')`,
	} {
		_, err := f.pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var expired bool
		err := f.pool.QueryRow(ctx, `SELECT NOT held FROM pgbaton.lease_status WHERE name = 'lease:expired'`).Scan(&expired)
		return expired, err
	}, "lease:expired does not expire")
	ts := serve(t, f.pool, admin.Config{TopN: 1})

	leases := func(query string) []string {
		t.Helper()
		code, body := get(t, ts, "/?"+query)
		require.Equal(t, http.StatusOK, code, body)
		var names []string
		for _, part := range strings.Split(body, `<tr data-lease="`)[1:] {
			names = append(names, part[:strings.Index(part, `"`)]+"/"+strings.Split(strings.Split(part, `data-state="`)[1], `"`)[0])
		}
		return names
	}
	require.Equal(t, []string{"lease:a/held"}, leases(""), "held, first page of one")
	require.Equal(t, []string{"shard-0/held"}, leases("after=lease%3Aa"), "held, second page")
	require.Empty(t, leases("after=shard-0"))
	require.Equal(t, []string{"lease:expired/expired"}, leases("state=expired"))
	require.Equal(t, []string{"shard-1/free"}, leases("state=free"))
	require.Equal(t, []string{"shard-0/held"}, leases("holder=WORKER-2"), "holder: owner substring, any case")
	require.Equal(t, []string{"shard-1/free"}, leases("state=all&q=shard&after=shard-0"))

	_, body := get(t, ts, "/")
	require.Contains(t, body, `id="leases-next" href="./?after=lease%3Aa"`)
	require.NotContains(t, body, `id="leases-first"`)
	require.Contains(t, body, `<tr data-waiter="waiter-7" data-name="lease:a" data-position="1"><td>lease:a</td><td>lease</td><td>1</td><td>waiter-7</td><td>waiter-7</td>`,
		"lease waiters are listed, with their place and owner")
	require.Contains(t, body, `id="advisory-next" href="./?offset=1"`)
	_, body = get(t, ts, "/?offset=2")
	require.Contains(t, body, `id="advisory-prev" href="./?offset=1"`)
	require.Contains(t, body, `data-lock="job:admin"`)
	require.Contains(t, body, `<td>waiting</td>`, "the third advisory row is the waiter")
	_, body = get(t, ts, "/?locks=waiting&holder=admin-waiter")
	require.Contains(t, body, "admin-waiter")
	require.NotContains(t, body, "admin-holder</td>")

	for _, bad := range []string{"state=gone", "locks=maybe", "offset=-1", "refresh=1", "q=" + strings.Repeat("x", 1025)} {
		code, _ := get(t, ts, "/?"+bad)
		require.Equal(t, http.StatusBadRequest, code, bad)
	}
}

// A lost grant in its lock-delay shows as state lock-delay, with the
// delay's end, and under the lock-delay filter.
func TestLeaseInLockDelay(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	_, err := f.pool.Exec(ctx, `SELECT pgbaton.lease_attempt('lease:lost', 'worker-4', 1, p_lock_delay_ms => 60000)`)
	require.NoError(t, err)
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var expired bool
		err := f.pool.QueryRow(ctx, `SELECT NOT held FROM pgbaton.lease_status WHERE name = 'lease:lost'`).Scan(&expired)
		return expired, err
	}, "lease:lost does not expire")
	ts := serve(t, f.pool, admin.Config{})
	code, body := get(t, ts, "/?state=lock-delay")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `<tr data-lease="lease:lost" data-state="lock-delay">`)
	require.Contains(t, body, "lock-delay until 20")
	_, body = get(t, ts, "/?state=expired")
	require.Contains(t, body, `data-state="lock-delay"`, "a lease in lock-delay has expired")
	_, body = get(t, ts, "/")
	require.NotContains(t, body, `data-lease="lease:lost"`, "not held")
}

// The lease waiters are the wait queues (pgbaton.lease_queue): by name,
// then in the order they are served, with their owner; a waiter whose
// lease session expired is not in the queue and takes no place in it.
func TestLeaseWaitersInQueueOrder(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	for _, sql := range []string{
		`SELECT pgbaton.wait_for('lease:a', 'ghost/1', false, NULL, 1)`, // dead in a millisecond
		`SELECT pgbaton.wait_for('shards', 'worker-8/1', true)`,
		`SELECT pgbaton.wait_for('lease:a', 'waiter-7')`,
		`SELECT pgbaton.wait_for('lease:a', 'worker-9/2')`,
	} {
		_, err := f.pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	time.Sleep(5 * time.Millisecond) // the ghost's lease session expires
	ts := serve(t, f.pool, admin.Config{})
	waiters := func(query string) []string {
		t.Helper()
		code, body := get(t, ts, "/?"+query)
		require.Equal(t, http.StatusOK, code, body)
		var rows []string
		for _, part := range strings.Split(body, `<tr data-waiter="`)[1:] {
			cells := strings.Split(part[strings.Index(part, "<td>"):strings.Index(part, "</tr>")], "</td>")
			for i := range cells {
				cells[i] = strings.TrimPrefix(cells[i], "<td>")
			}
			rows = append(rows, strings.Join(cells[:5], " ")) // name, kind, position, owner, waiter
		}
		return rows
	}
	require.Equal(t, []string{
		"lease:a lease 1 waiter-7 waiter-7",
		"lease:a lease 2 worker-9 worker-9/2",
		"shards group 1 worker-8 worker-8/1",
	}, waiters(""))
	require.Equal(t, []string{"lease:a lease 2 worker-9 worker-9/2"}, waiters("holder=WORKER-9"), "holder: owner or waiter, any case")
	require.Equal(t, []string{"shards group 1 worker-8 worker-8/1"}, waiters("q=sh"))
	_, body := get(t, ts, "/?holder=nobody")
	require.Contains(t, body, "Nobody waits for a lease that matches the filter")
}

// Auto-refresh is a <meta> tag (the page has no JavaScript), kept by the
// filter form and the refresh links.
func TestAutoRefresh(t *testing.T) {
	ts := serve(t, env.DB(t).Pool(t), admin.Config{})
	_, body := get(t, ts, "/")
	require.NotContains(t, body, `http-equiv="refresh"`)
	require.Contains(t, body, `<a href="./?refresh=15">15s</a>`)
	_, body = get(t, ts, "/?refresh=15&q=job")
	require.Contains(t, body, `<meta http-equiv="refresh" content="15">`)
	require.Contains(t, body, `<input type="hidden" name="refresh" value="15">`)
	require.Contains(t, body, `<a href="./?q=job">off</a>`)
}

// The handler mounted under a prefix of the user's own server, behind the
// user's own authentication: every link, form and redirect stays under the
// prefix, and the security checks still hold.
func TestMountedUnderAPrefixBehindOwnAuth(t *testing.T) {
	f := newFixture(t)
	srv, err := admin.New(f.pool, admin.Config{AdminToken: testToken})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/pgbaton/", basicAuth("sre", "s3cret", http.StripPrefix("/ops/pgbaton", srv)))
	mux.HandleFunc("/", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "the app", http.StatusTeapot) })
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	base := ts.URL + "/ops/pgbaton/"
	tr := &http.Transport{}
	t.Cleanup(tr.CloseIdleConnections)
	authed := &http.Client{Jar: jar, Transport: authTransport{"sre", "s3cret", tr},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	resp, err := (&http.Client{Transport: tr}).Get(base)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusUnauthorized, resp.StatusCode, "the user's auth runs first")

	code, body := getWith(t, authed, base)
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `href="static/admin.css"`)
	require.Contains(t, body, `action="session"`)
	code, _ = getWith(t, authed, base+"static/admin.css")
	require.Equal(t, http.StatusOK, code)
	code, body = getWith(t, authed, base+"metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "pgbaton_up 1")
	csrf := reCSRF.FindStringSubmatch(body + getBody(t, authed, base))[1]

	resp = postRaw(t, authed, ts.URL, base+"session", url.Values{"csrf": {csrf}, "action": {"unlock"}, "admin_token": {testToken}, "return": {"state=all"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	loc, err := resp.Request.URL.Parse(resp.Header.Get("Location"))
	require.NoError(t, err)
	require.Equal(t, "/ops/pgbaton/?state=all", loc.RequestURI(), "redirected under the prefix")
	for _, c := range resp.Cookies() {
		require.Empty(t, c.Path, "%s: scoped by the browser to the mount point", c.Name)
	}
	body = getBody(t, authed, loc.String())
	require.Contains(t, body, `action="release"`)

	resp = postRaw(t, authed, ts.URL, base+"release", url.Values{"csrf": {csrf}, "kind": {"lease"}, "name": {"lease:a"}, "reason": {"mounted"}})
	require.Equal(t, http.StatusSeeOther, resp.StatusCode)
	require.Equal(t, "", leaseOwner(t, f.pool, "lease:a"))
	require.Contains(t, getBody(t, authed, base), "released lease lease:a")

	resp = postRaw(t, authed, "http://evil.example", base+"release", url.Values{"csrf": {csrf}, "kind": {"lease"}, "name": {"shard-0"}, "reason": {"x"}})
	require.Equal(t, http.StatusForbidden, resp.StatusCode, "cross-origin refused under a prefix too")
	require.Equal(t, 1, eventCount(t, f.pool))
}

func basicAuth(user, pass string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, ok := r.BasicAuth()
		if !ok || u != user || p != pass {
			w.Header().Set("WWW-Authenticate", `Basic realm="ops"`)
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

type authTransport struct {
	user, pass string
	next       http.RoundTripper
}

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.SetBasicAuth(a.user, a.pass)
	return a.next.RoundTrip(r)
}

func getWith(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(b)
}

func getBody(t *testing.T, c *http.Client, u string) string {
	t.Helper()
	code, body := getWith(t, c, u)
	require.Equal(t, http.StatusOK, code, body)
	return body
}

// On a standby the page says so and still shows what the standby has (its
// replicated leases); it does not fail on the waiter registry, an unlogged
// table a standby cannot read.
func TestPageOnAStandby(t *testing.T) {
	if env.Cluster() == nil {
		t.Skip("needs the throwaway cluster") // only with PGBATON_TEST_DSN
	}
	ctx := context.Background()
	d := env.DB(t)
	_, err := d.Pool(t).Exec(ctx, `SELECT pgbaton.try_acquire('lease:replicated', 'w', 600000)`)
	require.NoError(t, err)
	_, err = env.AdminPool().Exec(ctx, "CHECKPOINT")
	require.NoError(t, err)
	standby := pgtest.NewStandby(t, env.Cluster())
	pool := pgtest.Pool(t, standby.URL(d.Name))
	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		var n int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pgbaton.lease WHERE name = 'lease:replicated'`).Scan(&n)
		return err == nil && n == 1, nil
	}, "the standby has the lease")
	ts := serve(t, pool, admin.Config{})
	code, body := get(t, ts, "/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="standby"`)
	require.Contains(t, body, `data-lease="lease:replicated"`)
	code, body = get(t, ts, "/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "pgbaton_up 1")
}

// Elections show their leader, term and rank, and a pending request that
// the leader resign.
func TestElectionsShowLeaderAndResignRequest(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t)
	for _, sql := range []string{
		`SELECT pgbaton.lease_attempt('scheduler', 'replica-a', 600000, '{"value": "10.0.0.7:8080", "rank": 2}')`,
		`SELECT pgbaton.request_resign('scheduler', 'drain node-3', 'oncall')`,
	} {
		_, err := f.pool.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	ts := serve(t, f.pool, admin.Config{})
	code, body := get(t, ts, "/")
	require.Equal(t, http.StatusOK, code, body)
	i := strings.Index(body, `<tr data-election="scheduler">`)
	require.GreaterOrEqual(t, i, 0, body)
	row := body[i : i+strings.Index(body[i:], "</tr>")]
	for _, want := range []string{"<td>replica-a</td>", "<td>10.0.0.7:8080</td>", "<td>2</td>", "by oncall: drain node-3"} {
		require.Contains(t, row, want)
	}
	_, body = get(t, ts, "/?holder=nobody")
	require.Contains(t, body, "No election has a leader that matches the filter")
}
