// Package pgtest is the test harness every pgbaton test package shares: one
// throwaway cluster per test binary, a fresh database per test cloned from a
// migrated template, pools that close themselves, backend termination,
// cluster restarts, child processes of the test binary, and leak checks.
//
// Use it from TestMain:
//
//	var env *pgtest.Env
//
//	func TestMain(m *testing.M) {
//		env = pgtest.Setup(pgtest.Options{Children: children})
//		os.Exit(env.Run(m))
//	}
//
// With PGBATON_TEST_DSN set, that server is used instead of a throwaway
// cluster: the package gets its own template database there, dropped with
// every test database at the end.
package pgtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.uber.org/goleak"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/migrations"
)

// EnvDSN names the variable that points tests at an existing server.
const EnvDSN = "PGBATON_TEST_DSN"

const (
	envChild     = "PGBATON_TEST_CHILD"
	envChildArgs = "PGBATON_TEST_CHILD_ARGS"
)

// ChildFunc is the body of a child process started with Env.StartChild. It
// runs instead of the tests; a nil error exits 0, an error exits 1.
type ChildFunc func(ctx context.Context, args []string) error

// Options configures Setup.
type Options struct {
	// Durable keeps fsync on in the throwaway cluster (crash and restart
	// tests, benchmarks). Default off, for speed.
	Durable bool
	// Settings are extra server settings for the throwaway cluster.
	Settings map[string]string
	// Children are the bodies child processes can run, by name.
	Children map[string]ChildFunc
	// NoLeakCheck turns off the goroutine leak check after the tests.
	NoLeakCheck bool
	// NoServer starts no throwaway cluster and connects to no server, for
	// suites that bring their own servers (the HA suite): DB, EmptyDB,
	// AdminPool and the other methods that need the server must not be
	// called. Children and the leak check work as usual.
	NoServer bool
}

// Env is a test binary's database environment.
type Env struct {
	opts     Options
	cluster  *pgcluster.Cluster // nil with PGBATON_TEST_DSN
	adminURL string
	admin    *pgxpool.Pool
	template string
	prefix   string
	seq      atomic.Int64
}

// Setup prepares the environment, or, in a child process started by
// StartChild, runs the child's body and exits. On failure it prints the
// error and exits 1.
func Setup(opts Options) *Env {
	if name := os.Getenv(envChild); name != "" {
		os.Exit(runChild(name, opts.Children))
	}
	env, err := setup(opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		os.Exit(1)
	}
	return env
}

func setup(opts Options) (_ *Env, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := &Env{opts: opts}
	if opts.NoServer {
		return e, nil
	}
	defer func() {
		if err != nil {
			e.stop()
		}
	}()
	if dsn := os.Getenv(EnvDSN); dsn != "" {
		e.adminURL = dsn
		e.prefix = fmt.Sprintf("pgbaton_t%d_%d_", os.Getpid(), time.Now().UnixNano()%1e6)
	} else {
		e.cluster, err = pgcluster.Start(ctx, pgcluster.Config{NoFsync: !opts.Durable, Settings: opts.Settings})
		if err != nil {
			return nil, err
		}
		e.adminURL = e.cluster.URL("postgres")
		e.prefix = "pgbaton_t"
	}
	if e.admin, err = pgxpool.New(ctx, e.adminURL); err != nil {
		return nil, fmt.Errorf("pgtest: connect %s: %w", redact(e.adminURL), err)
	}
	e.template = e.prefix + "template"
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{e.template}.Sanitize()); err != nil {
		return nil, fmt.Errorf("pgtest: create template database: %w", err)
	}
	if err := migrations.UpURL(ctx, e.urlFor(e.template)); err != nil {
		return nil, fmt.Errorf("pgtest: migrate template database: %w", err)
	}
	return e, nil
}

// Run runs the tests, checks for leaked goroutines, removes the environment
// and returns the exit code for os.Exit.
func (e *Env) Run(m *testing.M) int {
	// A Ctrl-C or SIGTERM still removes test databases from an external
	// server; a throwaway cluster is removed by its watchdog anyway.
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		if _, ok := <-sigs; ok {
			e.stop()
			os.Exit(130)
		}
	}()
	code := m.Run()
	signal.Stop(sigs)
	close(sigs)
	if err := e.stop(); err != nil {
		fmt.Fprintln(os.Stderr, "pgtest:", err)
		if code == 0 {
			code = 1
		}
	}
	if code == 0 && !e.opts.NoLeakCheck {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "pgtest: goroutines leaked by the tests:", err)
			code = 1
		}
	}
	return code
}

