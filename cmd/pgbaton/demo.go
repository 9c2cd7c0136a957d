package main

import (
	"bufio"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/internal/db"
	"github.com/pgbaton/pgbaton/internal/pgcluster"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

//go:embed demo_schema.sql
var demoSchema string

// errInvariant marks a demo whose invariants failed.
var errInvariant = errors.New("demo invariants violated")

type demoOpts struct {
	workers int
	items   int
	keep    bool
	timeout time.Duration
}

func newDemoCmd(g *globals) *cobra.Command {
	o := demoOpts{}
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the demo scenario (starts a throwaway PostgreSQL unless --dsn or DATABASE_URL is set)",
		Long: `Runs four worker processes against one database: a cron job that must
run once per slot although the workers' tickers are skewed, work items
claimed with SKIP LOCKED and processed in fenced transactions, and a leader
election. Mid-run the leader is SIGKILLed and another worker is SIGSTOPped
past its lease while it holds an item; when it resumes, its late write is
rejected by the fence. Ends with a summary; exits non-zero if an invariant
failed.`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.workers < 3 || o.items < 10 || o.timeout <= 0 {
				return usageError{fmt.Errorf("demo needs --workers >= 3, --items >= 10 and a positive --timeout")}
			}
			ctx := cmd.Context()
			if g.connString() == "" && os.Getenv("PGHOST") == "" {
				start := time.Now()
				cluster, err := pgcluster.Start(ctx, pgcluster.Config{})
				if err != nil {
					return err
				}
				defer cluster.Stop()
				fmt.Fprintf(g.stdout, "throwaway PostgreSQL on 127.0.0.1:%d up in %s\n", cluster.Port(), time.Since(start).Round(time.Millisecond))
				g.dsn = cluster.URL("postgres")
			}
			pool, err := g.connect(ctx)
			if err != nil {
				return err
			}
			defer pool.Close()
			if err := migrations.Up(ctx, pool); err != nil {
				return err
			}
			if err := runStatus(ctx, g, pool); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout)
			return g.demo(ctx, pool, o)
		},
	}
	cmd.Flags().IntVar(&o.workers, "workers", 4, "worker processes")
	cmd.Flags().IntVar(&o.items, "items", 120, "work items")
	cmd.Flags().BoolVar(&o.keep, "keep", false, "keep the demo's tables and rows afterwards")
	cmd.Flags().DurationVar(&o.timeout, "timeout", 60*time.Second, "give up after this long")
	return cmd
}

// demoRun is the orchestrator's state.
type demoRun struct {
	g       *globals
	pool    *pgxpool.Pool
	q       *db.Queries
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
	fmt.Fprintf(r.g.stdout, "[%5.1fs] %s\n", time.Since(r.start).Seconds(), fmt.Sprintf(format, args...))
}

