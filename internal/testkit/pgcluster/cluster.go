package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// ErrNoServerBinaries is returned when initdb and postgres cannot be found.
var ErrNoServerBinaries = errors.New("pgcluster: PostgreSQL server binaries (initdb, postgres) not found")

// ErrStopped is returned by methods of a cluster that was stopped.
var ErrStopped = errors.New("pgcluster: cluster is stopped")

// EnvBinDir names the variable that chooses the server binaries: the
// directory of initdb and postgres, used instead of the ones installed on
// the machine (`make test-matrix` points it at each major in turn).
const EnvBinDir = "PGBATON_PG_BINDIR"

// MinServerVersion is the oldest PostgreSQL major version pgbaton supports.
const MinServerVersion = 13

// Config configures Start. The zero value is a durable cluster with default
// settings.
type Config struct {
	// BinDir is the directory holding initdb and postgres. Default: found by
	// FindBinDir.
	BinDir string
	// NoFsync turns off fsync, synchronous_commit and full_page_writes, for
	// fast unit tests. Default false: the server is durable, as benchmarks and
	// crash tests need.
	NoFsync bool
	// Settings are extra server settings, passed as -c name=value. They win
	// over pgcluster's own defaults.
	Settings map[string]string
	// StartTimeout bounds how long Start and Restart wait for the server to
	// accept connections. Default 30s.
	StartTimeout time.Duration
	// Logger receives progress messages. Default: none.
	Logger *slog.Logger
	// FakeClock preloads libfaketime into the server, so that a test can
	// step the server's wall clock (StepClock) while it runs. Start fails
	// with ErrNoFaketime when libfaketime is not installed.
	FakeClock bool
}

// StopMode is how the server is shut down.
type StopMode int

const (
	// Fast rolls back open transactions and shuts down cleanly (SIGINT).
	Fast StopMode = iota
	// Immediate quits at once without a checkpoint, like a crash; the next
	// start runs crash recovery (SIGQUIT).
	Immediate
)

// Cluster is a running throwaway PostgreSQL server.
type Cluster struct {
	cfg     Config
	binDir  string
	dir     string
	dataDir string
	port    int
	cred    *syscall.Credential
	logger  *slog.Logger

	mu       sync.Mutex
	proc     *exec.Cmd
	exited   chan struct{}
	watchdog *exec.Cmd
	wdPipe   *os.File
	stopped  bool
	// clockOffset is the sum of StepClock's steps (FakeClock).
	clockOffset time.Duration
}

// watchdogScript runs beside the server. Its stdin is a pipe whose write end
// only the starting process holds; each line written is the postmaster pid
// (0: nothing to kill). At EOF, that is when the starting process has ended
// or called Stop, it shuts the server down and removes the directory.
const watchdogScript = `dir=$1; pg=
while IFS= read -r line; do pg=$line; done
if [ -n "$pg" ] && [ "$pg" != 0 ]; then
  kill -QUIT "$pg" 2>/dev/null
  i=0
  while kill -0 "$pg" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i+1)); done
  kill -KILL -- "-$pg" 2>/dev/null
fi
rm -rf -- "$dir"
`

// Start creates and starts a new cluster. The caller must call Stop.
func Start(ctx context.Context, cfg Config) (*Cluster, error) {
	return start(ctx, cfg, func(c *Cluster) error { return c.initdb(ctx) })
}

func start(ctx context.Context, cfg Config, populate func(*Cluster) error) (_ *Cluster, err error) {
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	binDir := cfg.BinDir
	if binDir == "" {
		if binDir, err = FindBinDir(); err != nil {
			return nil, err
		}
	}
	if err := checkVersion(binDir); err != nil {
		return nil, err
	}
	cred, err := serverCredential()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pgbaton-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: create temp dir: %w", err)
	}
	c := &Cluster{
		cfg: cfg, binDir: binDir, dir: dir, dataDir: filepath.Join(dir, "data"),
		cred: cred, logger: logger,
	}
	defer func() {
		if err != nil {
			c.Stop()
		}
	}()
	if err := c.startWatchdog(); err != nil {
		return nil, err
	}
	if cred != nil {
		if err := os.Chown(dir, int(cred.Uid), int(cred.Gid)); err != nil {
			return nil, fmt.Errorf("pgcluster: chown %s: %w", dir, err)
		}
	}
	if err := populate(c); err != nil {
		return nil, err
	}
	// The port is free when picked but may be taken before postgres binds it;
	// try a few.
	for attempt := 0; ; attempt++ {
		if c.port, err = FreePort(); err != nil {
			return nil, err
		}
		err = c.start(ctx)
		if err == nil || attempt == 4 || !strings.Contains(c.LogTail(), "could not bind") {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	logger.Info("throwaway postgres started", "port", c.port, "dir", dir)
	return c, nil
}

// FindBinDir finds the directory of the PostgreSQL server binaries:
// $PGBATON_PG_BINDIR when set (and nothing else then), else initdb on PATH,
// then `pg_config --bindir`, then the newest /usr/lib/postgresql/*/bin
// (Debian's place for versioned server binaries).
func FindBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		// A wrong setting must not quietly test another version.
		if !hasServer(dir) {
			return "", fmt.Errorf("%w in %s=%s", ErrNoServerBinaries, EnvBinDir, dir)
		}
		return dir, nil
	}
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil && hasServer(filepath.Dir(real)) {
			return filepath.Dir(real), nil
		}
	}
	if out, err := exec.Command("pg_config", "--bindir").Output(); err == nil {
		if dir := strings.TrimSpace(string(out)); hasServer(dir) {
			return dir, nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return majorOf(dirs[i]) > majorOf(dirs[j]) })
	for _, dir := range dirs {
		if hasServer(dir) {
			return dir, nil
		}
	}
	return "", fmt.Errorf("%w on PATH, via `pg_config --bindir` or under /usr/lib/postgresql/*/bin: "+
		"install the PostgreSQL server package (Debian/Ubuntu: apt-get install postgresql), "+
		"or point DATABASE_URL / PGBATON_TEST_DSN at a server", ErrNoServerBinaries)
}