func (e *Env) stop() error {
	var errs []error
	if e.admin != nil {
		if e.cluster == nil {
			// External server: drop everything this package created.
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			rows, err := e.admin.Query(ctx, "SELECT datname FROM pg_database WHERE starts_with(datname, $1)", e.prefix)
			if err == nil {
				names, _ := pgx.CollectRows(rows, pgx.RowTo[string])
				for _, n := range names {
					if _, err := e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{n}.Sanitize()+" WITH (FORCE)"); err != nil {
						errs = append(errs, err)
					}
				}
			} else {
				errs = append(errs, err)
			}
			cancel()
		}
		e.admin.Close()
		e.admin = nil
	}
	if e.cluster != nil {
		errs = append(errs, e.cluster.Stop())
	}
	return errors.Join(errs...)
}

// Cluster is the throwaway cluster, or nil when PGBATON_TEST_DSN is set.
func (e *Env) Cluster() *pgcluster.Cluster { return e.cluster }

// AdminPool is a superuser pool on the server's maintenance database.
func (e *Env) AdminPool() *pgxpool.Pool { return e.admin }

// AdminURL is a superuser connection URL to the server's maintenance
// database.
func (e *Env) AdminURL() string { return e.adminURL }

func (e *Env) urlFor(dbName string) string {
	cfg, err := pgx.ParseConfig(e.adminURL)
	if err != nil {
		panic(err) // adminURL was connected to already
	}
	cfg.Database = dbName
	// Rebuild from the parsed parts: the admin URL may be a key=value DSN.
	host := cfg.Host
	if strings.HasPrefix(host, "/") {
		return fmt.Sprintf("postgres:///%s?host=%s&port=%d&user=%s&sslmode=disable", dbName, host, cfg.Port, cfg.User)
	}
	u := fmt.Sprintf("postgres://%s@%s:%d/%s?sslmode=disable", cfg.User, host, cfg.Port, dbName)
	if cfg.Password != "" {
		u = fmt.Sprintf("postgres://%s:%s@%s:%d/%s?sslmode=disable", cfg.User, cfg.Password, host, cfg.Port, dbName)
	}
	return u
}

func redact(url string) string {
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		return "(unparsable connection string)"
	}
	return fmt.Sprintf("%s@%s:%d/%s", cfg.User, cfg.Host, cfg.Port, cfg.Database)
}

// DB is a test's own database.
type DB struct {
	Name string
	URL  string
}

// DB creates a fresh, migrated database for t, dropped when t ends.
func (e *Env) DB(t testing.TB) *DB { return e.newDB(t, e.template) }

// EmptyDB creates a fresh database without the pgbaton schema, dropped when
// t ends.
func (e *Env) EmptyDB(t testing.TB) *DB { return e.newDB(t, "template0") }

func (e *Env) newDB(t testing.TB, template string) *DB {
	t.Helper()
	name := fmt.Sprintf("%s%d", e.prefix, e.seq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sql := "CREATE DATABASE " + pgx.Identifier{name}.Sanitize() + " TEMPLATE " + pgx.Identifier{template}.Sanitize()
	if _, err := e.admin.Exec(ctx, sql); err != nil {
		t.Fatalf("pgtest: %s: %v", sql, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, err := e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)"); err != nil {
			t.Errorf("pgtest: drop database %s: %v", name, err)
		}
	})
	return &DB{Name: name, URL: e.urlFor(name)}
}

// ExamplePool opens a pool on a fresh migrated database for an Example
// function, which has no testing.T; call done when the example ends. It
// panics on failure, as examples have no other way to fail.
func (e *Env) ExamplePool() (pool *pgxpool.Pool, done func()) {
	url, drop := e.exampleDB(e.template)
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		drop()
		panic(err)
	}
	return pool, func() {
		pool.Close()
		drop()
	}
}

// ExampleEmptyDB creates a fresh database without the pgbaton schema for
// an Example function and returns its URL; call done when the example
// ends. It panics on failure.
func (e *Env) ExampleEmptyDB() (url string, done func()) {
	return e.exampleDB("template0")
}

func (e *Env) exampleDB(template string) (url string, drop func()) {
	ctx := context.Background()
	name := fmt.Sprintf("%s%d", e.prefix, e.seq.Add(1))
	if _, err := e.admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()+" TEMPLATE "+pgx.Identifier{template}.Sanitize()); err != nil {
		panic(err)
	}
	return e.urlFor(name), func() {
		_, _ = e.admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	}
}

