// Package advisory takes PostgreSQL advisory locks the way a distributed
// lock needs them: on connections pgbaton owns, shared by many locks,
// watched for loss, and released when the holder dies.
//
// A Locker (New) keeps a few session connections, taken out of the
// caller's pgxpool for good so that pool lifetime limits never drop them.
// Many locks share one session; because Postgres advisory locks are
// re-entrant within a session, the Locker's own bookkeeping keeps two
// goroutines from both holding a key. Calls on one session share its
// round trips: what is queued goes as one batch, and the next batches go
// on the wire while earlier ones are answered (so eight goroutines on one
// session outrun eight connections of their own). An idle session is
// pinged; when its connection fails, every pending call gets the cause
// and every lock on the session is cancelled. Under heavier load (16 requests pending on every
// session) new locks go to a second session (Config.MaxSessionsUnderLoad,
// default 2), which then stays open. Past Config.MaxLocksPerSession locks
// a session is full and another one opens.
//
//	locker, err := advisory.New(pool, advisory.Config{})
//	lk, err := locker.TryLock(ctx, advisory.Name("job:daily-export"))
//	if errors.Is(err, advisory.ErrLocked) { return nil } // another node runs it
//	defer lk.Unlock(ctx)
//	// work, watching lk.Done()
//
// Lock and RLock wait on a session of their own, so a wait never holds up
// the shared session: the session's goroutine runs the blocking
// pg_advisory_lock, and the lock, once granted, is held on that session.
// When the caller's context ends the wait is cancelled on the server, and
// because Postgres may grant the lock just as the cancel arrives, the
// waiting session releases whatever it holds before its connection is
// closed. Sessions that fall idle are kept (two at most, goroutine and
// all, pinging and watching their connection like any session) for the
// next waits, so a contended lock neither opens a backend nor starts a
// session per wait; a Lock that finds such a session waits on it straight
// away (granted in one round trip if the key is free), as a plain
// pg_advisory_lock would.
//
// On a direct connection (see Unsafe setups) sessions call the lock
// functions by the protocol's fast-path function call, which the backend
// runs without a parse, a plan or an executor (see the README's Speed
// section); through a pooler or proxy they run prepared statements that
// carry the token described below.
//
// Every connection a Locker holds locks on carries the application_name
// "pgbaton advisory <Config.Owner>" (host:pid by default), so
// pg_stat_activity and `pgbaton locks` show which process holds which
// lock.
//
// RunExclusive runs a function under a lock (skip-if-held or wait) and
// unlocks on every path. Elect and Campaign build leader election on an
// exclusive lock. XactTryLock and XactLock take transaction-scoped locks
// in the caller's transaction (a pgx.Tx, or a *sql.Tx through
// databasesql.Wrap), which also work behind PgBouncer transaction pooling.
//
// # Cron jobs
//
// A skip-if-held lock (TryLock, RunExclusive with the zero RunOptions)
// gives mutual exclusion: no two nodes run the job at the same moment. It
// does not give one run per scheduled time. Nodes whose tickers fire at
// different moments (clock skew, start times, a GC pause, a loaded
// machine) each find the lock free once the earlier node's run has ended,
// and each run the same slot again: three nodes whose tickers fire a few
// hundred milliseconds apart run a short job about three times per slot.
// For a job that must run once per slot, claim the slot with
// jobs.ClaimSlot(ctx, client, job, scheduledAt), passing the nominal
// time of the slot (the tick truncated to the schedule), which is true
// for exactly one caller per (job, slot) however skewed the tickers; take
// an advisory lock inside it only if runs of one job must also never
// overlap. Package gocronlock does both for gocron schedulers.
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
// pgbaton.advisory_name (by transaction-scoped locks in the caller's
// transaction, see below), so tools can show names instead of numbers; a
// second name with the same key is refused with ErrKeyCollision. Int64 and
// Pair keys are taken as given (Pair uses Postgres's separate int4-pair
// key space) and need no pgbaton schema.
//
// # Transaction-scoped locks
//
// XactTryLock, XactLock, XactTryRLock and XactRLock take
// pg_advisory_xact_lock in the caller's transaction: a pgx.Tx, or a
// database/sql *sql.Tx wrapped by databasesql.Wrap. The lock is released when
// the transaction commits or rolls back; there is no session to watch,
// and a holder that dies takes its transaction, and the lock, with it.
// Every statement runs in the caller's transaction, none on another
// connection, so they work with a pool of one connection and behind
// PgBouncer transaction pooling. A call is one statement, which also asks
// pg_is_in_recovery(): on a standby, whose locks would exclude nobody on
// the primary, they return pgbaton.ErrStandby and lock nothing, whatever
// the key.
//
// A Name is recorded in the same transaction. The first lock of a name by
// a Locker reads the recorded name in the statement that locks, and locks
// only if the recorded name is this one or none, so a collision
// (ErrKeyCollision) is refused before anything is locked. If none is
// recorded, a second statement inserts it — only under an exclusive lock
// in a read-write transaction, where no other transaction can be
// inserting the same name, so the insert never waits; a shared lock or a
// read-only transaction locks without recording. A transaction that rolls
// back records nothing, and a later lock records the name. Once a Locker
// has read the name back as recorded, each call is the one lock statement.
//
// ErrLocked (a try found the key held), ErrStandby and ErrKeyCollision
// leave the transaction as it was: nothing was locked and it can go on.
// Any other error comes from a failed statement (the wait cancelled when
// ctx ended, the lock table full, pgbaton.ErrNotMigrated without the
// schema) and, as after any failed statement, the transaction is aborted:
// roll it back; its locks go with it. Recording the name is not wrapped
// in a savepoint: the only ways it can fail are a missing schema or
// privilege, which need fixing rather than working around, while a
// savepoint would cost two more round trips and a subtransaction on the
// first lock of every name.
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
// A session that has been idle for a millisecond also waits for its
// socket to become readable (in the runtime's network poller, peeking,
// consuming nothing): the server sends an idle session nothing unless it
// is ending it (FATAL then EOF, or a reset: pg_terminate_backend, a
// shutdown, a Patroni switchover, a crash). The session then pings at
// once and its Locks report the loss within microseconds instead of at
// the next ping — which matters in a switchover, where the new primary
// may grant the lock well within PingInterval. Only a silent loss (a host
// or network gone without a word) waits for the ping. Loops that lock and
// unlock in a row never start the watch.
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
// Every connection a Locker takes is probed before anything is set or
// locked on it, with one statement sent in the simple protocol (no
// prepared statement that a pooler could mix up between clients). A server
// in recovery is refused with pgbaton.ErrStandby (and so is every
// transaction-scoped lock there). A server that only
// looks like PostgreSQL is refused with pgbaton.ErrUnsupportedServer:
// CockroachDB (its pg_advisory_lock locks nothing) and YugabyteDB, told by
// the startup parameters they send and by version().
//
// A transaction-pooling proxy (PgBouncer in transaction or statement
// mode) in between would take and release session locks on whatever
// backend each statement lands on, and leave them there for other
// clients: such setups are refused with ErrSessionPooling, with the advice
// to use XactLock or package leasetable. A pooler shows itself for sure:
// the cancel key it sends at startup is its own, not the backend's pid.
// Whether it lends backends per transaction cannot be told for sure from
// a client, so a pooler is refused unless Config.SessionPooler declares
// that it runs in session mode; the refusal comes before any lock, on
// every attempt, whatever the pool size or traffic. A connection counts as
// direct only when the cancel key is the backend's and the server sees
// this very socket's address and port. Anything in between that is not
// such a pooler (a TCP proxy, NAT, a declared session pooler) is checked
// further: the backend must hold no advisory locks already, the session's
// statements must stay on one backend, and a second client connection,
// asked right after, must not be served by the session's backend
// (a transaction pooler hands out the server connection released last).
//
// After that, on a connection that is not direct, every session
// statement carries a random token that the session set on its backend
// and does nothing on a backend without it
// ("WHERE current_setting('pgbaton.session_token', true) = $token"): a
// statement that a pooler moves to another backend, or a backend that a
// pooler lent to another session since, is noticed at once and never
// locks or unlocks anything there, so two Lockers can never hold one key
// through one shared backend. (A direct connection's backend is its own
// for life: its pings check the backend's pid instead.) Locks taken
// before such a late detection are released on the session's backend if
// the pooler lets it be reached again. SQLSTATE 53200 (the server's shared lock table is full) becomes
// ErrLockTableFull, and a Locker refuses to hold more than
// Config.MaxLocks locks before that happens. Refusals are logged to
// Config.Logger (Error; Warn for a full lock table) as well as returned.
//
// # Metrics and logs
//
// With Config.MeterProvider set, a Locker records the OpenTelemetry
// instruments that package leasetable records too, with attribute
// pgbaton.layer = "advisory":
//
//	pgbaton.acquire.attempts       counter, pgbaton.result = acquired | held | error,
//	                               error.type on errors (a SQLSTATE, timeout, canceled, standby, connection, ...)
//	pgbaton.acquire.wait.duration  histogram (s, buckets 100 µs to 10 min), same attributes
//	pgbaton.held                   up-down counter of Locks held now
//	pgbaton.hold.duration          histogram (s, buckets 1 ms to 1 h), recorded at Unlock or loss
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
