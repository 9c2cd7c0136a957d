// Command bench compares pgbaton side by side with raw pgx doing the same
// SQL and with the libraries users would pick instead (go-pglock, River,
// gue, redislock), in one process and one run, interleaved, and prints a
// markdown report. Run it with `make bench` from the repository root,
// which starts a durable throwaway PostgreSQL; it reads the database URL
// from PGBATON_DSN.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"time"
)

func main() {
	if mode := os.Getenv("BENCH_CHILD"); mode != "" {
		if err := runChild(mode, os.Getenv("BENCH_CHILD_KEY")); err != nil {
			fmt.Fprintln(os.Stderr, "bench child:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

type options struct {
	runs      int
	window    time.Duration
	samples   int
	killRuns  int
	rows      int
	backlog   int
	holds     string
	keep      string
	keepHold  time.Duration
	keepRaw   int
	fleet     string
	fleetWin  time.Duration
	pause     time.Duration
	poll      time.Duration
	fleetOpen int
	contend   time.Duration
	only      string
	impls     string
	out       string
	cpuprof   string
	charts    string
}

func run(args []string, stdout io.Writer) error {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.IntVar(&o.runs, "runs", 5, "interleaved runs per scenario (the median is reported)")
	fs.DurationVar(&o.window, "window", time.Second, "length of one throughput run")
	fs.IntVar(&o.samples, "samples", 100, "handover latency samples per run")
	// 40, not 20: raw pgx's p50 of 20 samples ranged over 0.603-1.094 ms
	// across the 5 runs of one scenario on a quiet machine.
	fs.IntVar(&o.killRuns, "kills", 40, "SIGKILL handover samples per run")
	fs.IntVar(&o.rows, "rows", 10000, "work items per claim run")
	fs.IntVar(&o.backlog, "backlog", 990000, "work items queued behind them in the deep claim scenarios (0: skip those)")
	fs.StringVar(&o.holds, "holds", "1,100,1000", "lock counts for the connections and memory scenarios")
	fs.StringVar(&o.keep, "keepalive", "1000,10000,100000", "lease counts for the keep-alive scenarios (one client holds them)")
	fs.DurationVar(&o.keepHold, "keephold", 60*time.Second, "how long the keep-alive scenarios hold the leases (TTL 3s)")
	fs.IntVar(&o.keepRaw, "keepraw", 1000, "largest lease count at which naive per-lease renewal is measured too (above: computed)")
	fs.StringVar(&o.fleet, "fleet", "100,200,500", "client counts for the fleet scenarios")
	fs.DurationVar(&o.fleetWin, "fleetwindow", 10*time.Second, "length of one fleet run")
	fs.DurationVar(&o.pause, "fleetpause", time.Second, "mean pause of a fleet client between iterations (uniform 0 to twice this)")
	fs.DurationVar(&o.poll, "fleetpoll", 100*time.Millisecond, "PollInterval of the fleet's NoListen clients")
	fs.IntVar(&o.fleetOpen, "fleetopen", 0, "connections each fleet client's pool opens before its loop starts (not timed; 0: as it needs them, up to its MaxConns)")
	fs.DurationVar(&o.contend, "contendwindow", 10*time.Second, "length of one contended lease run (8 processes on one name)")
	fs.StringVar(&o.only, "only", "", "run only scenarios whose title matches this regexp")
	fs.StringVar(&o.impls, "impls", "", "measure only implementations whose name matches this regexp (for profiling)")
	fs.StringVar(&o.out, "out", "", "also write the report to this file")
	fs.StringVar(&o.cpuprof, "cpuprofile", "", "write a CPU profile of the whole run to this file")
	fs.StringVar(&o.charts, "charts", "", "also draw SVG charts into this directory, linked from the report (relative to -out)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	dsn := os.Getenv("PGBATON_DSN")
	if dsn == "" {
		return fmt.Errorf("PGBATON_DSN is not set: run `make bench` from the repository root (it starts a throwaway PostgreSQL)")
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	report, err := benchmark(ctx, dsn, o, os.Stderr)
	if err != nil {
		return err
	}
	fmt.Fprint(stdout, report)
	if o.out != "" {
		return os.WriteFile(o.out, []byte(report), 0o644)
	}
	return nil
}

// benchmark runs the scenarios and returns the markdown report.
func benchmark(ctx context.Context, dsn string, o options, log io.Writer) (string, error) {
	self, err := os.Executable()
	if err != nil {
		return "", err
	}
	logf := func(format string, args ...any) { fmt.Fprintf(log, format+"\n", args...) }
	e := &env{dsn: dsn, window: o.window, samples: o.samples, killRuns: o.killRuns, rows: o.rows, backlog: o.backlog, self: self,
		keepHold: o.keepHold, keepRaw: o.keepRaw, fleetWindow: o.fleetWin, fleetPause: o.pause, fleetPoll: o.poll, fleetOpen: o.fleetOpen, contendWindow: o.contend, logf: logf}
	if e.holds, err = counts("holds", o.holds); err != nil {
		return "", err
	}
	if e.keepAlive, err = counts("keepalive", o.keep); err != nil {
		return "", err
	}
	if e.fleet, err = counts("fleet", o.fleet); err != nil {
		return "", err
	}
	if o.fleetOpen < 0 || o.fleetOpen > fleetMaxConns {
		return "", fmt.Errorf("-fleetopen must be 0 to %d (the fleet's pool_max_conns)", fleetMaxConns)
	}
	if o.keepHold <= 0 || o.fleetWin <= 0 || o.pause < 0 || o.poll <= 0 || o.contend <= 0 {
		return "", fmt.Errorf("-keephold, -fleetwindow, -fleetpoll and -contendwindow must be positive, -fleetpause not negative")
	}
	e.maxConnections = e.serverMaxConnections(ctx)
	only, err := regexp.Compile(o.only)
	if err != nil {
		return "", err
	}
	impls, err := regexp.Compile(o.impls)
	if err != nil {
		return "", err
	}
	e.startRedis(ctx)
	defer e.redisStop()

	if o.cpuprof != "" {
		f, err := os.Create(o.cpuprof)
		if err != nil {
			return "", err
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return "", err
		}
		defer pprof.StopCPUProfile()
	}

	var b strings.Builder
	fmt.Fprintf(&b, "# pgbaton side-by-side benchmarks\n\n")
	fmt.Fprintf(&b, "Generated by `make bench` (bench/, a module of its own) on %s.\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"))
	b.WriteString(e.machine(ctx))
	fmt.Fprintf(&b, "- Settings: %d interleaved runs per scenario after a warm-up, %s per throughput run, %d handover samples per run (%d after a SIGKILL), %d claim rows, %d rows of claim backlog; "+
		"keep-alive: %s leases held %s each; fleets of %s clients, %s per run; contended lease: %s per run\n\n",
		o.runs, o.window, o.samples, o.killRuns, o.rows, o.backlog, o.keep, o.keepHold, o.fleet, o.fleetWin, o.contend)
	b.WriteString("Every figure is measured in this one process and run, each implementation in turn, in an order that has each follow each other one equally often (a balanced Latin square: what one leaves on the server, the next inherits). " +
		"Ratios are what to read: absolute numbers depend on the machine. The deep claim scenarios time 10k items " +
		"of a 1M-row queue rather than draining 1M rows: at 1–3k items/s (batch 1, gue) 5 runs × 4 implementations " +
		"would take hours, and what a deep queue changes is the cost of each claim, which the slice shows.\n\n")
	// Busy: other work used more than half of the CPUs on average over
	// the last minute.
	if l := load1(); l > float64(runtime.NumCPU())/2 {
		fmt.Fprintf(&b, "**The machine was busy when this run started (load %.2f): expect wider min–max ranges.**\n\n", l)
	}
	var tables strings.Builder
	all := figures{}
	for _, sc := range e.scenarios() {
		if !only.MatchString(sc.title) {
			continue
		}
		sc.impls = slices.DeleteFunc(sc.impls, func(im *impl) bool { return !impls.MatchString(im.name) })
		logf("%s", sc.title)
		res := runScenario(ctx, sc, o.runs, logf)
		all[sc.title] = res
		writeTable(&tables, sc, res, o.runs)
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
	}
	writeTargets(&b, e, all)
	if o.charts != "" {
		b.WriteString(chartsSection(o.charts, o.out, all, logf))
	}
	b.WriteString("## Figures\n\n")
	b.WriteString(tables.String())
	fmt.Fprintf(&b, "Load average at the end: %s\n", loadavg())
	return b.String(), nil
}

func (e *env) scenarios() []*scenario {
	s := []*scenario{
		e.uncontendedScenario(1),
		e.uncontendedScenario(8),
		e.contendedScenario(8),
		e.handoverScenario(false),
		e.handoverScenario(true),
	}
	s = append(s, e.leaseScenarios()...)
	for _, n := range e.holds {
		s = append(s, e.holdScenario(n, e.holdExtra()...))
	}
	for _, n := range e.keepAlive {
		s = append(s, e.keepAliveScenario(n))
	}
	for _, c := range e.fleet {
		s = append(s, e.fleetScenario(c))
	}
	return s
}

// counts parses a comma-separated list of positive numbers.
func counts(flag, list string) ([]int, error) {
	var out []int
	for _, h := range strings.Split(list, ",") {
		var n int
		if _, err := fmt.Sscan(strings.TrimSpace(h), &n); err != nil || n <= 0 {
			return nil, fmt.Errorf("bad -%s %q", flag, list)
		}
		out = append(out, n)
	}
	return out, nil
}
