// Package advisory takes PostgreSQL advisory locks the way a distributed
// lock needs them: on connections pgbaton owns, shared by many locks,
// watched for loss, and released when the holder dies.
//
// A Locker (New) keeps a few session connections, taken out of the
// caller's pgxpool for good so that pool lifetime limits never drop them.
// Many locks share one session; because Postgres advisory locks are
// re-entrant within a session, the Locker's own bookkeeping keeps two
// goroutines from both holding a key. Lock and unlock requests on a
// session are pipelined: requests queued together go in one batch, and a
// batch is sent while earlier ones are still on the wire, so eight
// goroutines on one session outrun eight connections of their own. Under
// heavier load (16 requests pending on every session) new locks go to a
// second session (Config.MaxSessionsUnderLoad, default 2), which then
// stays open. Past Config.MaxLocksPerSession locks a session is full and
// another one opens.
//
//	locker, err := advisory.New(pool, advisory.Config{})
//	lk, err := locker.TryLock(ctx, advisory.Name("job:daily-export"))
//	if errors.Is(err, advisory.ErrLocked) { return nil } // another node runs it
//	defer lk.Unlock(ctx)
//	// work, watching lk.Done()
//
// Lock and RLock wait on a connection of their own, so a wait never holds
// up the shared session. When the caller's context ends the wait is
// cancelled on the server, and because Postgres may grant the lock just as
// the cancel arrives, the waiting connection releases whatever it holds
// before it is closed. A granted wait's connection becomes a session, and
// the connections of sessions that fall idle are kept (two at most) for
// the next waits, so a contended lock does not open a backend per wait.
//
// RunExclusive runs a function under a lock (skip-if-held or wait) and
// unlocks on every path. Elect and Campaign build leader election on an
// exclusive lock. XactTryLock and XactLock take transaction-scoped locks
// in the caller's pgx.Tx, which also work behind PgBouncer transaction
// pooling.
//
// # Keys
//
// Name("…") hashes a string to a bigint key: the first 8 bytes of SHA-256
// over the UTF-8 name (or "namespace/name" with Config.Namespace), read as
// a big-endian signed integer. From SQL the same key is
// pgbaton.advisory_key(name, namespace), so a psql session or a cron job
// in SQL can take the same lock:
//
//	SELECT pg_try_advisory_lock(pgbaton.advisory_key('job:daily-export'));
//
// Every name locked through a Locker is recorded once per Locker in
// pgbaton.advisory_name, so tools can show names instead of numbers; a
// second name with the same key is refused with ErrKeyCollision. Int64 and
// Pair keys are taken as given (Pair uses Postgres's separate int4-pair
// key space) and need no pgbaton schema.
//
// # Loss
//
// A session lock is held exactly as long as its session lives. Each
// session is pinged when it was idle for Config.PingInterval, and every
// round trip is bounded by Config.PingTimeout; when a round trip fails or
// times out, every Lock on the session is cancelled (Done, Err, Context)
// with ErrLockLost. The same holds when the process itself stalled: a
// Lock asked after more than PingInterval + PingTimeout without an answer
// reports the loss. New work opens a new session.
//
// The timing argument. Let g = PingInterval + PingTimeout (3s by default).
// The client declares a session lost at most g after the last moment the
// server demonstrably heard from it (the send time of the last answered
// round trip). The server, in turn, must not drop the session (and grant
// its locks to someone else) before that. Each session therefore sets,
// for its own backend:
//
//	tcp_keepalives_idle     = ceil(g + 1s)    seconds of silence before probing
//	tcp_keepalives_interval = 1s
//	tcp_keepalives_count    = enough probes to reach tcp_user_timeout
//	tcp_user_timeout        = 2g + 1s         unacknowledged data or probes before the drop
//
// A silently partitioned client (no FIN, no RST) is pinged by no one: its
// backend first probes after g + 1s of silence and drops the connection
// only after 2g + 1s, by which time the client has been reporting the loss
// for g + 1s. If the partition is one-way and the client's pings still
// reach the server, the server's answers go unacknowledged and
// tcp_user_timeout (2g + 1s from the first unanswered one, which is later
// than the client's last answer) drops it — again after the client gave
// up. A crashed client host is the same as a partition; a crashed client
// process closes its sockets and its locks are freed at once, which is
// the point of session locks. Over a unix socket these settings do not
// apply and are not needed: the peer is on the same host.
//
// The client's side of this relies on its monotonic clock and on the code
// holding the lock stopping when Done is closed. A process that is paused
// (GC, SIGSTOP) keeps its TCP connection alive through its kernel and
// therefore keeps the lock: nobody else is granted it while paused, and
// when it resumes its Locks report the loss if it was paused longer than
// g. Work that must never overlap under any pause needs fencing tokens
// (packages leasetable and fencedwrite), not just a lock.
//
// # Unsafe setups
//
// A session that finds the server in recovery fails with pgbaton.ErrStandby.
// A transaction-pooling proxy (PgBouncer) in between would take and
// release session locks on whatever backend each statement lands on, and
// leave them there for other clients: ErrSessionPooling, with the advice
// to use XactLock or package leasetable. It is detected three ways: the
// backend pid changes between the two statements that set a session up; a
// second client connection from the pool is served by the session's
// backend (only a pooler shares a backend between connections); and every
// later session statement carries the session's pid and does nothing on
// any other backend ("WHERE pg_backend_pid() = $pid"), so a move is
// noticed at once and never locks or unlocks on a backend other clients
// use. Locks taken before a late detection are released on the session's
// backend if the pooler lets it be reached again. SQLSTATE 53200 (the server's shared lock
// table is full) becomes ErrLockTableFull, and a Locker refuses to hold
// more than Config.MaxLocks locks before that happens. Refusals are
// logged to Config.Logger (Error; Warn for a full lock table) as well as
// returned.
//
// # Metrics and logs
//
// With Config.MeterProvider set, a Locker records the OpenTelemetry
// instruments that package leasetable records too, with attribute
// pgbaton.layer = "advisory":
//
//	pgbaton.acquire.attempts       counter, pgbaton.result = acquired | held | error
//	pgbaton.acquire.wait.duration  histogram (s), same attributes
//	pgbaton.held                   up-down counter of Locks held now
//	pgbaton.hold.duration          histogram (s), recorded at Unlock or loss
//	pgbaton.lost                   counter, pgbaton.cause = session | pooling | closed
//	pgbaton.renew.failures         counter: session pings that failed
//	pgbaton.sessions               up-down counter of session connections
//
// Every TryLock, Lock, TryRLock and RLock (and so RunExclusive, Elect and
// Campaign) is one attempt, except calls refused for bad input or a
// closed Locker: held means the key was held elsewhere (ErrLocked, or a
// wait that ended before the lock was granted). Locks per session is
// pgbaton.held / pgbaton.sessions. The lock name is an attribute
// (pgbaton.name; the decimal key for Int64, "hi,lo" for Pair) only with
// Config.MetricNames, as names per work item would make the number of
// series unbounded. Without a MeterProvider nothing is recorded and the
// lock path does no extra work.
//
// Config.Logger (log/slog, silent by default) gets a Warn for each lost
// session with the number of locks it took with it, an Info when a
// session opens again after a loss, Error or Warn for refusals, and Debug
// for sessions opened and closed. Locker.Check is a health.Checker for
// readiness probes (package health).
package advisory