func (g *globals) demo(ctx context.Context, pool *pgxpool.Pool, o demoOpts) (err error) {
	ctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	r := &demoRun{g: g, pool: pool, q: db.New(), start: time.Now(), workers: map[int]*exec.Cmd{}, owners: map[int]string{},
		events: make(chan demoEvent, 1024), exited: make(chan int, o.workers), stopped: make(chan struct{}),
		stderr: lockedWriter{w: g.stderr}}
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
	args := []string{"demo-worker", "--dsn", r.g.dsn, "--id", strconv.Itoa(id), "--skew", skew.String()}
	if r.g.dsn == "" {
		args = []string{"demo-worker", "--id", strconv.Itoa(id), "--skew", skew.String()}
	}
	if victim {
		args = append(args, "--victim")
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

// scenarioResult is what the scenario observed, for the summary.
type scenarioResult struct {
	killed, paused       int
	killedAt, pausedAt   time.Time // database clock
	killedItems          []string
	killedWasLeader      bool
	pausedItem           string
	pausedToken          int64
	staleRejected        []demoEvent
	errors               []demoEvent
	pauseTakeoverToken   int64
	leaders, slotsRun    int
	processedByWorker    map[int]int
	processedDuringPause int
}

func (r *demoRun) scenario(ctx context.Context, victim, items int) (*scenarioResult, error) {
	res := &scenarioResult{processedByWorker: map[int]int{}}
	leader := 0
	processed := 0
	progress := time.NewTicker(time.Second)
	defer progress.Stop()
	paused := false
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w: the scenario did not finish in time (%d of %d items processed)", errInvariant, processed, items)
		case id := <-r.exited:
			if id != res.killed {
				return nil, fmt.Errorf("%w: worker %d exited unexpectedly", errInvariant, id)
			}
		case <-progress.C:
			who := "none (election under way)"
			if leader != 0 {
				who = fmt.Sprintf("worker %d", leader)
			}
			r.logf("progress: %d/%d items processed, %d slots run, leader %s", processed, items, res.slotsRun, who)
		case ev := <-r.events:
			switch ev.Kind {
			case "ready":
				r.owners[ev.Worker] = ev.Detail
			case "leader":
				leader = ev.Worker
				res.leaders++
				r.logf("worker %d is leader, term %d", ev.Worker, ev.Token)
			case "slot":
				res.slotsRun++
			case "processed":
				processed++
				res.processedByWorker[ev.Worker]++
				if paused {
					res.processedDuringPause++
				}
			case "stale":
				res.staleRejected = append(res.staleRejected, ev)
				r.logf("worker %d woke up and tried to write %s with token %d: REJECTED by the fence (current token %d, %s)",
					ev.Worker, ev.Item, ev.Token, ev.Current, ev.Detail)
			case "error":
				res.errors = append(res.errors, ev)
				r.logf("worker %d error: %s", ev.Worker, ev.Detail)
			case "resumed":
				paused = false
				res.pauseTakeoverToken = ev.Current
				r.logf("%s was granted again (token %d, or already done): SIGCONT worker %d", ev.Item, ev.Current, ev.Worker)
			case "holding":
				if res.paused == 0 && res.killed != 0 && ev.Worker == victim {
					if err := r.pause(ctx, res, ev, &paused); err != nil {
						return nil, err
					}
				}
			}
		}
		// First fault: once work and leadership are under way, kill the
		// leader mid-job.
		if res.killed == 0 && leader != 0 && processed >= items/5 {
			if err := r.kill(ctx, res, leader); err != nil {
				return nil, err
			}
			leader = 0
		}
		if processed >= items && res.paused != 0 && !paused {
			left, err := r.q.DemoProcessedCount(ctx, r.pool)
			if err != nil {
				return nil, err
			}
			if int(left.Items) >= items && len(res.staleRejected) > 0 {
				r.logf("all %d items processed", items)
				return res, nil
			}
		}
	}
}

func (r *demoRun) kill(ctx context.Context, res *scenarioResult, id int) error {
	held, err := r.q.DemoHeldBy(ctx, r.pool, r.owners[id])
	if err != nil {
		return err
	}
	if err := r.workers[id].Process.Signal(syscall.SIGKILL); err != nil {
		return err
	}
	res.killedAt, err = r.q.DemoNow(ctx, r.pool)
	if err != nil {
		return err
	}
	res.killed, res.killedWasLeader = id, true
	for _, n := range held {
		if n != demoLeader {
			res.killedItems = append(res.killedItems, n)
		}
	}
	r.logf("SIGKILL worker %d (the leader) while it holds %d items: its leases must expire before anyone else gets them", id, len(res.killedItems))
	return nil
}

