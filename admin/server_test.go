package admin_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/admin"
)

func TestNewRejectsBadInput(t *testing.T) {
	pool := env.DB(t).Pool(t)
	for name, tc := range map[string]struct {
		cfg  admin.Config
		nilp bool
	}{
		"nil pool":         {nilp: true},
		"short token":      {cfg: admin.Config{AdminToken: "secret"}},
		"negative TopN":    {cfg: admin.Config{TopN: -1}},
		"huge TopN":        {cfg: admin.Config{TopN: 1 << 20}},
		"negative timeout": {cfg: admin.Config{QueryTimeout: -time.Second}},
	} {
		t.Run(name, func(t *testing.T) {
			p := pool
			if tc.nilp {
				p = nil
			}
			srv, err := admin.New(p, tc.cfg)
			require.ErrorIs(t, err, pgbaton.ErrInvalidArgument)
			require.Nil(t, srv)
		})
	}
}

func TestPageShowsLocksLeasesRunsAndEvents(t *testing.T) {
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{AdminToken: testToken})
	unlock(t, ts)
	code, body := get(t, ts, "/")
	require.Equal(t, http.StatusOK, code)
	holderPID := fmt.Sprint(f.holder.PgConn().PID())
	for _, want := range []string{
		`<tr data-lock="job:admin">`, `<td>(7,-8)</td>`, holderPID, "admin-holder", "waiting",
		`<tr data-lease="lease:a" data-state="held">`, "worker-1", `<tr data-lease="shard-0" data-state="held">`, "worker-2", "shards",
		"nightly-export", "disk full", "No forced releases yet.",
		`<form method="post" action="release" class="release" data-kind="lease" data-lease="lease:a">`,
		`data-kind="advisory" data-lock="job:admin"`,
	} {
		require.Contains(t, body, want)
	}
	require.NotContains(t, body, `data-lease="shard-1"`, "free leases are not listed")
	require.NotContains(t, body, "not a member of pgbaton_admin")
	// The waiter's row has no release form: only holders can be terminated.
	require.Equal(t, 2, strings.Count(body, `data-kind="advisory"`), "one form per held advisory lock")
}

func TestPageIsReadOnlyWithoutToken(t *testing.T) {
	f := newFixture(t)
	ts := serve(t, f.pool, admin.Config{})
	code, body := get(t, ts, "/")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "lease:a")
	require.Contains(t, body, "Read-only")
	require.NotContains(t, body, `action="release"`)
	require.NotContains(t, body, `id="unlock"`)

	code, body = post(t, ts, leaseForm("x", "lease:a", "stuck", testToken), nil)
	require.Equal(t, http.StatusForbidden, code)
	require.Contains(t, body, "releases are disabled")
	require.Equal(t, "worker-1", leaseOwner(t, f.pool, "lease:a"))
	require.Zero(t, eventCount(t, f.pool))
}

func TestPageSecurityHeaders(t *testing.T) {
	ts := serve(t, env.DB(t).Pool(t), admin.Config{AdminToken: testToken})
	resp, err := ts.Client().Get(ts.URL + "/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, "DENY", resp.Header.Get("X-Frame-Options"))
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "frame-ancestors 'none'")
	require.Contains(t, resp.Header.Get("Content-Security-Policy"), "form-action 'self'")
	var csrf *http.Cookie
	for _, c := range resp.Cookies() {
		if c.Name == "pgbaton_csrf" {
			csrf = c
		}
	}
	require.NotNil(t, csrf, "the page sets the CSRF cookie")
	require.Equal(t, http.SameSiteStrictMode, csrf.SameSite)
	require.True(t, csrf.HttpOnly)

	code, _ := get(t, ts, "/static/admin.css")
	require.Equal(t, http.StatusOK, code)
	code, _ = get(t, ts, "/nope")
	require.Equal(t, http.StatusNotFound, code)
}

func TestPageOnUnmigratedDatabase(t *testing.T) {
	ts := serve(t, env.EmptyDB(t).Pool(t), admin.Config{})
	code, body := get(t, ts, "/")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "pgbaton migrate up")

	code, body = get(t, ts, "/metrics")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "\npgbaton_up 0\n")
	require.NotContains(t, body, "pgbaton_leases{")
}

func TestHealthz(t *testing.T) {
	d := env.DB(t)
	pool := d.Pool(t)
	ts := serve(t, pool, admin.Config{})
	code, body := get(t, ts, "/healthz")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "ok\n", body)

	pool.Close()
	code, body = get(t, ts, "/healthz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Contains(t, body, "database unreachable")
}

func TestServeStopsWhenContextEnds(t *testing.T) {
	d := env.DB(t)
	srv, err := admin.New(d.Pool(t), admin.Config{})
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ctx, ln) }()

	client := &http.Client{Transport: &http.Transport{}}
	defer client.CloseIdleConnections()
	resp, err := client.Get("http://" + ln.Addr().String() + "/healthz")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
	_, err = net.Dial("tcp", ln.Addr().String())
	require.Error(t, err, "the listener is closed")
}

func TestListenAndServeBadAddress(t *testing.T) {
	srv, err := admin.New(env.DB(t).Pool(t), admin.Config{})
	require.NoError(t, err)
	for _, addr := range []string{"", ":9187", "127.0.0.1", "localhost"} {
		err = srv.ListenAndServe(context.Background(), addr)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "%q", addr)
	}
	err = srv.ListenAndServe(context.Background(), "127.0.0.1:notaport")
	require.Error(t, err)
	require.ErrorIs(t, srv.Serve(context.Background(), nil), pgbaton.ErrInvalidArgument)

	// A port somebody else listens on.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	err = srv.ListenAndServe(context.Background(), ln.Addr().String())
	require.ErrorContains(t, err, "address already in use")
}
