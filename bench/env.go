package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/redis/go-redis/v9"
)

// env is what every scenario needs: the database, Redis, and the sizes.
type env struct {
	dsn       string
	redisAddr string // "" when Redis is unavailable
	redisSkip string // why Redis is unavailable
	redisStop func()

	window   time.Duration // length of one throughput run
	samples  int           // latency samples per run
	killRuns int           // SIGKILL samples per run
	rows     int           // claim rows
	backlog  int           // rows queued behind them in the deep claim scenarios (0: none)
	holds    []int         // lock counts for the connections/memory scenario
	self     string        // this binary, for child processes

	keepAlive []int         // lease counts of the keep-alive scenarios
	keepHold  time.Duration // how long they are held
	keepRaw   int           // largest count at which naive renewal is measured

	fleet          []int         // client counts of the fleet scenarios
	fleetWindow    time.Duration // length of one fleet run
	fleetPause     time.Duration // mean pause of a fleet client between iterations
	fleetPoll      time.Duration // PollInterval of NoListen fleets
	fleetOpen      int           // connections each fleet pool opens before the loop (0: on demand)
	maxConnections int           // the server's max_connections, 0 if unknown

	contendWindow time.Duration // length of one contended lease run

	logf func(format string, args ...any) // progress and warnings, not the report
}

// serverMaxConnections is the server's max_connections, or 0.
func (e *env) serverMaxConnections(ctx context.Context) int {
	c, err := e.conn(ctx, "bench-monitor")
	if err != nil {
		return 0
	}
	defer c.Close(ctx)
	var n int
	if c.QueryRow(ctx, "SELECT current_setting('max_connections')::int").Scan(&n) != nil {
		return 0
	}
	return n
}

// pgxConfig parses the DSN and tags the connections with an application
// name, so pg_stat_activity can count each implementation's connections.
func (e *env) pgxConfig(app string) (*pgx.ConnConfig, error) {
	cfg, err := pgx.ParseConfig(e.dsn)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["application_name"] = app
	return cfg, nil
}

func (e *env) conn(ctx context.Context, app string) (*pgx.Conn, error) {
	cfg, err := e.pgxConfig(app)
	if err != nil {
		return nil, err
	}
	return pgx.ConnectConfig(ctx, cfg)
}

func (e *env) pool(ctx context.Context, app string, maxConns int32) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(e.dsn)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = app
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// sqlDB is a database/sql handle over pgx's stdlib driver, as go-pglock
// takes it.
func (e *env) sqlDB(app string) (*sql.DB, error) {
	cfg, err := e.pgxConfig(app)
	if err != nil {
		return nil, err
	}
	return stdlib.OpenDB(*cfg), nil
}

// serverConns counts the server connections of one application name.
func (e *env) serverConns(ctx context.Context, app string) (float64, error) {
	c, err := e.conn(ctx, "bench-monitor")
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var n int
	err = c.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", app).Scan(&n)
	return float64(n), err
}

// sessionsOpened is the number of connections the database has accepted
// so far (pg_stat_database.sessions, PostgreSQL 14+), after letting every
// backend flush its statistics.
func (e *env) sessionsOpened(ctx context.Context) (int64, error) {
	c, err := e.conn(ctx, "bench-monitor")
	if err != nil {
		return 0, err
	}
	defer c.Close(ctx)
	var n int64
	err = c.QueryRow(ctx, "SELECT coalesce(sessions, 0) FROM pg_stat_database WHERE datname = current_database()").Scan(&n)
	return n, err
}

func (e *env) redisClient() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: e.redisAddr})
}

