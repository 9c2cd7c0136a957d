package admin

import (
	"context"
	"net/http"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgbaton/pgbaton/admin/admindb"
)

// metricDescs are the descriptions of every series /metrics exports. They
// belong to a Server, not to the package: two servers in one process never
// share state.
type metricDescs struct {
	buildInfo                                           *prometheus.Desc
	up, scrapeSeconds                                   *prometheus.Desc
	advisoryHeld, advisoryWaiters, advisoryContended    *prometheus.Desc
	advisorySessions                                    *prometheus.Desc
	leases, leaseTokenMax                               *prometheus.Desc
	groupLeases, groupTokenMax, leaseToken              *prometheus.Desc
	lockTableUsed, lockTableAdvisory, lockTableCapacity *prometheus.Desc
	auditEvents                                         *prometheus.Desc
	graceEnabled, graceRemaining                        *prometheus.Desc
}

func newMetricDescs() *metricDescs {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc("pgbaton_"+name, help, labels, nil)
	}
	return &metricDescs{
		buildInfo: prometheus.NewDesc("pgbaton_build_info",
			"Always 1: the version and commit of the pgbaton admin module serving these metrics, and the Go release that built it.",
			[]string{"version", "revision", "goversion"}, nil),
		up:                d("up", "1 when every database query of this scrape succeeded, else 0 (and no other pgbaton series)."),
		scrapeSeconds:     d("scrape_duration_seconds", "Time the database queries of this scrape took."),
		advisoryHeld:      d("advisory_locks_held", "Advisory locks granted in this database."),
		advisoryWaiters:   d("advisory_lock_waiters", "Advisory lock requests waiting to be granted."),
		advisoryContended: d("advisory_locks_contended", "Distinct advisory locks with at least one waiter."),
		advisorySessions:  d("advisory_sessions", "Database sessions holding at least one advisory lock."),
		leases:            d("leases", "Leases by state: held, expired (expiry passed, not yet taken over) or free.", "state"),
		leaseTokenMax:     d("lease_token_max", "Highest fencing token granted to any lease."),
		groupLeases:       d("lease_group_leases", "Held and expired leases per lease group (\"\" for leases without a group); the groups with the most leases, at most TopN.", "group", "state"),
		groupTokenMax:     d("lease_group_token_max", "Highest fencing token per lease group; the groups with the most leases, at most TopN.", "group"),
		leaseToken:        d("lease_token", "Last fencing token of the TopN leases with the highest tokens.", "lease", "group"),
		lockTableUsed:     d("lock_table_used_entries", "Entries of the server's shared lock table in use (all databases, not fast-path)."),
		lockTableAdvisory: d("lock_table_advisory_entries", "Advisory lock entries in the server's shared lock table (all databases)."),
		lockTableCapacity: d("lock_table_capacity_entries", "Approximate size of the shared lock table; when it is full, even new logins fail."),
		auditEvents:       d("audit_events_total", "Forced releases written to the audit log (pgbaton.event) by action: forced lease releases and terminated advisory lock holders.", "action"),
		graceEnabled:      d("failover_grace_enabled", "1 when the failover grace is on: after a timeline change no lease is granted until the longest TTL in use has passed."),
		graceRemaining:    d("failover_grace_remaining_seconds", "Seconds until the current failover grace ends and leases are granted again; 0 when none holds grants back."),
	}
}

func (m *metricDescs) all() []*prometheus.Desc {
	return []*prometheus.Desc{m.buildInfo, m.up, m.scrapeSeconds, m.advisoryHeld, m.advisoryWaiters, m.advisoryContended,
		m.advisorySessions, m.leases, m.leaseTokenMax, m.groupLeases, m.groupTokenMax, m.leaseToken,
		m.lockTableUsed, m.lockTableAdvisory, m.lockTableCapacity, m.auditEvents, m.graceEnabled, m.graceRemaining}
}

// snapshot is one scrape's worth of database state.
type snapshot struct {
	advisory  admindb.AdminAdvisoryStatsRow
	leases    admindb.AdminLeaseTotalsRow
	groups    []admindb.AdminLeaseGroupsRow
	tokens    []admindb.AdminTopLeaseTokensRow
	lockTable admindb.LockTableUsageRow
	events    []admindb.AdminEventCountsRow
	grace     admindb.FailoverGraceRow
}

