// Package advisory takes PostgreSQL advisory locks the way a distributed
// lock needs them: on connections pgbaton owns, shared by many locks,
// watched for loss, and released when the holder dies.
//
//	locker, err := advisory.New(pool, advisory.Config{})
//	lk, err := locker.TryLock(ctx, advisory.Name("job:daily-export"))
//	if errors.Is(err, advisory.ErrLocked) { return nil } // another node runs it
//	defer lk.Unlock(ctx)
//	// work, watching lk.Done()
//
// # What a Locker guarantees
//
// A Locker (New) holds its locks on session connections taken out of the
// caller's pgxpool for good, so pool lifetime limits never drop them. Many
// locks share one session, up to Config.MaxLocksPerSession; Postgres
// advisory locks are re-entrant within a session, so the Locker's own
// bookkeeping keeps two goroutines from both holding a key. A lock is held
// exactly as long as its session lives: when the holder's process dies,
// the server frees it at once.
//
// TryLock and TryRLock return ErrLocked when the key is held elsewhere.
// Lock and RLock wait on a connection of their own, so a wait never holds
// up the shared session; when the caller's context ends the wait is
// cancelled on the server and nothing is left locked, even if the grant
// raced the cancel. Unlock gives the key back; the Lock's context then ends
// with ErrUnlocked. RunExclusive runs a function under a lock (skip-if-held
// or wait) and unlocks on every path, panics included. Elect and Campaign
// build leader election on an exclusive lock.
//
// Connections used for locks carry the application_name "pgbaton advisory
// <Config.Owner>" (host:pid by default), so pg_stat_activity and `pgbaton
// locks` show which process holds which lock. How many connections a
// Locker uses is in [Running in production].
//
// # Cron jobs
//
// A skip-if-held lock (TryLock, RunExclusive with the zero RunOptions)
// keeps two nodes from running a job at the same moment. It does not give
// one run per scheduled time: nodes whose tickers fire at different
// moments each find the lock free once the earlier run has ended, and run
// the slot again. For one run per slot, claim the slot with
// jobs.ClaimSlot; take an advisory lock inside it only if runs must also
// never overlap. Package gocronlock does both for gocron. See [Cron jobs].
//
// # Keys
//
// Name("…") hashes a string to a bigint key: the first 8 bytes of SHA-256
// over the UTF-8 name (or "namespace/name" with Config.Namespace), read as
// a big-endian signed integer. From SQL the same key is
// pgbaton.advisory_key(name, namespace), so psql or a SQL job can take the
// same lock:
//
//	SELECT pg_try_advisory_lock(pgbaton.advisory_key('job:daily-export'));
//
// Every name locked through a Locker is recorded in pgbaton.advisory_name,
// so tools show names instead of numbers; a second name with the same key
// is refused with ErrKeyCollision before anything is locked. Int64 and
// Pair keys are taken as given (Pair uses Postgres's separate int4-pair
// key space) and need no pgbaton schema.
//
// # Transaction-scoped locks
//
// XactTryLock, XactLock, XactTryRLock and XactRLock take
// pg_advisory_xact_lock in the caller's transaction: a pgx.Tx, or a
// database/sql *sql.Tx wrapped by databasesql.Wrap. The lock is released
// when the transaction commits or rolls back; a holder that dies takes its
// transaction, and the lock, with it. Every statement runs in the caller's
// transaction, none on another connection, so they work with a pool of
// one connection and behind PgBouncer transaction pooling. On a standby
// they return pgbaton.ErrStandby and lock nothing.
//
// A Name is recorded in the same transaction (only under an exclusive
// lock in a read-write transaction; a transaction that rolls back records
// nothing). ErrLocked, pgbaton.ErrStandby and ErrKeyCollision leave the
// transaction as it was: nothing was locked and it can go on. Any other
// error comes from a failed statement (the wait cancelled when ctx ended,
// the lock table full, pgbaton.ErrNotMigrated without the schema) and, as
// after any failed statement, the transaction is aborted: roll it back.
//
// # Lock sets
//
// LockAll and TryLockAll take the exclusive locks on several keys, every
// one or none (a LockSet; its Context ends with its first lock), and
// XactLockAll and XactTryLockAll the same in the caller's transaction.
// Every set is taken in one order, whatever order its keys are given in:
// bigint keys (Name, Int64) first by the bigint Postgres sees, then pairs
// by (hi, lo). So sets that share keys never wait for each other in a
// cycle, which Postgres's deadlock detector would not see: a Locker's
// waits run on connections of their own, apart from the sessions that
// hold its locks. A set that fails gives back what it took before it
// returns: the session locks are unlocked, and a transaction is rolled
// back to a savepoint taken before the set, so it holds none of it and
// can go on.
//
// # Loss
//
// Each session is pinged when it was idle for Config.PingInterval, and
// every round trip is bounded by Config.PingTimeout. When a round trip
// fails or times out, every Lock on the session ends (Done, Err, Context)
// with ErrLockLost; a Lock asked after more than PingInterval +
// PingTimeout without an answer reports the loss too, so a process that
// stalled learns it when it resumes. A server that ends an idle session
// (pg_terminate_backend, a shutdown, a switchover) is noticed at once; a
// host or network that goes silent is noticed at the next ping.
//
// Let g = PingInterval + PingTimeout (3s by default). The client declares
// its locks lost at most g after the server last heard from it, and each
// session sets its backend's TCP keepalives and tcp_user_timeout (2g + 1s)
// so that the server drops a silent client, and grants its locks to
// someone else, only after that. Over a unix socket these settings do not
// apply and are not needed. This relies on the client's monotonic clock
// and on the code holding the lock stopping when Done is closed. A paused
// process (GC, SIGSTOP) keeps its lock while paused and reports the loss
// when it resumes: work that must never overlap under any pause needs
// fencing tokens (packages leasetable and fencedwrite). The argument in
// full is in [Safety].
//
// # Unsafe setups
//
// Every connection a Locker takes is checked before anything is set or
// locked on it:
//
//   - a server in recovery: pgbaton.ErrStandby;
//   - a server that only looks like PostgreSQL (CockroachDB, whose
//     pg_advisory_lock locks nothing, and YugabyteDB):
//     pgbaton.ErrUnsupportedServer;
//   - a pooler in between, recognised by the cancel key it makes up (a
//     direct connection's is the backend's own): ErrSessionPooling, on
//     every attempt, whatever the pool size or traffic. Use XactLock or
//     package leasetable behind a transaction pooler; set
//     Config.SessionPooler for a pooler that runs in session mode. A
//     connection counts as direct only when its cancel key is the
//     backend's and the server sees this very socket; through anything
//     else (a TCP proxy, NAT, a declared session pooler) the backend must
//     hold no advisory locks yet, the session's statements must stay on
//     one backend, and a second connection must not be served by it. A
//     statement that still lands on another backend locks and unlocks
//     nothing there, so two Lockers can never hold one key through one
//     shared backend;
//   - a full lock table (SQLSTATE 53200), or more than Config.MaxLocks locks
//     held by this Locker: ErrLockTableFull.
//
// Refusals are logged to Config.Logger (Error; Warn for a full lock table)
// as well as returned. Which setups work is in [Running in production].
//
// # Metrics and logs
//
// With Config.MeterProvider set, a Locker records these OpenTelemetry
// instruments, which package leasetable records too, with attribute
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
// wait that ended before the lock was granted). The lock name is the
// attribute pgbaton.name (the decimal key for Int64, "hi,lo" for Pair)
// only with Config.MetricNames, as names per work item would make the
// number of series unbounded. Without a MeterProvider nothing is recorded
// and the lock path does no extra work.
//
// With Config.TracerProvider set, each TryLock, Lock, TryRLock and RLock
// is a span "pgbaton.advisory.lock" under the caller's, waits included,
// with db.system.name = postgresql, pgbaton.layer, pgbaton.name (always:
// a span is not a series), pgbaton.owner, pgbaton.mode, pgbaton.wait,
// pgbaton.wait.seconds and pgbaton.outcome = acquired | held | error (and
// error.type with the error recorded). Without one no span is started
// and the lock path allocates nothing for it.
//
// Config.Logger (log/slog, silent by default) gets a Warn for each lost
// session with the number of locks it took with it, an Info when a
// session opens again after a loss, Error or Warn for refusals, and Debug
// for sessions opened and closed. Locker.Check is a health.Checker for
// readiness probes (package health). Metrics and dashboards are in
// [Operating].
//
// [Cron jobs]: https://github.com/pgbaton/pgbaton/blob/main/docs/cron-jobs.md
// [Running in production]: https://github.com/pgbaton/pgbaton/blob/main/docs/production.md
// [Safety]: https://github.com/pgbaton/pgbaton/blob/main/docs/safety.md
// [Operating]: https://github.com/pgbaton/pgbaton/blob/main/docs/operating.md
package advisory
