package admin_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/admin"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// browser starts a headless Chromium for t, closed when t ends. A missing
// Chromium fails the test: the admin page is only tested end to end in a
// real browser.
func browser(t *testing.T) *tab {
	t.Helper()
	var path string
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			path = p
			break
		}
	}
	if path == "" {
		t.Fatal("chromium is not installed: the admin page's end-to-end test needs it " +
			"(Debian: apt-get install -y chromium; `make test` installs it when run as root)")
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(path),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		// The test machine has no internet: without these Chromium waits
		// on connections to Google's services.
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelBrowser := chromedp.NewContext(allocCtx)
	t.Cleanup(func() {
		// Close the browser gracefully, then wait for its process to exit.
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_ = chromedp.Cancel(cctx)
		cancelBrowser()
		cancelAlloc()
	})
	// The first call starts the browser, which lives as long as the context
	// of that call: so no timeout on it. A broken installation fails here.
	require.NoError(t, chromedp.Do(ctx), "start chromium (%s)", path)
	return &tab{t: t, ctx: ctx}
}

// tab is the browser's one tab; every step has its own time limit.
type tab struct {
	t   *testing.T
	ctx context.Context
}

func (b *tab) do(steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	require.NoError(b.t, chromedp.Do(ctx, steps...))
}

func (b *tab) text(sel string) string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(sel)))
	require.NoError(b.t, err, "text of %s", sel)
	return s
}

func (b *tab) location() string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Location())
	require.NoError(b.t, err)
	return s
}

// submit fills in and submits the form sel on the page at url (typing
// each field of fields, ticking the checkboxes named in ticks) and waits
// for the page that reports the outcome.
func (b *tab) submit(url, sel string, fields map[string]string, ticks ...string) string {
	b.t.Helper()
	steps := []chromedp.Action[chromedp.Void]{
		// Start from a fresh page, which has no #flash yet.
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(sel + " button")),
	}
	for _, name := range ticks {
		steps = append(steps, chromedp.Click(chromedp.CSS(sel+" input[name="+name+"]")))
	}
	for name, value := range fields {
		steps = append(steps, chromedp.SendKeys(chromedp.CSS(sel+" input[name="+name+"]"), value))
	}
	steps = append(steps,
		chromedp.Click(chromedp.CSS(sel+" button")),
		chromedp.WaitVisible(chromedp.CSS("#flash")),
	)
	b.do(steps...)
	return b.text("#flash")
}

