package main

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// clockTicks is the kernel's USER_HZ, the unit of the CPU times in
// /proc/<pid>/stat: 100 on every Linux architecture Go supports.
const clockTicks = 100

// monitor is a connection that samples what the server did: commits of the
// bench's database (pg_stat_database.xact_commit), transaction ids
// assigned (write transactions, cluster-wide), and the CPU time of the
// cluster's processes read from /proc when the server runs on this
// machine. Its own transactions are counted, so that a delta can leave
// them out.
type monitor struct {
	mu         sync.Mutex // one statement at a time on c
	c          *pgx.Conn
	postmaster int    // 0 when the server's processes cannot be read here
	noCPU      string // why, when postmaster is 0
	txns       int64  // transactions this monitor has run so far
}

// stat is one sample of a monitor.
type stat struct {
	at          time.Time // when the CPU counters were read
	dbAt        time.Time // when the database's counters were
	commits     int64     // pg_stat_database.xact_commit of the database
	xids        int64     // next transaction id (write transactions so far)
	ownTxns     int64     // the monitor's transactions before this sample
	serverTicks int64     // CPU of the cluster's processes; -1 if unknown
	selfTicks   int64     // CPU of this process; -1 if unknown
	machine     machineTicks
}

func (e *env) newMonitor(ctx context.Context, app string) (*monitor, error) {
	c, err := e.conn(ctx, app)
	if err != nil {
		return nil, err
	}
	m := &monitor{c: c}
	var backend int
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		c.Close(ctx)
		return nil, err
	}
	m.txns++
	m.postmaster, m.noCPU = findPostmaster(backend)
	return m, nil
}

func (m *monitor) close(ctx context.Context) { m.c.Close(ctx) }

// queryRow runs one statement (one transaction) on the monitor's connection.
func (m *monitor) queryRow(ctx context.Context, sql string, args []any, dest ...any) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.txns++
	return m.c.QueryRow(ctx, sql, args...).Scan(dest...)
}

// exec runs one statement without results.
func (m *monitor) exec(ctx context.Context, sql string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.txns++
	_, err := m.c.Exec(ctx, sql)
	return err
}