func majorOf(binDir string) int {
	n, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return n
}

func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		if st, err := os.Stat(filepath.Join(dir, name)); err != nil || st.IsDir() {
			return false
		}
	}
	return true
}

func checkVersion(binDir string) error {
	out, err := exec.Command(filepath.Join(binDir, "postgres"), "--version").Output()
	if err != nil {
		return fmt.Errorf("pgcluster: postgres --version: %w", err)
	}
	// "postgres (PostgreSQL) 15.19 (Debian 15.19-0+deb12u1)"
	fields := strings.Fields(string(out))
	if len(fields) < 3 {
		return fmt.Errorf("pgcluster: cannot parse postgres --version output %q", out)
	}
	major, err := strconv.Atoi(strings.SplitN(fields[2], ".", 2)[0])
	if err != nil {
		return fmt.Errorf("pgcluster: cannot parse postgres --version output %q", out)
	}
	if major < MinServerVersion {
		return fmt.Errorf("pgcluster: PostgreSQL %d in %s is too old: pgbaton needs %d or newer", major, binDir, MinServerVersion)
	}
	return nil
}

// serverCredential returns the user to run the server as when we are root
// (initdb and postgres refuse to run as root), or nil.
func serverCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	return Unprivileged()
}

// Unprivileged returns the credential of the system user "postgres", or
// "nobody" when there is none: who to run servers as (PostgreSQL,
// PgBouncer) when the caller is root.
func Unprivileged() (*syscall.Credential, error) {
	for _, name := range []string{"postgres", "nobody"} {
		u, err := user.Lookup(name)
		if err != nil {
			continue
		}
		uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
		gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
		if err1 != nil || err2 != nil {
			continue
		}
		return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid), NoSetGroups: true}, nil
	}
	return nil, errors.New("pgcluster: no unprivileged user (postgres or nobody) to run the server as")
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago
// (another process may take it before the caller binds it).
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgcluster: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func (c *Cluster) startWatchdog() error {
	r, w, err := os.Pipe()
	if err != nil {
		return fmt.Errorf("pgcluster: watchdog pipe: %w", err)
	}
	defer r.Close()
	cmd := exec.Command("/bin/sh", "-c", watchdogScript, "pgcluster-watchdog", c.dir)
	cmd.Stdin = r
	// Own process group: a Ctrl-C aimed at `go test` must not kill the
	// watchdog before it has cleaned up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		w.Close()
		return fmt.Errorf("pgcluster: start watchdog: %w", err)
	}
	c.watchdog, c.wdPipe = cmd, w
	return nil
}

func (c *Cluster) initdb(ctx context.Context) error {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, "initdb"),
		"-D", c.dataDir, "-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C",
		// initdb's own fsync of the fresh files buys nothing for a throwaway
		// cluster; the server's fsync setting is separate.
		"--no-sync")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred}
	cmd.Dir = c.dir
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgcluster: initdb: %w\n%s", err, out)
	}
	return nil
}

func (c *Cluster) settings() []string {
	set := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"port":                    strconv.Itoa(c.port),
		"unix_socket_directories": c.dir,
		"max_connections":         "200",
		// Dynamic shared memory in files under the data directory, so that
		// nothing is left in /dev/shm even after a SIGKILL.
		"dynamic_shared_memory_type": "mmap",
		"logging_collector":          "off",
		"log_min_messages":           "warning",
	}
	if c.cfg.NoFsync {
		set["fsync"] = "off"
		set["synchronous_commit"] = "off"
		set["full_page_writes"] = "off"
	}
	for k, v := range c.cfg.Settings {
		set[k] = v
	}
	keys := make([]string, 0, len(set))
	for k := range set {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	args := []string{"-D", c.dataDir}
	for _, k := range keys {
		args = append(args, "-c", k+"="+set[k])
	}
	return args
}

func (c *Cluster) logPath() string { return filepath.Join(c.dir, "postgres.log") }

