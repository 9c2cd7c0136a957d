package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/pgbaton/pgbaton/leasetable"
)

const (
	contendProcs = 8
	contendHold  = 2 * time.Millisecond
)

const contendTitle = "Lease: contended, 8 processes on one name (2 ms hold)"

// contendRuns numbers the runs: every run contends on a fresh name, so
// its tokens start with its first grant.
var contendRuns atomic.Int64

// monoNow is CLOCK_MONOTONIC in nanoseconds, as test/check.MonoNow: one
// clock for every process of the host, so the children's wait and grant
// instants compare without skew (time.Now's monotonic reading is per
// process).
func monoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // cannot fail on Linux
	}
	return ts.Nano()
}

// contendScenario: contendProcs child processes loop Acquire → hold
// contendHold → Release on one lease name for e.contendWindow; the same
// loop with a blocking pg_advisory_lock shows what the server's FIFO lock
// queue gives.
func (e *env) contendScenario() *scenario {
	sc := &scenario{
		title: contendTitle,
		note: fmt.Sprintf("%d child processes, each with its own pgxpool and leasetable.Client (default config: LISTEN), "+
			"loop Acquire → hold %s → Release on one lease name for %s; raw pgx: the same processes, each on one "+
			"connection, loop a blocking pg_advisory_lock → hold → pg_advisory_unlock on one key (PostgreSQL queues "+
			"lock waiters first come, first served: what fair looks like). Fairness: the most grants of a process ÷ "+
			"the fewest (1 is fair). Longest waiter granted: of the grants made while two or more processes waited, "+
			"the share that went to the process whose wait began first; each child records CLOCK_MONOTONIC (one clock "+
			"for the host) at the start and return of every call, and the grants are ordered by fencing token (by "+
			"instant for advisory locks). Chance is about 1 in 7.",
			contendProcs, contendHold, e.contendWindow),
		metrics: []metric{{name: "acquisitions/s", higherBetter: true}, {name: "fairness max/min", format: "%.2f"},
			{name: "longest waiter granted %", format: "%.1f"}},
		runs:     3,
		noWarmup: true, // every run starts its own processes
	}
	for _, m := range []struct{ name, mode string }{
		{"pgbaton leasetable.Client", "contend-lease"},
		{"raw pgx, blocking pg_advisory_lock (FIFO)", "contend-adv"},
	} {
		sc.impls = append(sc.impls, &impl{name: m.name, run: func(ctx context.Context) (sample, error) {
			return e.contendRun(ctx, m.mode)
		}})
	}
	return sc
}

// grant is one Acquire of a child: when its wait began, when it returned
// holding the lock (CLOCK_MONOTONIC ns), and the lease's token (0 for
// advisory locks).
type grant struct {
	proc             int
	start, at, token int64
}