// startRedis uses a Redis already listening on 127.0.0.1:6379, else starts
// redis-server (no persistence) on a free port, else records why the
// Redis rows are skipped.
func (e *env) startRedis(ctx context.Context) {
	e.redisStop = func() {}
	if c, err := net.DialTimeout("tcp", "127.0.0.1:6379", 200*time.Millisecond); err == nil {
		c.Close()
		e.redisAddr = "127.0.0.1:6379"
		return
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		e.redisSkip = "no Redis on 127.0.0.1:6379 and no redis-server binary (apt-get install redis-server)"
		return
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		e.redisSkip = "no free port: " + err.Error()
		return
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	cmd := exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--daemonize", "no", "--logfile", "")
	cmd.Stdout, cmd.Stderr = nil, nil
	if err := cmd.Start(); err != nil {
		e.redisSkip = "redis-server did not start: " + err.Error()
		return
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	e.redisStop = func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := redis.NewClient(&redis.Options{Addr: addr})
		err := c.Ping(ctx).Err()
		c.Close()
		if err == nil {
			e.redisAddr = addr
			return
		}
		if time.Now().After(deadline) {
			e.redisStop()
			e.redisSkip = "redis-server did not answer: " + err.Error()
			return
		}
		time.Sleep(20 * time.Millisecond) // polling a starting server: nothing to wait on
	}
}

// machine describes the machine, the servers and the load for RESULTS.md.
func (e *env) machine(ctx context.Context) string {
	var b strings.Builder
	cpu := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				cpu = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	mem := ""
	if data, err := os.ReadFile("/proc/meminfo"); err == nil {
		line, _, _ := strings.Cut(string(data), "\n")
		mem = strings.Join(strings.Fields(line)[1:], " ")
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	fmt.Fprintf(&b, "- CPU: %s, %d logical CPUs (GOMAXPROCS %d); memory: %s; Linux %s; %s %s/%s\n",
		cpu, runtime.NumCPU(), runtime.GOMAXPROCS(0), mem, strings.TrimSpace(string(kernel)),
		runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if c, err := e.conn(ctx, "bench-monitor"); err == nil {
		var version, fsync, sc string
		_ = c.QueryRow(ctx, "SELECT version(), current_setting('fsync'), current_setting('synchronous_commit')").Scan(&version, &fsync, &sc)
		c.Close(ctx)
		fmt.Fprintf(&b, "- PostgreSQL: %s; throwaway cluster on loopback TCP, fsync=%s, synchronous_commit=%s\n", version, fsync, sc)
	}
	if e.redisAddr != "" {
		c := e.redisClient()
		info, _ := c.Info(ctx, "server").Result()
		c.Close()
		v := "?"
		for _, l := range strings.Split(info, "\n") {
			if s, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
				v = s
			}
		}
		fmt.Fprintf(&b, "- Redis: %s on %s (loopback TCP, no persistence)\n", v, e.redisAddr)
	} else {
		fmt.Fprintf(&b, "- Redis: none (%s)\n", e.redisSkip)
	}
	fmt.Fprintf(&b, "- Libraries: %s\n", libraries())
	fmt.Fprintf(&b, "- Load average at start: %s\n", loadavg())
	return b.String()
}

// libraries lists the versions of the compared libraries in this build.
func libraries() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	want := map[string]bool{"github.com/jackc/pgx/v5": true, "github.com/allisson/go-pglock/v3": true,
		"github.com/riverqueue/river": true, "github.com/vgarvardt/gue/v5": true, "github.com/bsm/redislock": true,
		"github.com/redis/go-redis/v9": true}
	var out []string
	for _, d := range bi.Deps {
		if want[d.Path] {
			out = append(out, d.Path+" "+d.Version)
		}
	}
	return strings.Join(out, ", ")
}

// load1 is the one-minute load average (0 when unknown).
func load1() float64 {
	var l float64
	fmt.Sscan(loadavg(), &l)
	return l
}

func loadavg() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}

// child is a holder process: this binary run with -child. It prints
// "held" once it holds the lock and then waits to be killed.
type child struct {
	cmd *exec.Cmd
}

func (e *env) startChild(ctx context.Context, mode, key string) (*child, error) {
	cmd := exec.Command(e.self)
	// The mode travels in the environment, so a test binary works as well.
	cmd.Env = append(os.Environ(), "PGBATON_DSN="+e.dsn, "BENCH_REDIS="+e.redisAddr,
		"BENCH_CHILD="+mode, "BENCH_CHILD_KEY="+key)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	line := make(chan string, 1)
	go func() {
		s := bufio.NewScanner(out)
		if s.Scan() {
			line <- s.Text()
		}
		close(line)
	}()
	ch := &child{cmd: cmd}
	select {
	case l := <-line:
		if l == "held" {
			return ch, nil
		}
		ch.kill()
		return nil, fmt.Errorf("child %s: said %q", mode, l)
	case <-time.After(30 * time.Second):
		ch.kill()
		return nil, errors.New("child " + mode + ": no answer in 30s")
	case <-ctx.Done():
		ch.kill()
		return nil, ctx.Err()
	}
}

func (c *child) kill() {
	_ = c.cmd.Process.Kill()
	_ = c.cmd.Wait()
}