func (c *Cluster) start(ctx context.Context) error {
	logf, err := os.OpenFile(c.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgcluster: open server log: %w", err)
	}
	defer logf.Close()
	cmd := exec.Command(filepath.Join(c.binDir, "postgres"), c.settings()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Dir = c.dir
	if c.cfg.FakeClock {
		if cmd.Env, err = c.fakeClockEnv(); err != nil {
			return err
		}
	}
	// Own process group, so the watchdog can kill the postmaster with all its
	// backends, and so a terminal's Ctrl-C does not reach it directly.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: c.cred}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgcluster: start postgres: %w", err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	c.mu.Lock()
	c.proc, c.exited = cmd, exited
	_, werr := fmt.Fprintf(c.wdPipe, "%d\n", cmd.Process.Pid)
	c.mu.Unlock()
	if werr != nil {
		return fmt.Errorf("pgcluster: tell watchdog: %w", werr)
	}
	return c.waitReady(ctx, exited)
}

func (c *Cluster) waitReady(ctx context.Context, exited <-chan struct{}) error {
	deadline := time.Now().Add(c.cfg.StartTimeout)
	for {
		select {
		case <-exited:
			return fmt.Errorf("pgcluster: postgres exited during start-up:\n%s", c.LogTail())
		default:
		}
		attemptCtx, cancel := context.WithTimeout(ctx, time.Second)
		conn, err := pgconn.Connect(attemptCtx, c.URL("postgres"))
		cancel()
		if err == nil {
			return conn.Close(ctx)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pgcluster: postgres did not accept connections within %s: %w\n%s", c.cfg.StartTimeout, err, c.LogTail())
		}
		select {
		case <-exited:
		case <-ctx.Done():
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// LogTail returns the last lines of the server log, for error messages.
func (c *Cluster) LogTail() string {
	b, err := os.ReadFile(c.logPath())
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 20 {
		lines = lines[len(lines)-20:]
	}
	return strings.Join(lines, "\n")
}

// URL returns a connection URL for database db over TCP on 127.0.0.1.
func (c *Cluster) URL(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.port, db)
}

// SocketURL returns a connection URL for database db over the unix socket.
func (c *Cluster) SocketURL(db string) string {
	return fmt.Sprintf("postgres:///%s?host=%s&port=%d&user=postgres&sslmode=disable", db, c.dir, c.port)
}

// Port is the TCP port the server listens on.
func (c *Cluster) Port() int { return c.port }

// Dir is the cluster's temporary directory (data directory, socket, log).
func (c *Cluster) Dir() string { return c.dir }

// PID is the postmaster's process id, or 0 when the server is not running.
func (c *Cluster) PID() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.proc == nil || c.proc.Process == nil {
		return 0
	}
	select {
	case <-c.exited:
		return 0
	default:
		return c.proc.Process.Pid
	}
}

// Restart stops the server in the given mode and starts it again on the same
// port and data directory. After Immediate, start-up runs crash recovery.
func (c *Cluster) Restart(ctx context.Context, mode StopMode) error {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return ErrStopped
	}
	if err := c.shutdown(mode); err != nil {
		return err
	}
	return c.start(ctx)
}

// Halt stops the server in the given mode and leaves it stopped, with its
// data directory: after Immediate it is as if the server had crashed (no
// checkpoint, and no WAL sent to standbys that do not have it yet).
// Restart starts it again; Stop removes it.
func (c *Cluster) Halt(mode StopMode) error {
	c.mu.Lock()
	stopped := c.stopped
	c.mu.Unlock()
	if stopped {
		return ErrStopped
	}
	return c.shutdown(mode)
}

// shutdown stops the server process and waits for it to exit, escalating to
// SIGQUIT and SIGKILL if it does not exit in time.
func (c *Cluster) shutdown(mode StopMode) error {
	c.mu.Lock()
	proc, exited := c.proc, c.exited
	c.mu.Unlock()
	if proc == nil {
		return nil
	}
	sig := syscall.SIGINT
	if mode == Immediate {
		sig = syscall.SIGQUIT
	}
	_ = proc.Process.Signal(sig)
	select {
	case <-exited:
		return nil
	case <-time.After(30 * time.Second):
	}
	_ = proc.Process.Signal(syscall.SIGQUIT)
	select {
	case <-exited:
		return nil
	case <-time.After(5 * time.Second):
	}
	_ = syscall.Kill(-proc.Process.Pid, syscall.SIGKILL)
	<-exited
	return fmt.Errorf("pgcluster: postgres did not shut down and was killed")
}

// Stop shuts the server down (fast mode) and removes its directory. It is
// safe to call more than once.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	if c.stopped {
		c.mu.Unlock()
		return nil
	}
	c.stopped = true
	c.mu.Unlock()
	err := c.shutdown(Fast)
	if c.wdPipe != nil {
		// Nothing left for the watchdog to kill; closing the pipe makes it
		// remove the directory and exit.
		_, _ = io.WriteString(c.wdPipe, "0\n")
		_ = c.wdPipe.Close()
		_ = c.watchdog.Wait()
	}
	if rmErr := os.RemoveAll(c.dir); rmErr != nil && err == nil {
		err = fmt.Errorf("pgcluster: remove %s: %w", c.dir, rmErr)
	}
	c.logger.Info("throwaway postgres stopped", "port", c.port)
	return err
}
