//go:build linux

package main

import (
	"bufio"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var (
	builtOnce sync.Once
	builtPath string
	builtErr  error
)

// binary builds the CLI once: pgbaton exec starts itself again as the
// watchdog, which the test binary cannot stand in for.
func binary(t *testing.T) string {
	t.Helper()
	builtOnce.Do(func() {
		dir, err := os.MkdirTemp("", "pgbaton-exec-test")
		if err != nil {
			builtErr = err
			return
		}
		builtPath = filepath.Join(dir, "pgbaton")
		out, err := exec.Command("go", "build", "-o", builtPath, ".").CombinedOutput()
		if err != nil {
			builtErr = errors.New(string(out))
		}
	})
	require.NoError(t, builtErr)
	return builtPath
}

// pgbatonExec starts `pgbaton exec` with args; its stdout lines arrive on
// the returned channel.
func pgbatonExec(t *testing.T, url string, args ...string) (*exec.Cmd, <-chan string) {
	t.Helper()
	cmd := exec.Command(binary(t), append([]string{"exec", "--dsn", url}, args...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	lines := make(chan string, 64)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	return cmd, lines
}

func expectLine(t *testing.T, lines <-chan string, prefix string) string {
	t.Helper()
	timeout := time.After(60 * time.Second)
	for {
		select {
		case l, ok := <-lines:
			require.True(t, ok, "output ended before %q", prefix)
			if v, found := strings.CutPrefix(l, prefix); found {
				return v
			}
		case <-timeout:
			t.Fatalf("no line %q", prefix)
		}
	}
}

func exitCode(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Wait()
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	require.NoError(t, err)
	return 0
}

// alive says whether process pid still runs (a zombie does not).
func alive(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	fields := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
	return len(fields) > 0 && fields[0] != "Z"
}

// pgbaton exec frozen while its command runs: the command is dead before
// the next holder's command starts, and pgbaton exec, thawed, says the
// lock was lost.
func TestExecKillsTheCommandWhenFrozen(t *testing.T) {
	db := env.DB(t)
	dir := t.TempDir()
	beats := filepath.Join(dir, "beats")
	// Ignores SIGTERM: only the SIGKILL by the deadline stops it.
	holder, lines := pgbatonExec(t, db.URL, "--lease", "nightly", "--ttl", "3s", "--kill-grace", "500ms", "--",
		"sh", "-c", `trap "" TERM; echo "pid $$"; while :; do date +%s%N >> `+beats+`; sleep 0.01; done`)
	pid, err := strconv.Atoi(expectLine(t, lines, "pid "))
	require.NoError(t, err)
	require.NoError(t, holder.Process.Signal(syscall.SIGSTOP))
	stopped := time.Now()

	next, nextLines := pgbatonExec(t, db.URL, "--lease", "nightly", "--wait", "--", "sh", "-c", "date +%s%N")
	started, err := strconv.ParseInt(expectLine(t, nextLines, ""), 10, 64)
	require.NoError(t, err)
	require.Equal(t, 0, exitCode(t, next))

	data, err := os.ReadFile(beats)
	require.NoError(t, err)
	all := strings.Fields(string(data))
	last, err := strconv.ParseInt(all[len(all)-1], 10, 64)
	require.NoError(t, err)
	assert.False(t, alive(pid), "the frozen holder's command is dead")
	margin := time.Duration(started - last)
	t.Logf("frozen at %s; the holder's command beat last %s before the next holder's command started (%s after the freeze)",
		stopped.Format(time.StampMilli), margin, time.Duration(started-stopped.UnixNano()))
	assert.Greater(t, started, last, "the next holder's command started after the frozen holder's command stopped")

	thawed := time.Now()
	require.NoError(t, holder.Process.Signal(syscall.SIGCONT))
	assert.Equal(t, exitLost, exitCode(t, holder), "thawed, it reports the lock lost")
	t.Logf("thawed, pgbaton exec exited in %s", time.Since(thawed))
}

func TestExecSkipExitCodesSignalsAndEnvironment(t *testing.T) {
	db := env.DB(t)
	holder, lines := pgbatonExec(t, db.URL, "--lease", "report", "--", "sh", "-c", `echo "token $PGBATON_TOKEN $PGBATON_LEASE"; sleep 60`)
	token := expectLine(t, lines, "token ")
	assert.Regexp(t, `^[0-9]+ report$`, token)

	skipStart := time.Now()
	skip, _ := pgbatonExec(t, db.URL, "--lease", "report", "--skip", "--", "true")
	assert.Equal(t, exitNotAcquired, exitCode(t, skip), "--skip exits 75 while another holds it")
	t.Logf("--skip returned in %s", time.Since(skipStart))

	// SIGTERM to pgbaton exec reaches the command; its exit is exec's.
	require.NoError(t, holder.Process.Signal(syscall.SIGTERM))
	assert.Equal(t, 128+int(syscall.SIGTERM), exitCode(t, holder))

	c, _ := pgbatonExec(t, db.URL, "--lease", "report", "--", "sh", "-c", "exit 7")
	assert.Equal(t, 7, exitCode(t, c))
	c, _ = pgbatonExec(t, db.URL, "--lease", "exports", "-n", "2", "--", "sh", "-c",
		`case "$PGBATON_LEASE" in exports#*) exit 0;; esac; exit 9`)
	assert.Equal(t, 0, exitCode(t, c), "a semaphore's permit is named NAME#i")
	// Usage errors stop before anything runs, so in-process will do.
	code, _, _ := cli(t, "exec", "--dsn", db.URL, "--", "true")
	assert.Equal(t, exitUsage, code, "no --lease")
	code, _, _ = cli(t, "exec", "--dsn", db.URL, "--lease", "x", "--skip", "--wait", "--", "true")
	assert.Equal(t, exitUsage, code)

	// The lease was given back each time.
	var held int
	require.NoError(t, db.Pool(t).QueryRow(context.Background(), "SELECT count(*) FROM pgbaton.lease_status WHERE held").Scan(&held))
	assert.Zero(t, held)

}