func readSnapshot(ctx context.Context, pool *pgxpool.Pool, topN int) (*snapshot, error) {
	// One connection for the whole scrape: a scrape must not take a pool's
	// worth of connections from the database it watches.
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer conn.Release()
	q := admindb.New()
	var s snapshot
	if s.advisory, err = q.AdminAdvisoryStats(ctx, conn); err != nil {
		return nil, err
	}
	if s.leases, err = q.AdminLeaseTotals(ctx, conn); err != nil {
		return nil, err
	}
	if s.groups, err = q.AdminLeaseGroups(ctx, conn, int32(topN)); err != nil {
		return nil, err
	}
	if s.tokens, err = q.AdminTopLeaseTokens(ctx, conn, int32(topN)); err != nil {
		return nil, err
	}
	if s.lockTable, err = q.LockTableUsage(ctx, conn); err != nil {
		return nil, err
	}
	if s.events, err = q.AdminEventCounts(ctx, conn); err != nil {
		return nil, err
	}
	if s.grace, err = q.FailoverGrace(ctx, conn); err != nil {
		return nil, err
	}
	return &s, nil
}

// collector reads the database when the registry gathers, within the
// scrape request's context.
type collector struct {
	s   *Server
	ctx context.Context
}

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.s.metrics.all() {
		ch <- d
	}
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	m := c.s.metrics
	gauge := func(d *prometheus.Desc, v int64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, float64(v), labels...)
	}
	ch <- prometheus.MustNewConstMetric(m.buildInfo, prometheus.GaugeValue, 1, c.s.cfg.Version, c.s.cfg.Revision, runtime.Version())
	ctx, cancel := context.WithTimeout(c.ctx, c.s.cfg.QueryTimeout)
	defer cancel()
	start := time.Now()
	snap, err := readSnapshot(ctx, c.s.pool, c.s.cfg.TopN)
	ch <- prometheus.MustNewConstMetric(m.scrapeSeconds, prometheus.GaugeValue, time.Since(start).Seconds())
	if err != nil {
		c.s.cfg.Logger.Warn("pgbaton admin: metrics scrape failed", "error", err)
		gauge(m.up, 0)
		return
	}
	gauge(m.up, 1)
	gauge(m.advisoryHeld, snap.advisory.Held)
	gauge(m.advisoryWaiters, snap.advisory.Waiting)
	gauge(m.advisoryContended, snap.advisory.Contended)
	gauge(m.advisorySessions, snap.advisory.Sessions)
	gauge(m.leases, snap.leases.Held, "held")
	gauge(m.leases, snap.leases.Expired, "expired")
	gauge(m.leases, snap.leases.Free, "free")
	gauge(m.leaseTokenMax, snap.leases.MaxToken)
	for _, g := range snap.groups {
		gauge(m.groupLeases, g.Held, g.LeaseGroup, "held")
		gauge(m.groupLeases, g.Expired, g.LeaseGroup, "expired")
		gauge(m.groupTokenMax, g.MaxToken, g.LeaseGroup)
	}
	for _, t := range snap.tokens {
		gauge(m.leaseToken, t.Token, t.Name, t.LeaseGroup)
	}
	gauge(m.lockTableUsed, snap.lockTable.Used)
	gauge(m.lockTableAdvisory, snap.lockTable.Advisory)
	gauge(m.lockTableCapacity, snap.lockTable.Capacity)
	// Rows of an append-only log: a counter (reset only if somebody
	// deletes audit rows, which Prometheus' rate() takes as a reset).
	for _, e := range snap.events {
		ch <- prometheus.MustNewConstMetric(m.auditEvents, prometheus.CounterValue, float64(e.Events), e.Action)
	}
	enabled := int64(0)
	if snap.grace.Enabled {
		enabled = 1
	}
	gauge(m.graceEnabled, enabled)
	ch <- prometheus.MustNewConstMetric(m.graceRemaining, prometheus.GaugeValue, snap.grace.RemainingSeconds)
}

// handleMetrics gathers a registry made for this one request, so that the
// collector's queries run under the request's context and end when the
// scraper gives up.
func (s *Server) handleMetrics(w http.ResponseWriter, r *http.Request) {
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(collector{s: s, ctx: r.Context()})
	promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}).ServeHTTP(w, r)
}

// Collector returns the gauges of /metrics as a prometheus.Collector, for
// a server that mounts the page and exposes its own registry:
// registry.MustRegister(srv.Collector()). Each Gather reads the database,
// bounded by Config.QueryTimeout.
func (s *Server) Collector() prometheus.Collector {
	return collector{s: s, ctx: context.Background()}
}
