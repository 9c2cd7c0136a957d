package admin_test

import (
	"context"
	"fmt"
	"os/exec"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/admin"
	"github.com/pgbaton/pgbaton/internal/pgtest"
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
			"(Debian: apt-get install -y chromium chromium-driver; .ci/run installs it)")
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

// submit fills in and submits the release form sel, ticking the terminate
// checkbox when asked, and waits for the page that reports the outcome.
func (b *tab) submit(url, sel, reason, token string, terminate bool) string {
	b.t.Helper()
	steps := []chromedp.Action[chromedp.Void]{
		// Start from a fresh page, which has no #flash yet.
		chromedp.Navigate(url),
		chromedp.WaitVisible(chromedp.CSS(sel + " button")),
	}
	if terminate {
		steps = append(steps, chromedp.Click(chromedp.CSS(sel+" input[name=terminate]")))
	}
	steps = append(steps,
		chromedp.SendKeys(chromedp.CSS(sel+" input[name=reason]"), reason),
		chromedp.SendKeys(chromedp.CSS(sel+" input[name=admin_token]"), token),
		chromedp.Click(chromedp.CSS(sel+" button")),
		chromedp.WaitVisible(chromedp.CSS("#flash")),
	)
	b.do(steps...)
	return b.text("#flash")
}

// TestBrowserReleaseIsAudited drives the admin page in Chromium: it shows
// the locks this test holds; a lease released through the form is freed
// and audited; an advisory lock's holder is terminated only with the
// checkbox ticked.
func TestBrowserReleaseIsAudited(t *testing.T) {
	ctx := context.Background()
	d := env.DB(t)
	pool := d.Pool(t)
	holder := pgtest.Connect(t, d.URL, "browser-holder")
	for _, sql := range []string{
		`INSERT INTO pgbaton.advisory_name (key, name) VALUES (pgbaton.advisory_key('job:browser'), 'job:browser')`,
		`SELECT pg_advisory_lock(pgbaton.advisory_key('job:browser'))`,
		`SELECT pgbaton.try_acquire('lease:browser', 'worker-browser', 600000)`,
	} {
		_, err := holder.Exec(ctx, sql)
		require.NoError(t, err, sql)
	}
	ts := serve(t, pool, admin.Config{AdminToken: testToken})
	b := browser(t)

	b.do(chromedp.Navigate(ts.URL), chromedp.WaitVisible(chromedp.CSS("#leases")))
	advisory, leases := b.text("#advisory"), b.text("#leases")
	require.Contains(t, advisory, "job:browser")
	require.Contains(t, advisory, fmt.Sprint(holder.PgConn().PID()))
	require.Contains(t, advisory, "browser-holder")
	require.Contains(t, leases, "lease:browser")
	require.Contains(t, leases, "worker-browser")

	// Force-release the lease through its form.
	flash := b.submit(ts.URL, `form[data-lease="lease:browser"]`, "stuck since the deploy", testToken, false)
	require.Contains(t, flash, "released lease lease:browser (was held by worker-browser")
	require.NotContains(t, b.text("#leases"), "lease:browser")
	require.Contains(t, b.text("#events"), "stuck since the deploy")
	require.Equal(t, "", leaseOwner(t, pool, "lease:browser"), "the lease is free")
	var action, target, reason string
	require.NoError(t, pool.QueryRow(ctx, `SELECT action, target, reason FROM pgbaton.event`).Scan(&action, &target, &reason))
	require.Equal(t, []string{"force_release_lease", "lease:browser", "stuck since the deploy"}, []string{action, target, reason})

	// A wrong admin token changes nothing.
	form := `form[data-lock="job:browser"]`
	flash = b.submit(ts.URL, form, "wedged", "not-the-admin-token", true)
	require.Contains(t, flash, "wrong admin token")
	// The advisory lock's form without the terminate checkbox changes nothing.
	flash = b.submit(ts.URL, form, "wedged", testToken, false)
	require.Contains(t, flash, `tick "terminate the holder's session"`)
	require.NoError(t, holder.Ping(ctx), "the holder is alive")
	require.Equal(t, 1, eventCount(t, pool))

	// Ticked, the holder's session ends and the lock is free.
	flash = b.submit(ts.URL, form, "wedged", testToken, true)
	require.Contains(t, flash, fmt.Sprintf("terminated backend %d, freeing job:browser", holder.PgConn().PID()))
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var held int
		err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'
			    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&held)
		return held == 0, err
	}, "job:browser is still held after its holder was terminated")
	require.Equal(t, 2, eventCount(t, pool))
}
