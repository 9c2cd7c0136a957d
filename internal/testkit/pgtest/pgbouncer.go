package pgtest

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
)

// PgBouncerConfig is how StartPgBouncerWith configures PgBouncer.
type PgBouncerConfig struct {
	// PoolMode is "transaction" (default), "session" or "statement".
	PoolMode string
	// PoolSize is default_pool_size: server connections per database and
	// user. Default 4.
	PoolSize int
	// MaxPreparedStatements turns on PgBouncer's own prepared statement
	// support (PgBouncer 1.21 and later; see PgBouncerPreparedStatements).
	// Default 0: off, as it always is before 1.21.
	MaxPreparedStatements int
}

// StartPgBouncer starts PgBouncer in transaction pooling mode in front of
// the test database, on a free port, and returns the URL of the database
// through it. It runs as an unprivileged user when the test runs as root
// (PgBouncer refuses root) and is stopped when t ends.
func StartPgBouncer(t testing.TB, d *DB) string {
	t.Helper()
	return StartPgBouncerWith(t, d, PgBouncerConfig{})
}

func pgbouncerBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("pgbouncer")
	if err != nil {
		bin = "/usr/sbin/pgbouncer" // Debian installs it outside a user's PATH
		if _, statErr := os.Stat(bin); statErr != nil {
			t.Fatalf("pgbouncer not installed (apt-get install pgbouncer; `make test` installs it when run as root): %v", err)
		}
	}
	return bin
}

// PgBouncerPreparedStatements reports whether the installed PgBouncer has
// prepared statement support (max_prepared_statements, 1.21 and later),
// with its version line.
func PgBouncerPreparedStatements(t testing.TB) (bool, string) {
	t.Helper()
	out, err := exec.Command(pgbouncerBinary(t), "--version").Output()
	require.NoError(t, err)
	line := strings.SplitN(string(out), "\n", 2)[0]
	var major, minor int
	if _, err := fmt.Sscanf(strings.TrimPrefix(line, "PgBouncer "), "%d.%d", &major, &minor); err != nil {
		t.Fatalf("pgbouncer --version: %q: %v", line, err)
	}
	return major > 1 || (major == 1 && minor >= 21), line
}

// StartPgBouncerWith is StartPgBouncer with a pool mode, pool size and
// prepared statement support of choice.
func StartPgBouncerWith(t testing.TB, d *DB, cfg PgBouncerConfig) string {
	t.Helper()
	bin := pgbouncerBinary(t)
	if cfg.PoolMode == "" {
		cfg.PoolMode = "transaction"
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 4
	}
	extra := ""
	if cfg.MaxPreparedStatements > 0 {
		extra = fmt.Sprintf("max_prepared_statements = %d\n", cfg.MaxPreparedStatements)
	}
	u, err := url.Parse(d.URL)
	require.NoError(t, err)
	host, port, err := net.SplitHostPort(u.Host)
	require.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	listen := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())

	dir, err := os.MkdirTemp("", "pgbaton-pgbouncer-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755))
	userName := u.User.Username()
	ini := fmt.Sprintf(`[databases]
%s = host=%s port=%s dbname=%s
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 100
ignore_startup_parameters = extra_float_digits,application_name
logfile = %s
%s`, d.Name, host, port, d.Name, listen, filepath.Join(dir, "users.txt"), cfg.PoolMode, cfg.PoolSize, filepath.Join(dir, "pgbouncer.log"), extra)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "pgbouncer.ini"), []byte(ini), 0o644))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "users.txt"), []byte(strconv.Quote(userName)+` ""`+"\n"), 0o644))

	cmd := exec.Command(bin, filepath.Join(dir, "pgbouncer.ini"))
	if os.Geteuid() == 0 {
		cred, err := pgcluster.Unprivileged()
		require.NoError(t, err)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		require.NoError(t, os.Chown(dir, int(cred.Uid), int(cred.Gid)))
	}
	require.NoError(t, cmd.Start())
	logPath := filepath.Join(dir, "pgbouncer.log")
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	t.Cleanup(func() {
		if t.Failed() {
			log, _ := os.ReadFile(logPath)
			t.Logf("pgbouncer log:\n%s", log)
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
	})
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(listen))
	Eventually(t, 10*time.Second, func() (bool, error) {
		select {
		case <-exited:
			log, _ := os.ReadFile(logPath)
			return false, fmt.Errorf("pgtest: pgbouncer exited: %s", log)
		default:
		}
		c, err := net.Dial("tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		return err == nil, nil
	}, "pgbouncer does not listen on %s", addr)
	u.Host = addr
	return u.String()
}