// TestBrowserFilterRefreshRelease drives the admin page in Chromium,
// mounted under a path prefix as in a user's own server: it shows the
// locks this test holds; the filter form narrows the view; auto-refresh
// reloads it by itself (a lease taken after the page loaded appears); the
// admin token is typed once; a lease released through its form is freed,
// audited, and the browser lands back on the same view (POST-redirect-GET);
// an advisory lock's holder is terminated only with the checkbox ticked.
func TestBrowserFilterRefreshRelease(t *testing.T) {
	ctx := context.Background()
	d := env.DB(t)
	pool := d.Pool(t)
	holder := pgtest.Connect(t, d.URL, "browser-holder")
	for _, sql := range []string{
		`INSERT INTO pgbaton.advisory_name (key, name) VALUES (pgbaton.advisory_key('job:browser'), 'job:browser')`,
		`SELECT pg_advisory_lock(pgbaton.advisory_key('job:browser'))`,
		`SELECT pgbaton.try_acquire('lease:browser', 'worker-browser', 600000)`,
		`SELECT pgbaton.try_acquire('other:lease', 'worker-other', 600000)`,
	} {
		_, err := holder.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	srv, err := admin.New(pool, admin.Config{AdminToken: testToken})
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.Handle("/ops/pgbaton/", http.StripPrefix("/ops/pgbaton", srv))
	ts := httptest.NewServer(mux)
	t.Cleanup(ts.Close)
	base := ts.URL + "/ops/pgbaton/"
	b := browser(t)

	b.do(chromedp.Navigate(base), chromedp.WaitVisible(chromedp.CSS("#leases")))
	advisory, leases := b.text("#advisory"), b.text("#leases")
	require.Contains(t, advisory, "job:browser")
	require.Contains(t, advisory, fmt.Sprint(holder.PgConn().PID()))
	require.Contains(t, advisory, "browser-holder")
	require.Contains(t, leases, "lease:browser")
	require.Contains(t, leases, "worker-browser")
	require.Contains(t, leases, "other:lease")

	// Filter by name prefix with the filter form.
	b.do(chromedp.SendKeys(chromedp.CSS("#filter input[name=q]"), "lease:"),
		chromedp.Click(chromedp.CSS("#filter button")),
		chromedp.WaitNotPresent(chromedp.CSS(`tr[data-lease="other:lease"]`)))
	require.Contains(t, b.text("#leases"), "lease:browser")
	require.Contains(t, b.location(), "/ops/pgbaton/?q=lease%3A")

	// Auto-refresh: a lease taken after the page loaded shows up by itself.
	b.do(chromedp.Click(chromedp.CSS(`#refresh a[href*="refresh=5"]`)),
		chromedp.WaitReady(chromedp.CSS(`meta[http-equiv="refresh"]`)))
	_, err = holder.Exec(ctx, `SELECT pgbaton.try_acquire('lease:late', 'worker-late', 600000)`)
	require.NoError(t, err)
	b.do(chromedp.WaitVisible(chromedp.CSS(`tr[data-lease="lease:late"]`))) // within the step's 30 s
	require.Contains(t, b.location(), "refresh=5", "the refresh keeps the view")
	b.do(chromedp.Click(chromedp.CSS(`#refresh a[href$="q=lease%3A"]`)),
		chromedp.WaitNotPresent(chromedp.CSS(`meta[http-equiv="refresh"]`)))
	view := b.location()

	// The admin token, once: a wrong one changes nothing.
	flash := b.submit(view, "#unlock", map[string]string{"admin_token": "not-the-admin-token"})
	require.Contains(t, flash, "wrong admin token")
	flash = b.submit(view, "#unlock", map[string]string{"admin_token": testToken})
	require.Contains(t, flash, "releases unlocked in this browser")

	// Force-release the lease through its form: no token asked again.
	flash = b.submit(view, `form[data-lease="lease:browser"]`, map[string]string{"reason": "stuck since the deploy"})
	require.Contains(t, flash, "released lease lease:browser (was held by worker-browser")
	require.Equal(t, view, b.location(), "back on the same view after the release")
	require.NotContains(t, b.text("#leases"), "lease:browser")
	require.Contains(t, b.text("#events"), "stuck since the deploy")
	require.Equal(t, "", leaseOwner(t, pool, "lease:browser"), "the lease is free")
	var action, target, reason string
	require.NoError(t, pool.QueryRow(ctx, `SELECT action, target, reason FROM pgbaton.event`).Scan(&action, &target, &reason))
	require.Equal(t, []string{"force_release_lease", "lease:browser", "stuck since the deploy"}, []string{action, target, reason})
	b.do(chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#leases")))
	require.Equal(t, 1, eventCount(t, pool), "a reload repeats nothing")

	// The advisory lock's form without the terminate checkbox changes nothing.
	form := `form[data-lock="job:browser"]`
	flash = b.submit(base, form, map[string]string{"reason": "wedged"})
	require.Contains(t, flash, `tick "terminate the holder's session"`)
	require.NoError(t, holder.Ping(ctx), "the holder is alive")
	require.Equal(t, 1, eventCount(t, pool))

	// Ticked, the holder's session ends and the lock is free.
	flash = b.submit(base, form, map[string]string{"reason": "wedged"}, "terminate")
	require.Contains(t, flash, fmt.Sprintf("terminated backend %d, freeing job:browser", holder.PgConn().PID()))
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var held int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&held)
		return held == 0, err
	}, "job:browser is still held after its holder was terminated")
	require.Equal(t, 2, eventCount(t, pool))
}