// Pool opens a pool on url, closed when t ends. configure, if given, may
// change the pool's configuration first.
func Pool(t testing.TB, url string, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: parse %s: %v", redact(url), err)
	}
	for _, f := range configure {
		f(cfg)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatalf("pgtest: pool: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// Pool opens a pool on the test's database, closed when t ends.
func (d *DB) Pool(t testing.TB, configure ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	return Pool(t, d.URL, configure...)
}

// Terminate kills backend pid with pg_terminate_backend and waits until it
// has gone from pg_stat_activity.
func (e *Env) Terminate(t testing.TB, pid uint32) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var ok bool
	if err := e.admin.QueryRow(ctx, "SELECT pg_terminate_backend($1)", int32(pid)).Scan(&ok); err != nil {
		t.Fatalf("pgtest: pg_terminate_backend(%d): %v", pid, err)
	}
	if !ok {
		t.Fatalf("pgtest: pg_terminate_backend(%d): no such backend", pid)
	}
	Eventually(t, 30*time.Second, func() (bool, error) {
		var n int
		err := e.admin.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", int32(pid)).Scan(&n)
		return n == 0, err
	}, "backend %d still present after pg_terminate_backend", pid)
}

// Restart restarts the throwaway cluster in the given mode. It fails the
// test when PGBATON_TEST_DSN points at a server pgtest does not own.
func (e *Env) Restart(t testing.TB, mode pgcluster.StopMode) {
	t.Helper()
	if e.cluster == nil {
		t.Fatalf("pgtest: restarting needs the throwaway cluster; unset %s", EnvDSN)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := e.cluster.Restart(ctx, mode); err != nil {
		t.Fatalf("pgtest: restart cluster: %v", err)
	}
	e.admin.Reset()
}

// NewCluster starts a dedicated throwaway cluster for one test (for server
// settings the shared one must not have), stopped when t ends.
func NewCluster(t testing.TB, cfg pgcluster.Config) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := pgcluster.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: start cluster: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("pgtest: stop cluster: %v", err)
		}
	})
	return c
}

// NewStandby starts a streaming standby of primary for one test, stopped
// when t ends. cfg, if given, configures it (default: NoFsync); e.g.
// Settings["primary_conninfo"] can make it stream through a fault proxy.
func NewStandby(t testing.TB, primary *pgcluster.Cluster, cfg ...pgcluster.Config) *pgcluster.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conf := pgcluster.Config{NoFsync: true}
	if len(cfg) > 0 {
		conf = cfg[0]
	}
	c, err := pgcluster.StartStandby(ctx, primary, conf)
	if err != nil {
		t.Fatalf("pgtest: start standby: %v", err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("pgtest: stop standby: %v", err)
		}
	})
	return c
}

// Eventually polls cond until it returns true or timeout passes, then fails
// the test with the message. An error from cond fails the test at once.
func Eventually(t testing.TB, timeout time.Duration, cond func() (bool, error), format string, args ...any) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for wait := time.Millisecond; ; wait = min(2*wait, 50*time.Millisecond) {
		ok, err := cond()
		if err != nil {
			t.Fatalf("pgtest: %v (while waiting: "+format+")", append([]any{err}, args...)...)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("pgtest: after %s: "+format, append([]any{timeout}, args...)...)
		}
		time.Sleep(wait)
	}
}

// NoConnections waits until no session other than the caller's is
// connected to the test's database, and fails the test otherwise: the check
// that nothing leaked connections.
func (e *Env) NoConnections(t testing.TB, d *DB) {
	t.Helper()
	ctx := context.Background()
	var left []string
	Eventually(t, 10*time.Second, func() (bool, error) {
		rows, err := e.admin.Query(ctx,
			`SELECT format('pid %s app %L state %s query %L', pid, application_name, state, left(query, 80))
			   FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, d.Name)
		if err != nil {
			return false, err
		}
		left, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return len(left) == 0, err
	}, "connections left open on %s: %v", d.Name, &left)
}

func runChild(name string, children map[string]ChildFunc) int {
	fn, ok := children[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "pgtest: no child named %q\n", name)
		return 2
	}
	var args []string
	if err := json.Unmarshal([]byte(os.Getenv(envChildArgs)), &args); err != nil {
		fmt.Fprintf(os.Stderr, "pgtest: child args: %v\n", err)
		return 2
	}
	// No signal handlers: a signal kills the child the way it would kill any
	// process, which is what fault tests want.
	if err := fn(context.Background(), args); err != nil {
		fmt.Fprintf(os.Stderr, "child %s: %v\n", name, err)
		return 1
	}
	return 0
}
