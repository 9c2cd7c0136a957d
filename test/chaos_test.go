package test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/faultproxy"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/test/check"
)

var (
	chaosSeed     = flag.Uint64("chaos.seed", 0, "replay this seed (0: a random one per run)")
	chaosSeeds    = flag.Int("chaos.seeds", 1, "how many seeds to run (make chaos runs many)")
	chaosDuration = flag.Duration("chaos.duration", 35*time.Second, "how long the nemesis runs per seed")
)

// Fault kinds of the nemesis.
const (
	faultKill      = "kill"      // SIGKILL a worker (a new one takes its place)
	faultPause     = "pause"     // SIGSTOP a worker past its TTL, then SIGCONT
	faultTerminate = "terminate" // pg_terminate_backend of a worker's backends
	faultCut       = "cut"       // reset a worker's TCP connections
	faultStall     = "stall"     // forward nothing on a worker's connections, no FIN or RST
	faultSlow      = "slow"      // add latency to a worker's connections
	faultRestart   = "restart"   // restart the cluster in immediate mode (a crash)
	faultIdleKill  = "idlekill"  // terminate every idle session, as an idle-session killer does
)

var allFaults = []string{faultKill, faultPause, faultTerminate, faultCut, faultStall, faultSlow, faultRestart, faultIdleKill}

type chaosConfig struct {
	Seed     uint64
	Duration time.Duration
	Workers  int
	Keys     int
	TTL      time.Duration
	Writes   int           // guarded writes per grant
	Work     time.Duration // work after each write, up to
	Broken   bool          // run the broken worker variant
	Advisory bool          // advisory session locks instead of leases
	Faults   []string
	Pause    time.Duration // between faults, up to
	// HitHolders makes the nemesis always pick a worker that holds a
	// lease when there is one (by default it does so three times in four).
	HitHolders bool
}

// fault is one nemesis action, for the liveness checker.
type fault struct {
	Kind   string
	Victim int    // proc, 0 for the whole cluster
	Key    string // lease the victim held when the fault began, or ""
	At     int64  // monotonic start
	Healed int64  // monotonic end (same as At for instant faults)
}

type chaosResult struct {
	Ops, Faults   int
	Overlaps      []check.Overlap
	Linearizable  porcupine.CheckResult
	Fenced        check.FencedResult // the fenced lease model, on the history with the ledger's commit order
	Ledger        check.LedgerReport
	MaxTakeover   time.Duration
	WorstFault    string
	WorstByKind   map[string]time.Duration // longest wait for the next grant, per fault kind
	LateTakeovers []string                 // faults not followed by a grant within the bound

	events []check.Event // the history, for further checks
	db     *pgtest.DB    // the run's database, until the test ends
}

// violated reports whether any checker found a violation.
func (r chaosResult) violated() bool {
	l := r.Ledger
	return len(r.Overlaps) > 0 || r.Linearizable != porcupine.Ok || r.Fenced.Result != porcupine.Ok || len(l.StaleAccepted) > 0 ||
		len(l.Lost) > 0 || len(l.Doubled) > 0 || len(r.LateTakeovers) > 0
}

func (r chaosResult) line(seed uint64) string {
	return fmt.Sprintf("chaos: seed %d ops %d faults %d overlaps %d stale_accepted %d lost %d doubled %d max_takeover_ms %d",
		seed, r.Ops, r.Faults, len(r.Overlaps), len(r.Ledger.StaleAccepted), len(r.Ledger.Lost), len(r.Ledger.Doubled), r.MaxTakeover.Milliseconds())
}

// proc is one worker process and its fault proxy.
type proc struct {
	id    int
	child *pgtest.Child
	proxy *faultproxy.Proxy
	read  chan struct{} // closed when its stdout is read to the end
}

type chaosRun struct {
	t        *testing.T
	cfg      chaosConfig
	d        *pgtest.DB
	pool     *pgxpool.Pool
	target   string // host:port of the server
	stopFile string
	hist     *check.History
	keys     []string

	mu     sync.Mutex
	procs  map[int]*proc
	all    []*proc
	nextID int
	faults []fault
}