// query runs one statement that returns rows.
func (m *monitor) query(ctx context.Context, sql string, args []any, row func(pgx.Rows) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.txns++
	rows, _ := m.c.Query(ctx, sql, args...)
	defer rows.Close()
	for rows.Next() {
		if err := row(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

func (m *monitor) sample(ctx context.Context) (stat, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// The CPU counters are read at once, where the caller takes the
	// sample (a window's edge), the machine's first (the server's walk
	// every process in /proc, slow beside 500 clients); the database's
	// when the query is answered, timed then: on a saturated server it
	// waits seconds for its turn, longer at a fleet window's start than at
	// its end. Read after the query, a fleet that kept both cores busy
	// (vmstat beside it: no idle time) showed 60-140 % machine CPU of 200.
	s := stat{at: time.Now(), ownTxns: m.txns, serverTicks: -1, selfTicks: -1}
	s.machine = readMachineTicks()
	if t, _, err := procTicks(os.Getpid()); err == nil {
		s.selfTicks = t
	}
	if m.postmaster != 0 {
		s.serverTicks = clusterTicks(m.postmaster)
	}
	m.txns++
	err := m.c.QueryRow(ctx, "SELECT coalesce(xact_commit, 0), pg_snapshot_xmax(pg_current_snapshot())::text::bigint "+
		"FROM pg_stat_database WHERE datname = current_database()").Scan(&s.commits, &s.xids)
	s.dbAt = time.Now()
	return s, err
}

// machineTicks is the whole machine's CPU time from /proc/stat, all CPUs
// summed: busy (user, nice, system, irq, softirq) and steal (time the
// hypervisor ran something else while this guest wanted to run). The
// cluster and the bench share the machine with the kernel's own threads
// and whatever else runs; a run whose machine CPU is far above server +
// client CPU, or that shows steal, was slowed by something else. -1 when
// /proc/stat cannot be read.
type machineTicks struct{ busy, steal int64 }

func readMachineTicks() machineTicks {
	unknown := machineTicks{-1, -1}
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return unknown
	}
	line, _, _ := strings.Cut(string(data), "\n")
	f := strings.Fields(line)
	// cpu user nice system idle iowait irq softirq steal ...
	if len(f) < 9 || f[0] != "cpu" {
		return unknown
	}
	var v [8]int64
	for k := range v {
		if v[k], err = strconv.ParseInt(f[1+k], 10, 64); err != nil {
			return unknown
		}
	}
	return machineTicks{busy: v[0] + v[1] + v[2] + v[5] + v[6], steal: v[7]}
}

// usage is what the server did between two samples.
type usage struct {
	seconds        float64
	commitsPerSec  float64 // without the monitor's own
	writesPerSec   float64 // transaction ids assigned per second
	serverCPU      float64 // % of one core; NaN when unknown
	clientCPU      float64 // this process, % of one core; NaN when unknown
	machineCPU     float64 // every CPU's busy time, % of one core; NaN when unknown
	stealCPU       float64 // every CPU's steal time, % of one core; NaN when unknown
	commits, xids  int64
	monitorCommits int64
}

func between(a, b stat) usage {
	u := usage{seconds: b.at.Sub(a.at).Seconds(), serverCPU: math.NaN(), clientCPU: math.NaN(), machineCPU: math.NaN(), stealCPU: math.NaN()}
	u.monitorCommits = b.ownTxns - a.ownTxns
	u.commits = max(b.commits-a.commits-u.monitorCommits, 0)
	u.xids = b.xids - a.xids
	dbSeconds := b.dbAt.Sub(a.dbAt).Seconds()
	u.commitsPerSec = float64(u.commits) / dbSeconds
	u.writesPerSec = float64(u.xids) / dbSeconds
	pct := func(t0, t1 int64) float64 {
		if t0 < 0 || t1 < 0 {
			return math.NaN()
		}
		return float64(t1-t0) / clockTicks / u.seconds * 100
	}
	u.serverCPU = pct(a.serverTicks, b.serverTicks)
	u.clientCPU = pct(a.selfTicks, b.selfTicks)
	u.machineCPU = pct(a.machine.busy, b.machine.busy)
	u.stealCPU = pct(a.machine.steal, b.machine.steal)
	return u
}

// findPostmaster returns the pid of the postmaster whose child is backend,
// if /proc shows it on this machine, or why not.
func findPostmaster(backend int) (int, string) {
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", backend))
	if err != nil || !strings.HasPrefix(string(cmd), "postgres") {
		return 0, "the server's processes are not visible on this machine"
	}
	_, ppid, err := procTicks(backend)
	if err != nil {
		return 0, err.Error()
	}
	comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", ppid))
	if err != nil || !strings.HasPrefix(strings.TrimSpace(string(comm)), "postgres") {
		return 0, "the backend's parent is not a postmaster"
	}
	return ppid, ""
}

// procStat reads utime, stime, cutime and cstime (clock ticks) and the
// parent pid of a process.
func procStat(pid int) (times [4]int64, ppid int, err error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return times, 0, err
	}
	// The command name, field 2, is in parentheses and may hold spaces.
	i := strings.LastIndexByte(string(data), ')')
	if i < 0 {
		return times, 0, errors.New("unexpected /proc stat format")
	}
	f := strings.Fields(string(data[i+1:]))
	// f[0] is field 3 (state): ppid is field 4, utime..cstime fields 14-17.
	if len(f) < 15 {
		return times, 0, errors.New("short /proc stat line")
	}
	if ppid, err = strconv.Atoi(f[1]); err != nil {
		return times, 0, err
	}
	for k := range times {
		if times[k], err = strconv.ParseInt(f[11+k], 10, 64); err != nil {
			return times, 0, err
		}
	}
	return times, ppid, nil
}

// procTicks is the CPU time of a process itself and its parent's pid.
func procTicks(pid int) (int64, int, error) {
	t, ppid, err := procStat(pid)
	return t[0] + t[1], ppid, err
}

// clusterTicks is the CPU time of a PostgreSQL cluster: the postmaster's
// own, that of its children which have exited (cutime, cstime: backends
// that ended are counted there once reaped), and that of its children
// alive now (backends and auxiliary processes). A delta of it counts the
// CPU of every process of the cluster, whether it lived through the whole
// interval or not. -1 when the postmaster is gone.
func clusterTicks(postmaster int) int64 {
	t, _, err := procStat(postmaster)
	if err != nil {
		return -1
	}
	total := t[0] + t[1] + t[2] + t[3]
	dir, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	for _, d := range dir {
		pid, err := strconv.Atoi(d.Name())
		if err != nil || pid == postmaster {
			continue
		}
		ct, ppid, err := procStat(pid)
		if err != nil || ppid != postmaster {
			continue
		}
		total += ct[0] + ct[1]
	}
	return total
}