func (e *env) contendRun(ctx context.Context, mode string) (sample, error) {
	name := fmt.Sprintf("bench:contend:%d", contendRuns.Add(1))
	cmds := make([]*exec.Cmd, contendProcs)
	ins := make([]io.WriteCloser, contendProcs)
	outs := make([]*bufio.Scanner, contendProcs)
	defer func() {
		for _, c := range cmds {
			if c != nil && c.ProcessState == nil {
				_ = c.Process.Kill()
				_ = c.Wait()
			}
		}
	}()
	// Start them all and wait until each is connected (not timed).
	ready := make(chan error, contendProcs)
	for i := range cmds {
		cmd := exec.Command(e.self)
		cmd.Env = append(os.Environ(), "PGBATON_DSN="+e.dsn, "BENCH_CHILD="+mode, "BENCH_CHILD_KEY="+name)
		cmd.Stderr = os.Stderr
		in, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		cmds[i], ins[i], outs[i] = cmd, in, bufio.NewScanner(out)
		go func() {
			if s := outs[i]; !s.Scan() || s.Text() != "ready" {
				ready <- fmt.Errorf("child %s %d did not start: %q %v", mode, i, s.Text(), s.Err())
				return
			}
			ready <- nil
		}()
	}
	for range cmds {
		select {
		case err := <-ready:
			if err != nil {
				return nil, err
			}
		case <-time.After(30 * time.Second):
			return nil, errors.New("children did not start in 30s")
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	// All go at once; each stops after its first grant at or past end.
	begin := monoNow()
	end := begin + int64(e.contendWindow)
	for _, in := range ins {
		if _, err := fmt.Fprintln(in, end); err != nil {
			return nil, err
		}
	}
	per := make([][]grant, contendProcs)
	err := parallel(contendProcs, func(i int) error {
		for outs[i].Scan() {
			g := grant{proc: i}
			if _, err := fmt.Sscan(outs[i].Text(), &g.start, &g.at, &g.token); err != nil {
				return fmt.Errorf("child %d: %q: %w", i, outs[i].Text(), err)
			}
			per[i] = append(per[i], g)
		}
		if err := cmds[i].Wait(); err != nil {
			return fmt.Errorf("child %s %d: %w", mode, i, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return contendFigures(slices.Concat(per...), begin, end, mode == "contend-lease")
}

// contendFigures computes the scenario's figures from every child's
// grants: those from begin to end count, but waits that outlast end still
// count as waiting.
func contendFigures(gs []grant, begin, end int64, byToken bool) (sample, error) {
	slices.SortFunc(gs, func(a, b grant) int {
		if byToken {
			return cmp.Compare(a.token, b.token)
		}
		return cmp.Compare(a.at, b.at)
	})
	counts := make([]int, contendProcs)
	var contested, longest int
	for k, g := range gs {
		if byToken && k > 0 && gs[k-1].token == g.token {
			return nil, fmt.Errorf("token %d granted twice", g.token)
		}
		if g.at < begin || g.at >= end {
			continue
		}
		counts[g.proc]++
		// Waiting at g's grant: began before it and granted at it or later
		// (g itself included). Each process has one call at a time.
		waiters, first := 0, g
		for _, o := range gs {
			if o.start < g.at && o.at >= g.at {
				waiters++
				if o.start < first.start {
					first = o
				}
			}
		}
		if waiters >= 2 {
			contested++
			if first.proc == g.proc {
				longest++
			}
		}
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	if total == 0 {
		return nil, errors.New("no grant in the window")
	}
	lo, hi := slices.Min(counts), slices.Max(counts)
	s := sample{"acquisitions/s": float64(total) / time.Duration(end-begin).Seconds(),
		"fairness max/min": float64(hi) / float64(max(lo, 1))}
	if contested > 0 {
		s["longest waiter granted %"] = 100 * float64(longest) / float64(contested)
	}
	return s, nil
}

// runContender is a child of the contended scenario: it connects, says
// "ready", reads the end instant (CLOCK_MONOTONIC ns) from stdin, loops
// acquire → hold → release until a grant at or past it, and then prints a
// line "start grant token" per acquire.
func runContender(ctx context.Context, e *env, mode, name string) error {
	var acquire func() (token int64, release func() error, err error)
	switch mode {
	case "contend-lease":
		pool, err := e.pool(ctx, "bench-contend-lease", 0)
		if err != nil {
			return err
		}
		defer pool.Close()
		c, err := leasetable.New(ctx, pool, leasetable.Config{})
		if err != nil {
			return err
		}
		defer c.Close(ctx)
		acquire = func() (int64, func() error, error) {
			l, err := c.Acquire(ctx, name)
			if err != nil {
				return 0, nil, err
			}
			return l.Token(), func() error { return l.Release(ctx) }, nil
		}
	case "contend-adv":
		conn, err := e.conn(ctx, "bench-contend-adv")
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		k := keyOf(name)
		acquire = func() (int64, func() error, error) {
			if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", k); err != nil {
				return 0, nil, err
			}
			return 0, func() error {
				_, err := conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", k)
				return err
			}, nil
		}
	default:
		return fmt.Errorf("unknown child mode %q", mode)
	}
	fmt.Println("ready")
	var end int64
	if _, err := fmt.Fscanln(os.Stdin, &end); err != nil {
		return err
	}
	var out strings.Builder
	for {
		start := monoNow()
		token, release, err := acquire()
		if err != nil {
			return err
		}
		at := monoNow()
		fmt.Fprintf(&out, "%d %d %d\n", start, at, token)
		time.Sleep(contendHold)
		if err := release(); err != nil {
			return err
		}
		// Nobody is cancelled at the end (a cancelled raw pgx query
		// closes its connection): every waiter is served once more.
		if at >= end {
			break
		}
	}
	_, err := io.WriteString(os.Stdout, out.String())
	return err
}