// runChaos runs one seed: workers and nemesis for cfg.Duration, then the
// checkers. It fails the test only for harness errors; the caller judges
// the result.
func runChaos(t *testing.T, cfg chaosConfig) chaosResult {
	d := env.DB(t)
	pool := d.Pool(t, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = "chaos-parent" })
	ctx := pgtest.Context(t, cfg.Duration+3*time.Minute)
	r := &chaosRun{t: t, cfg: cfg, d: d, pool: pool, hist: check.NewHistory(), procs: map[int]*proc{},
		stopFile: filepath.Join(t.TempDir(), "stop")}
	u, err := url.Parse(d.URL)
	require.NoError(t, err)
	r.target = u.Host
	require.NotEmpty(t, r.target, "the chaos suite proxies TCP connections: the server needs a TCP address")
	_, err = pool.Exec(ctx, `CREATE TABLE chaos_head (key text PRIMARY KEY, seq bigint NOT NULL DEFAULT 0);
		CREATE TABLE chaos_ledger (id bigserial PRIMARY KEY, key text NOT NULL, token bigint NOT NULL, op_id text NOT NULL, seq bigint NOT NULL)`)
	require.NoError(t, err)
	for i := range cfg.Keys {
		r.keys = append(r.keys, fmt.Sprintf("chaos:key:%d", i))
		_, err := pool.Exec(ctx, "INSERT INTO chaos_head (key) VALUES ($1)", r.keys[i])
		require.NoError(t, err)
	}
	for range cfg.Workers {
		r.startProc()
	}
	r.nemesis(ctx)
	// A quiet spell as long as the liveness bound, so that the last fault
	// too is followed by the grant the liveness checker looks for.
	sleepCtx(ctx, r.livenessBound())
	r.stop()

	events := r.hist.Snapshot()
	res := chaosResult{Faults: len(r.faults), events: events, db: d}
	for _, ev := range events {
		if ev.Type != check.EvInvoke {
			res.Ops++
		}
	}
	gs, unknown := check.Grants(events)
	res.Overlaps = check.Overlaps(gs)
	res.Linearizable = check.Linearizable(gs, unknown, time.Minute)
	res.Ledger, err = check.CheckLedger(ctx, pool, pgx.Identifier{"chaos_ledger"}, events)
	require.NoError(t, err)
	ordered, err := check.LedgerOrder(ctx, pool, pgx.Identifier{"chaos_ledger"}, events)
	require.NoError(t, err)
	res.Fenced = check.FencedLinearizable(ordered, time.Minute)
	r.liveness(gs, &res)
	r.noLeaks(ctx)
	if res.violated() || t.Failed() || os.Getenv("CHAOS_HISTORY") != "" {
		r.dumpHistory(events)
	}
	return res
}

func (r *chaosRun) startProc() *proc {
	r.mu.Lock()
	r.nextID++
	id := r.nextID
	r.mu.Unlock()
	px, err := faultproxy.New(r.target)
	require.NoError(r.t, err)
	r.t.Cleanup(func() { _ = px.Close() })
	u, _ := url.Parse(r.d.URL)
	u.Host = px.Addr()
	args := workerArgs{URL: u.String(), Proc: id, Keys: r.keys, TTL: r.cfg.TTL, Seed: r.cfg.Seed, Broken: r.cfg.Broken,
		StopFile: r.stopFile, Writes: r.cfg.Writes, Work: r.cfg.Work, Advisory: r.cfg.Advisory}
	p := &proc{id: id, proxy: px, read: make(chan struct{})}
	p.child = env.StartChild(r.t, "worker", args.encode()...)
	go func() {
		defer close(p.read)
		for line := range p.child.Lines() {
			var ev check.Event
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Op != "" {
				r.hist.Add(ev)
			}
		}
	}()
	r.mu.Lock()
	r.procs[id] = p
	r.all = append(r.all, p)
	r.mu.Unlock()
	return p
}

// nemesis applies faults on a schedule drawn from the seed until the run's
// duration is over. The kinds, gaps and durations follow the seed; which
// worker is hit depends also on who holds a lease at that moment.
func (r *chaosRun) nemesis(ctx context.Context) {
	rng := rand.New(rand.NewPCG(r.cfg.Seed, 0x6e656d65))
	end := time.Now().Add(r.cfg.Duration)
	for time.Now().Before(end) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(r.cfg.Pause/2 + time.Duration(rng.Int64N(int64(r.cfg.Pause)))):
		}
		kind := r.cfg.Faults[rng.IntN(len(r.cfg.Faults))]
		f := fault{Kind: kind, At: check.MonoNow()}
		victim := r.pickVictim(rng)
		f.Victim, f.Key = victim.id, r.hist.Holders()[victim.id]
		r.apply(ctx, rng, &f, victim)
		f.Healed = check.MonoNow()
		r.mu.Lock()
		r.faults = append(r.faults, f)
		r.mu.Unlock()
	}
}

