//go:build linux

package main

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// watch moves the cursor and colours only on a terminal, and colours
// nothing with NO_COLOR; piped, its output has no control characters.
func TestWatchEscapesOnlyOnATerminal(t *testing.T) {
	f := newFixture(t)
	args := []string{"watch", "--dsn", f.db.URL, "--count", "2", "--interval", "10ms"}

	code, out, errOut := cli(t, args...)
	require.Equal(t, exitOK, code, errOut)
	require.NotContains(t, out, "\x1b", "piped: no escape sequences")
	require.Equal(t, 2, strings.Count(out, "pgbaton watch"))

	onTTY := func(env map[string]string) string {
		t.Helper()
		p := newPTY(t)
		s := streams{stdin: strings.NewReader(""), stdout: p.tty, stderr: os.Stderr, getenv: func(k string) string { return env[k] }}
		require.Equal(t, exitOK, runWith(context.Background(), s, args))
		return p.close()
	}
	out = onTTY(map[string]string{"TERM": "xterm"})
	require.Equal(t, 2, strings.Count(out, clearHome), "the screen is cleared before each view")
	require.Contains(t, out, sgrBold+"pgbaton watch")
	require.Contains(t, out, sgrYellow+"advisory: 3 held, 1 contended, 1 sessions waiting", "contention in colour")

	out = onTTY(map[string]string{"TERM": "xterm", "NO_COLOR": "1"})
	require.Contains(t, out, clearHome, "NO_COLOR keeps cursor control")
	require.NotContains(t, out, sgrBold)
	require.NotContains(t, out, sgrYellow)

	out = onTTY(map[string]string{"TERM": "dumb"})
	require.NotContains(t, out, "\x1b", "TERM=dumb: no escape sequences")
}

// release asks on a terminal and acts on the answer; without a terminal
// it asks nothing (TestReleaseAdvisoryTerminatesOnlyWhenAsked).
func TestReleaseAsksOnATerminal(t *testing.T) {
	f := newFixture(t)
	args := []string{"release", "lease:alpha", "--dsn", f.db.URL, "--reason", "asked"}

	p := newPTY(t)
	p.typeIn(t, "n\n")
	code, _, errOut := cliEnv(t, p.tty, nil, args...)
	require.Equal(t, exitError, code, errOut)
	require.Contains(t, errOut, "Force-release it? Its holder's fenced writes will fail. [y/N]")
	require.Contains(t, errOut, "not confirmed; nothing was changed")
	var owner string
	require.NoError(t, f.db.Pool(t).QueryRow(context.Background(), `SELECT owner FROM pgbaton.lease WHERE name = 'lease:alpha'`).Scan(&owner))
	require.Equal(t, "worker-1", owner)

	p = newPTY(t)
	p.typeIn(t, "y\n")
	start := time.Now()
	code, out, errOut := cliEnv(t, p.tty, nil, args...)
	require.Equal(t, exitOK, code, errOut)
	require.Contains(t, out, "lease lease:alpha")
	require.Less(t, time.Since(start), time.Minute)
}