// pause SIGSTOPs the victim while it holds ev.Item, waits until another
// worker has taken the item over (its lease expired), then SIGCONTs it.
func (r *demoRun) pause(ctx context.Context, res *scenarioResult, ev demoEvent, paused *bool) error {
	if err := r.workers[ev.Worker].Process.Signal(syscall.SIGSTOP); err != nil {
		return err
	}
	var err error
	if res.pausedAt, err = r.q.DemoNow(ctx, r.pool); err != nil {
		return err
	}
	res.paused, res.pausedItem, res.pausedToken = ev.Worker, ev.Item, ev.Token
	*paused = true
	r.logf("SIGSTOP worker %d while it holds %s (token %d), past its %s lease", ev.Worker, ev.Item, ev.Token, demoTTL)
	go func() {
		// Resume once someone else holds or finished the item.
		var took int64
		for ctx.Err() == nil {
			cur, err := r.q.DemoLeaseOf(ctx, r.pool, ev.Item)
			if err != nil || cur.Token > ev.Token {
				took = cur.Token
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		_ = r.workers[ev.Worker].Process.Signal(syscall.SIGCONT)
		r.send(demoEvent{Kind: "resumed", Worker: ev.Worker, Item: ev.Item, Current: took})
	}()
	return nil
}

// summary checks the invariants in the database and prints the table.
func (r *demoRun) summary(ctx context.Context, sc *scenarioResult, items int) error {
	slots, err := r.q.DemoSlotStats(ctx, r.pool)
	if err != nil {
		return err
	}
	it, err := r.q.DemoItemStats(ctx, r.pool)
	if err != nil {
		return err
	}
	terms, err := r.q.DemoTerms(ctx, r.pool)
	if err != nil {
		return err
	}
	bound := demoTTL + time.Second
	type row struct {
		What  string `json:"what"`
		Value string `json:"value"`
		OK    bool   `json:"ok"`
	}
	var rows []row
	check := func(what, value string, ok bool) { rows = append(rows, row{what, value, ok}) }

	check("cron slots run (1s slots, 4 skewed tickers)", fmt.Sprint(slots.Slots), slots.Slots > 0)
	check("most runs of one slot", fmt.Sprint(slots.MaxRunsPerSlot), slots.MaxRunsPerSlot == 1)
	check("overlapping slot runs", fmt.Sprint(slots.Runs-slots.Slots), slots.Runs == slots.Slots)

	increasing := len(terms) >= 2
	for i := 1; i < len(terms); i++ {
		increasing = increasing && terms[i].Term > terms[i-1].Term
	}
	termList := ""
	for _, t := range terms {
		termList += fmt.Sprintf(" %d(w%d)", t.Term, t.Worker)
	}
	check("leader terms (term(worker)), strictly increasing", termList[min(1, len(termList)):], increasing)

	newTerm, err := r.q.DemoTermAfter(ctx, r.pool, db.DemoTermAfterParams{Worker: int32(sc.killed), Since: sc.killedAt})
	if err != nil {
		return err
	}
	leaderTakeover := newTerm.Sub(sc.killedAt)
	check("new leader after SIGKILL of the leader", fmtDuration(leaderTakeover), newTerm.After(sc.killedAt) && leaderTakeover <= bound)

	if len(sc.killedItems) > 0 {
		regrant, err := r.q.DemoTakeover(ctx, r.pool, db.DemoTakeoverParams{Names: sc.killedItems, Worker: int32(sc.killed), Since: sc.killedAt})
		if err != nil {
			return err
		}
		d := regrant.Sub(sc.killedAt)
		check(fmt.Sprintf("killed worker's %d items taken over after", len(sc.killedItems)), fmtDuration(d), regrant.After(sc.killedAt) && d <= bound)
	}
	check("items processed exactly once", fmt.Sprintf("%d/%d", it.Items-it.Doubled, items), int(it.Items) == items && it.Doubled == 0)
	check("items processed twice", fmt.Sprint(it.Doubled), it.Doubled == 0)
	check("workers that processed items", fmt.Sprint(it.Workers), it.Workers >= 2)

	staleOK := len(sc.staleRejected) > 0
	for _, ev := range sc.staleRejected {
		staleOK = staleOK && ev.Token == sc.pausedToken && ev.Item == sc.pausedItem
	}
	check(fmt.Sprintf("stale writes rejected (worker %d, SIGSTOPped holding %s, token %d)", sc.paused, sc.pausedItem, sc.pausedToken),
		fmt.Sprint(len(sc.staleRejected)), staleOK)
	check("stale writes accepted", "0", int(it.Rows) == items) // a stale accept would show as a second row
	check("worker errors", fmt.Sprint(len(sc.errors)), len(sc.errors) == 0)

	fmt.Fprintln(r.g.stdout)
	failed := 0
	err = r.g.render(rows, []string{"CHECK", "VALUE", "OK"}, func() [][]string {
		var out [][]string
		for _, x := range rows {
			mark := "ok"
			if !x.OK {
				mark = "FAILED"
				failed++
			}
			out = append(out, []string{x.What, x.Value, mark})
		}
		return out
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(r.g.stdout, "\ndemo finished in %s\n", time.Since(r.start).Round(100*time.Millisecond))
	if failed > 0 {
		return fmt.Errorf("%w: %d checks failed", errInvariant, failed)
	}
	return nil
}