// pickVictim prefers a worker that holds a lease now.
func (r *chaosRun) pickVictim(rng *rand.Rand) *proc {
	holders := r.hist.Holders()
	r.mu.Lock()
	defer r.mu.Unlock()
	var ids, held []int
	for id := range r.procs {
		ids = append(ids, id)
		if _, ok := holders[id]; ok {
			held = append(held, id)
		}
	}
	slices.Sort(ids)
	slices.Sort(held)
	if len(held) > 0 && (r.cfg.HitHolders || rng.IntN(4) > 0) {
		return r.procs[held[rng.IntN(len(held))]]
	}
	return r.procs[ids[rng.IntN(len(ids))]]
}

func (r *chaosRun) apply(ctx context.Context, rng *rand.Rand, f *fault, v *proc) {
	t, ttl := r.t, r.cfg.TTL
	// A fault lasts around a TTL: long enough for a lease to be lost.
	span := func() time.Duration { return ttl/2 + time.Duration(rng.Int64N(int64(ttl))) }
	switch f.Kind {
	case faultKill:
		v.child.Signal(t, syscall.SIGKILL)
		<-v.read
		r.mu.Lock()
		delete(r.procs, v.id)
		r.mu.Unlock()
		r.hist.Forget(v.id)
		r.startProc()
	case faultPause:
		v.child.Signal(t, syscall.SIGSTOP)
		sleepCtx(ctx, ttl+span())
		v.child.Signal(t, syscall.SIGCONT)
	case faultTerminate:
		_, err := r.pool.Exec(ctx, "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
			fmt.Sprintf("chaos-p%d", v.id))
		require.NoError(t, err)
	case faultCut:
		v.proxy.Cut()
	case faultStall:
		v.proxy.Stall()
		sleepCtx(ctx, span())
		v.proxy.Resume()
	case faultSlow:
		v.proxy.SetLatency(time.Duration(10+rng.IntN(90)) * time.Millisecond)
		sleepCtx(ctx, span())
		v.proxy.SetLatency(0)
	case faultRestart:
		f.Victim, f.Key = 0, ""
		env.Restart(t, pgcluster.Immediate)
		r.pool.Reset()
	case faultIdleKill:
		f.Victim, f.Key = 0, ""
		_, err := r.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND state = 'idle'
			  AND application_name <> 'chaos-parent' AND state_change < clock_timestamp() - interval '200 ms'`)
		require.NoError(t, err)
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// stop asks every worker to finish its round and exit, heals every fault
// first, and waits for all of them.
func (r *chaosRun) stop() {
	require.NoError(r.t, os.WriteFile(r.stopFile, nil, 0o600))
	r.mu.Lock()
	procs := slices.Clone(r.all)
	r.mu.Unlock()
	for _, p := range procs {
		p.proxy.Resume()
		p.proxy.SetLatency(0)
		select {
		case <-p.child.Done():
		default:
			_ = p.child.Cmd.Process.Signal(syscall.SIGCONT)
		}
	}
	for _, p := range procs {
		select {
		case <-p.read:
		case <-time.After(time.Minute):
			r.t.Fatalf("worker p%d did not stop; stderr:\n%s", p.id, p.child.Stderr())
		}
		<-p.child.Done()
		if p.child.Cmd.ProcessState.Success() {
			continue
		}
		if ws, ok := p.child.Cmd.ProcessState.Sys().(syscall.WaitStatus); ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL {
			continue // killed by the nemesis
		}
		r.t.Errorf("worker p%d failed: %v\n%s", p.id, p.child.Cmd.ProcessState, p.child.Stderr())
	}
}

// liveness: after every fault, the lease or lock the victim held (or, for faults
// of the whole cluster or of a worker that held none, any lease) is
// granted again within the bound. For a killed or paused holder that is a
// takeover, counted from the fault's start; otherwise the holder may keep
// its lease and finish, so it is counted from the fault's end.
func (r *chaosRun) liveness(gs []check.Grant, res *chaosResult) {
	bound := r.livenessBound()
	for _, t := range takeovers(r.faults, gs, bound, r.cfg.Advisory) {
		f := t.fault
		if t.took < 0 {
			res.LateTakeovers = append(res.LateTakeovers, fmt.Sprintf("%s of p%d (%s): no grant afterwards", f.Kind, f.Victim, f.Key))
			continue
		}
		if res.WorstByKind == nil {
			res.WorstByKind = map[string]time.Duration{}
		}
		res.WorstByKind[f.Kind] = max(res.WorstByKind[f.Kind], t.took)
		if t.took > res.MaxTakeover {
			res.MaxTakeover = t.took
			res.WorstFault = fmt.Sprintf("%s of p%d holding %q", f.Kind, f.Victim, f.Key)
		}
		if t.late(bound) {
			res.LateTakeovers = append(res.LateTakeovers, fmt.Sprintf("%s of p%d (%s): next grant after %s > %s (%s of it after later faults)",
				f.Kind, f.Victim, f.Key, t.took, bound, t.excused))
		}
	}
}

// takeover is how long after a fault its key was granted again: took, or
// -1 when it never was. excused is the part of that wait a later fault
// accounts for (see takeovers).
type takeover struct {
	fault   fault
	took    time.Duration
	excused time.Duration
}

// late reports whether the fault's key was not granted again within bound
// of the last fault that excuses the wait.
func (t takeover) late(bound time.Duration) bool {
	return t.took < 0 || t.took-t.excused > bound
}

// takeovers measures, for each fault, the wait for the next grant of its
// key. A fault that struck before that grant, within the bound of the
// one before it, restarts the count: the queue is fair, so the next in
// line may be the worker it hit, and a killed, paused or cut-off waiter
// keeps its place until its session expires, a TTL later (etcd's lock
// queue does the same). Such a chain is measured from its last fault;
// the time before that is excused.
func takeovers(faults []fault, gs []check.Grant, bound time.Duration, advisory bool) []takeover {
	// from is when a fault's wait begins. A killed holder's lease is free
	// at its expiry, a killed holder's advisory lock at once; a paused
	// holder's lease is free at its expiry, while a paused holder keeps
	// its advisory session (its kernel still answers TCP) until it resumes
	// and gives up.
	from := func(f fault) int64 {
		if f.Kind == faultKill || (f.Kind == faultPause && !advisory) {
			return f.At
		}
		return f.Healed
	}
	var out []takeover
	for i, f := range faults {
		start := from(f)
		next := int64(-1)
		for _, g := range gs {
			if g.Start > start && (f.Key == "" || g.Key == f.Key) && (next < 0 || g.Start < next) {
				next = g.Start
			}
		}
		if next < 0 {
			out = append(out, takeover{fault: f, took: -1})
			continue
		}
		last := start
		for _, g := range faults[i+1:] {
			if g.At >= next || g.At > last+int64(bound) {
				break
			}
			last = max(last, from(g))
		}
		out = append(out, takeover{fault: f, took: time.Duration(next - start), excused: time.Duration(last - start)})
	}
	return out
}

// livenessBound is how soon after a fault the lock must be granted
// again: the lease's expiry (TTL; for advisory locks PingInterval +
// PingTimeout), a waiter's wake-up, plus the critical section a surviving
// holder finishes first, and a second for scheduling on a loaded machine.
func (r *chaosRun) livenessBound() time.Duration {
	return 2*r.cfg.TTL + time.Duration(r.cfg.Writes)*r.cfg.Work + time.Second
}

// noLeaks: at the end no worker process runs, no lease is held, no lock
// is left in pg_locks and no connection is left on the database.
func (r *chaosRun) noLeaks(ctx context.Context) {
	t := r.t
	for _, p := range r.all {
		select {
		case <-p.child.Done():
		default:
			t.Errorf("worker p%d still running", p.id)
		}
	}
	// Killed holders' leases run out at their TTL; nothing else may stay.
	pgtest.Eventually(t, 3*r.cfg.TTL, func() (bool, error) {
		var n int
		err := r.pool.QueryRow(ctx, "SELECT count(*) FROM pgbaton.lease_status WHERE held").Scan(&n)
		return n == 0, err
	}, "leases still held after every worker stopped")
	var locks []string
	pgtest.Eventually(t, 10*time.Second, func() (bool, error) {
		rows, err := r.pool.Query(ctx, `SELECT format('%s %s pid %s', locktype, mode, pid) FROM pg_locks
			WHERE pid <> pg_backend_pid() AND (locktype = 'advisory' OR database = (SELECT oid FROM pg_database WHERE datname = current_database()))`)
		if err != nil {
			return false, err
		}
		locks, err = pgx.CollectRows(rows, pgx.RowTo[string])
		return len(locks) == 0, err
	}, "locks left in pg_locks: %v", &locks)
	r.pool.Close()
	env.NoConnections(t, r.d)
}

func (r *chaosRun) dumpHistory(events []check.Event) {
	path := filepath.Join(os.TempDir(), fmt.Sprintf("chaos-history-%d.jsonl", r.cfg.Seed))
	var b strings.Builder
	for _, ev := range events {
		j, _ := json.Marshal(ev)
		b.Write(j)
		b.WriteByte('\n')
	}
	for _, f := range r.faults {
		j, _ := json.Marshal(f)
		b.WriteString(`{"fault":` + string(j) + "}\n")
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err == nil {
		r.t.Logf("history written to %s", path)
	}
}
