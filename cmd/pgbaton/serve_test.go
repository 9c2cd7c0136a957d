package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// startServe runs `pgbaton serve` until the returned stop is called, and
// returns the URL it listens on. stop returns the exit code.
func startServe(t *testing.T, args ...string) (url string, stop func() int) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		var stdout strings.Builder
		code := run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), &stdout, pw)
		pw.Close()
		done <- code
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	re := regexp.MustCompile(`^pgbaton serve: (http://127\.0\.0\.1:\d+)/`)
	var all []string
	timeout := time.After(30 * time.Second)
	for url == "" {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("serve exited with %d before listening: %s", <-done, strings.Join(all, "\n"))
			}
			all = append(all, line)
			if m := re.FindStringSubmatch(line); m != nil {
				url = m[1]
			}
		case <-timeout:
			cancel()
			t.Fatalf("serve did not say where it listens: %s", strings.Join(all, "\n"))
		}
	}
	go func() {
		for range lines { // keep the server's log flowing
		}
	}()
	var code *int
	stop = func() int {
		if code == nil {
			cancel() // Ctrl-C
			select {
			case c := <-done:
				code = &c
			case <-time.After(15 * time.Second):
				t.Fatal("serve did not stop on cancel")
			}
		}
		return *code
	}
	t.Cleanup(func() { stop() })
	return url, stop
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	client := &http.Client{Transport: &http.Transport{}, Timeout: 30 * time.Second}
	defer client.CloseIdleConnections()
	resp, err := client.Get(url)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

func TestServeMetricsPageAndCleanShutdown(t *testing.T) {
	f := newFixture(t)
	t.Setenv(envAdminToken, "a-token-from-the-environment")
	url, stop := startServe(t, "--dsn", f.db.URL)

	code, body := httpGet(t, url+"/metrics")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "\npgbaton_up 1\n")
	require.Contains(t, body, "\npgbaton_advisory_lock_waiters 1\n")

	code, body = httpGet(t, url+"/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "job:golden")
	require.Contains(t, body, "lease:alpha")
	require.Contains(t, body, `<form id="unlock"`, "the token from the environment enables releases")

	require.Equal(t, exitOK, stop(), "Ctrl-C is a clean exit")
	client := &http.Client{Transport: &http.Transport{}, Timeout: 5 * time.Second}
	_, err := client.Get(url + "/healthz")
	require.Error(t, err, "the listener is closed")
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		var left int
		err := env.AdminPool().QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name = 'pgbaton-cli'`, f.db.Name).Scan(&left)
		return left == 0, err
	}, "serve left connections open")
}

func TestServeReadOnlyWithoutToken(t *testing.T) {
	d := env.DB(t)
	t.Setenv(envAdminToken, "")
	url, stop := startServe(t, "--dsn", d.URL)
	code, body := httpGet(t, url+"/")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "Read-only")
	require.NotContains(t, body, `id="unlock"`)
	require.NotContains(t, body, `action="release"`)
	require.Equal(t, exitOK, stop())
}

func TestServeUsageErrors(t *testing.T) {
	d := env.DB(t)
	t.Setenv(envAdminToken, "")
	for _, args := range [][]string{
		{"serve", "--dsn", d.URL, "--listen", "127.0.0.1:0", "--admin-token", "short"},
		{"serve", "--dsn", d.URL, "--listen", "no-port"},
		{"serve", "--dsn", d.URL, "--listen", "127.0.0.1:0", "--top", "-1"},
		{"serve", "extra-arg"},
	} {
		code, _, errOut := cli(t, args...)
		require.Equal(t, exitUsage, code, "%v: %s", args, errOut)
	}
	code, _, errOut := cli(t, "serve", "--dsn", d.URL, "--listen", "127.0.0.1:0", "--admin-token", "short")
	require.Equal(t, exitUsage, code)
	require.Contains(t, errOut, "at least 16")
}
