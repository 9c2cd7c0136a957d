package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/examples/demo/internal/demodb"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

//go:embed demo_schema.sql
var demoSchema string

// errInvariant marks a demo whose invariants failed.
var errInvariant = errors.New("demo invariants violated")

type demoOpts struct {
	dsn     string
	workers int
	items   int
	keep    bool
	timeout time.Duration
}

// runDemo parses the orchestrator's flags, finds or starts a server,
// migrates it and runs the scenario.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o demoOpts
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.dsn, "dsn", "", "connection string (default: $DATABASE_URL, else the PG* variables if PGHOST is set, else a throwaway cluster)")
	fs.IntVar(&o.workers, "workers", 4, "worker processes")
	fs.IntVar(&o.items, "items", 120, "work items")
	fs.BoolVar(&o.keep, "keep", false, "keep the demo's tables and rows afterwards")
	fs.DurationVar(&o.timeout, "timeout", 60*time.Second, "give up after this long")
	if err := parse(fs, args); err != nil {
		return err
	}
	if o.workers < 3 || o.items < 10 || o.timeout <= 0 {
		return usageError{fmt.Errorf("demo needs -workers >= 3, -items >= 10 and a positive -timeout")}
	}
	if connString(o.dsn) == "" && os.Getenv("PGHOST") == "" {
		start := time.Now()
		cluster, err := pgcluster.Start(ctx, pgcluster.Config{})
		if err != nil {
			return err
		}
		defer cluster.Stop()
		fmt.Fprintf(stdout, "throwaway PostgreSQL on 127.0.0.1:%d up in %s\n", cluster.Port(), time.Since(start).Round(time.Millisecond))
		o.dsn = cluster.URL("postgres")
	}
	pool, err := connect(ctx, o.dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrations.Up(ctx, pool); err != nil {
		return err
	}
	server, err := demodb.New().DemoServer(ctx, pool)
	if err != nil {
		return err
	}
	version, _, err := migrations.Version(ctx, pool)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "PostgreSQL %s, database %s, pgbaton schema version %d\n\n", server.ServerVersion, server.Database, version)
	return demo(ctx, pool, o, stdout, stderr)
}

// demoRun is the orchestrator's state.
type demoRun struct {
	o       demoOpts
	stdout  io.Writer
	pool    *pgxpool.Pool
	q       *demodb.Queries
	start   time.Time
	workers map[int]*exec.Cmd
	owners  map[int]string
	events  chan demoEvent
	exited  chan int
	stopped chan struct{} // closed when the workers are being stopped
	wg      sync.WaitGroup
	stderr  lockedWriter // the workers' stderr, one writer at a time
}

// lockedWriter serialises writes of several goroutines to one writer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// send delivers an event unless the demo is stopping.
func (r *demoRun) send(ev demoEvent) {
	select {
	case r.events <- ev:
	case <-r.stopped:
	}
}

func (r *demoRun) logf(format string, args ...any) {
	fmt.Fprintf(r.stdout, "[%5.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

func demo(ctx context.Context, pool *pgxpool.Pool, o demoOpts, stdout, stderr io.Writer) (err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	r := &demoRun{o: o, stdout: stdout, pool: pool, q: demodb.New(), start: time.Now(), workers: map[int]*exec.Cmd{}, owners: map[int]string{},
		events: make(chan demoEvent, 1024), exited: make(chan int, o.workers), stopped: make(chan struct{}),
		stderr: lockedWriter{w: stderr}}
	if err := r.setup(ctx, o); err != nil {
		return err
	}
	defer func() {
		r.stopWorkers()
		if !o.keep {
			clean := context.WithoutCancel(ctx)
			err = errors.Join(err, r.q.DemoDropSchema(clean, pool), r.q.DemoCleanLeases(clean, pool), r.q.DemoCleanSlots(clean, pool))
		}
	}()
	victim := o.workers // the last worker is the one that gets paused
	for id := 1; id <= o.workers; id++ {
		if err := r.startWorker(id, id == victim, time.Duration(id-2)*150*time.Millisecond); err != nil {
			return err
		}
	}
	r.logf("started %d worker processes; %d items in group %s, lease TTL %s", o.workers, o.items, demoItems, demoTTL)
	sc, err := r.scenario(ctx, victim, o.items)
	if err != nil {
		return err
	}
	r.stopWorkers()
	return r.summary(ctx, sc, o.items)
}

func (r *demoRun) setup(ctx context.Context, o demoOpts) error {
	if err := r.q.DemoDropSchema(ctx, r.pool); err != nil {
		return err
	}
	if err := r.q.DemoCleanLeases(ctx, r.pool); err != nil {
		return err
	}
	if err := r.q.DemoCleanSlots(ctx, r.pool); err != nil {
		return err
	}
	if _, err := r.pool.Exec(ctx, demoSchema); err != nil {
		return fmt.Errorf("create demo tables: %w", err)
	}
	client, err := leasetable.New(ctx, r.pool, leasetable.Config{Owner: "demo-orchestrator"})
	if err != nil {
		return err
	}
	defer client.Close(ctx)
	names := make([]string, o.items)
	for i := range names {
		names[i] = fmt.Sprintf("demo:item:%04d", i)
	}
	_, err = client.Register(ctx, demoItems, names...)
	return err
}

func (r *demoRun) startWorker(id int, victim bool, skew time.Duration) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	args := []string{workerArg, "-id", strconv.Itoa(id), "-skew", skew.String()}
	if r.o.dsn != "" {
		args = append(args, "-dsn", r.o.dsn)
	}
	if victim {
		args = append(args, "-victim")
	}
	cmd := exec.Command(exe, args...)
	cmd.Stderr = &r.stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start worker %d: %w", id, err)
	}
	r.workers[id] = cmd
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var ev demoEvent
			if json.Unmarshal(sc.Bytes(), &ev) == nil {
				r.send(ev)
			}
		}
		_ = cmd.Wait()
		r.exited <- id
	}()
	return nil
}

// stopWorkers ends every worker still running: SIGCONT (a paused one cannot
// act on anything else), SIGTERM, and SIGKILL if it does not exit in time.
func (r *demoRun) stopWorkers() {
	select {
	case <-r.stopped:
		return
	default:
		close(r.stopped)
	}
	for _, cmd := range r.workers {
		// os.Process refuses to signal a process it has already reaped.
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	done := make(chan struct{})
	go func() { r.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		for _, cmd := range r.workers {
			_ = cmd.Process.Kill()
		}
		<-done
	}
}
