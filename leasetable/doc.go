// Package leasetable provides durable leases stored as rows of
// pgbaton.lease: an expiry by the database clock and a fencing token that
// grows with every grant.
//
// A lease survives connection loss and failover and is visible to
// operators. Unlike an advisory lock it is not tied to a session: a holder
// that stops renewing (crashed, paused, partitioned) loses the lease when
// its TTL runs out, and the next holder gets a strictly larger token. Pass
// the token downstream (package fencedwrite) so writes of a stale holder are
// rejected; a lease alone only prevents wasted duplicate work.
//
// The protocol is SQL functions in the pgbaton schema (lease_attempt,
// try_acquire, renew, release, release_many, complete, complete_many,
// complete_tx, register, claim, wait_for, stop_waiting, and the lifeline
// functions session_open, session_keepalive, session_close), so psql or any other client can take part: a waiter
// LISTENs on channel pgbaton_lease, registers with wait_for, and looks
// again on every notification or at the holder's expiry. This package calls them and adds:
//
//   - keep-alive of all of a client's leases with one statement per
//     Config.RenewInterval, whatever it holds (a lifeline, below);
//   - a local deadline on the monotonic clock, started before the acquire,
//     renew or keep-alive was sent and shortened by Config.SafetyMargin, at
//     which the lease counts as lost unless a keep-alive succeeded: the
//     holder learns of the loss before the database lets anyone else take
//     the lease (Lease.Done, Lease.Context with cause ErrLeaseLost), and
//     of a step of the database's clock that breaks this at the next
//     keep-alive (ErrClockStep; see The database's clock);
//   - waits that wake on release (one LISTEN connection per Client, shared
//     by all waiters and named in application_name; it listens only while
//     the client has waiters, as every NOTIFY signals every listening
//     backend of the database) or at the holder's
//     known expiry; behind a transaction pooler, where notifications are
//     not delivered, waiters poll every Config.PollInterval instead (Check
//     reports it, wrapping pgbaton.ErrDegraded) unless Config.ListenDSN
//     gives a direct connection; Config.NoListen polls by choice, for
//     fleets short of connections;
//   - claiming of shards and work items (Register, Claim) with FOR UPDATE
//     SKIP LOCKED, oldest first, and waiting for them (ClaimWait: woken
//     when items are registered or released, or at an item's expiry); exactly-once effects by completing items
//     in the transaction of their effects (CompleteTx), or, for idempotent
//     effects, completing the finished batch and claiming the next in one
//     round trip and one commit (CompleteAndClaim); the
//     claim functions stay on their indexes however stale the table's
//     statistics; semaphores, leader election with terms (job runs with
//     fenced checkpoints and cron slots are package jobs, built on this
//     one);
//   - observability: OpenTelemetry metrics (Config.MeterProvider: acquire
//     attempts by result with their wait, hold durations, losses by cause,
//     renewal failures; lease names only with Config.MetricNames), log/slog
//     messages (Config.Logger) and Client.Check for readiness probes.
//
// # Where things are
//
// The Client's methods by what they are for, file by file:
//
//   - acquire: TryAcquire and Acquire (acquire.go), Do and Lease.Do (do.go),
//     Semaphore (semaphore.go);
//   - claim: Register, Claim, ClaimWait, Complete, CompleteAndClaim,
//     CompleteTx (claim.go), Keep (keep.go);
//   - elect: Elect, Campaign, Leader (election.go);
//   - operate: New, Close, Pool (client.go), Info (info.go), Check (check.go),
//     Replication (replication.go), Prune and background retention
//     (retention.go).
//
// The machinery under them: a Lease and its deadline (lease.go), the
// keep-alive lifeline (lifeline.go), waits and the LISTEN connection
// (wait.go, listener.go), giving leases back (release.go), completions in
// callers' transactions (settle.go), retries after failovers (retry.go).
//
// # Keep-alive lifelines
//
// Renewing every lease on its own would cost a statement and a commit per
// lease per interval: a client holding 10,000 leases at TTL 3s would need
// more commits than a small server can do. Instead each Client keeps one
// lifeline, a row of pgbaton.lease_session, alive — one statement per RenewInterval,
// however many leases it holds (measured: 20,000 leases at TTL 3s, one
// write transaction per second) — and binds every grant to it. The
// database counts a lease bound to a lifeline as valid while
//
//	greatest(lease.expires_at, lease_session.expires_at) > clock_timestamp()
//
// (pgbaton.lease_expiry; the view pgbaton.lease_status shows it). Why this
// is safe:
//
//   - Each lease's local deadline is the later of the send time of its
//     grant (or of its last explicit Renew) and the send time of its
//     lifeline's last successful keep-alive, plus TTL - SafetyMargin. Both
//     requests were sent before the database took the time their expiry
//     counts from, so the local deadline comes before the database's
//     expiry: the holder still learns of a loss first.
//   - A keep-alive extends only a lifeline that has not expired; it never
//     revives one. A client paused past its TTL cannot bring back leases
//     the database already let go, and opens a new lifeline for new
//     grants.
//   - While a lifeline lives, the database lets none of its leases go, so
//     nobody can take them over. The one exception, an operator's forced
//     release (pgbaton.force_release_lease), bumps the lifeline's revoked
//     counter; the next keep-alive returns it and the client ends exactly
//     the leases that were taken, in one query.
//   - When keep-alives fail or hang, every lease of the lifeline ends at its
//     own deadline — a lease granted after the last successful keep-alive
//     later than the others — and never later.
//
// # The database's clock
//
// All of the above assumes that the database's wall clock, which every
// expiry is measured by, moves no faster than the client's monotonic
// clock, less SafetyMargin over a TTL. A forward step of the database's
// clock (an NTP step, a VM resume) expires leases early in the database,
// and somebody else may be granted them while their holders' local
// deadlines have not passed. So every keep-alive compares how far the
// database's clock moved since the previous one with how far the client's
// monotonic clock did, counting the client's side from the previous send
// to this reply, so that a slow round trip never looks like a step:
//
//   - A step of up to SafetyMargin is absorbed by the margin.
//   - A larger one is seen at the next keep-alive. If that keep-alive
//     found the lifeline alive, the database let none of its leases go,
//     and they are kept; every other lease the client holds (all of them
//     when the lifeline was gone) is lost at once, with a cause wrapping
//     ErrLeaseLost and ErrClockStep (CauseClockStep). Either way the step
//     is logged and counted (pgbaton.clock.steps). Until then — at most RenewInterval plus a
//     keep-alive's round trip after the step, or while keep-alives fail,
//     until the local deadline — another client may hold a lease its
//     holder still counts as held: pass tokens to fenced writes.
//   - A step between SafetyMargin and SafetyMargin plus the round trips
//     of two keep-alives may go unnoticed; keep SafetyMargin well above
//     the round trip. A client whose own monotonic clock stood still (its
//     machine was suspended) sees the same as a step of the database's.
//   - A step back lengthens leases in the database, never a holder's
//     hold: local deadlines follow the monotonic clock, and a lease lost
//     at its deadline is given back at once. Only the lease of a holder
//     that died stays taken for as much longer as the step.
//
// Every lease keeps its own token, Done, Err, release and loss. A lifeline
// with no lease for a TTL lapses (an idle client writes nothing), and
// Close deletes it. Clients of the SQL protocol that renew leases one by
// one (try_acquire + renew) are unaffected; they may also use lifelines
// (session_open, session_keepalive, session_close, and the p_session
// argument of lease_attempt and claim).
//
// # Work loops that cannot go wrong
//
// The safe worker loop claims items and completes each one inside the
// transaction that holds its effects (CompleteTx): the effect and the
// completion commit together, so a worker killed at any instant leaves an
// item either done and completed or neither, and a worker whose lease was
// taken over cannot commit its effect at all (see ExampleClient_CompleteTx).
// Complete and CompleteAndClaim commit separately from the effects: use
// them when effects are idempotent or outside the database.
//
// Claim hands out the oldest available item first — never held, released
// or expired alike, in the order the items were registered — so a crashed
// worker's items are retried when their TTL runs out, ahead of the items
// nobody has claimed yet.
//
// Cancellation and cleanup follow what users of River and etcd's
// concurrency package expect:
//
//   - A call that may grant leases (TryAcquire, Acquire, Claim,
//     CompleteAndClaim, Semaphore, Keep) returns as soon as its context
//     ends. If the grant was already on its way, it is given back as soon
//     as the reply arrives: the caller either gets the lease or holds
//     nothing.
//   - Release, Complete and Close give leases back even when their context
//     has ended, on a context of their own bounded by Config.ReleaseTimeout.
//     A release that cannot reach the database is tried again by Close,
//     whose error names the leases it could not give back (they expire at
//     their TTL).
//   - Complete after Release, or after the lease was lost, fails with
//     ErrNotHeld: the item was not completed and will be claimed again.
//     Completing twice, or releasing after completing, returns the first
//     result.
//   - Err, Done and Context report a loss from the instant the monotonic
//     clock passes Deadline, without waiting for the deadline timer.
//
// # Goroutines
//
// What runs in the background, and what stops it. Close stops everything
// the Client started and waits for it, except the callers' own Work in
// Keep (below); nothing outlives Close.
//
//   - Per Client: the LISTEN connection's loop, started by the first
//     waiter (never with Config.NoListen), until Close; the retention
//     loop (unless Config.Retention.Disabled), until Close; a settle loop
//     while completions in callers' transactions (CompleteTx) wait to
//     learn how those ended, until none is left or Close.
//   - Per call that may grant leases (TryAcquire, each look of Acquire and
//     Semaphore, Claim, CompleteAndClaim, Keep's claims): one goroutine
//     sends the statement, so that the caller can return when its context
//     ends while the reply, when it comes, gives back what was granted
//     (none when the context can never end, such as context.Background:
//     the statement runs on the caller's goroutine). It lasts as long as
//     the statement, at most TTL; Close waits for it.
//   - Short tasks, each bounded by a timeout and cancelled by Close:
//     giving back a lost lease, grants by request id, or releases that
//     failed; ending force-released leases; removing a waiter
//     registration; deleting an idle lifeline; each Lease.OnRenew hook
//     after a keep-alive (bounded by RenewInterval).
//   - Per lifeline: no goroutine, two timers (the keep-alive every
//     RenewInterval and the local deadline); Close stops them and waits
//     for one that runs. Per Lease: no goroutine, one deadline timer,
//     stopped when the lease ends (Close ends every lease it holds).
//   - Per Keep: one goroutine per lease kept, running KeepConfig.Work;
//     Work's context ends when Keep's context does or the lease ends
//     (Close releases it), and Keep returns only after every Work has.
//   - Elect, Campaign, Do and Lease.Do start none of their own: Campaign
//     runs its callbacks on the caller's goroutine, and a Leadership is a
//     Lease.
//
// # Retention
//
// The rows of this package's tables that pile up with use (waiter
// registrations, named leases nobody uses, dead lifelines) are pruned in
// the background by one Client at a time, which holds RetentionLease while
// it deletes old rows in small batches (Config.Retention, Prune; the rules
// are pgbaton.prune's, in migrations/0105_operator.up.sql). The other tables (cron slots, job runs, the
// audit log, fenced values, advisory names, processed-message records)
// belong to the packages above or beside this one; package retention
// prunes them (retention.Run, under the same lease).
//
// # Layering
//
// leasetable imports none of the other layers (advisory, fencedwrite) nor
// the packages built on it (jobs, retention); the module's deps_test.go
// fails on an import upward. What those packages need from it is
// exported for them and kept small: Client.Pool, Lease.Do, Lease.OnRenew.
//
// Times inside the database come from clock_timestamp(), so calls made
// inside a caller's long transaction still use the current time.
//
// # Failover
//
// Leases are rows, so they survive a failover that loses no commit. A
// token is epoch * 2^40 + a sequence value (pgbaton.next_token), and the
// epoch grows on the first token drawn on a new timeline, so every token
// drawn after a promotion, a point-in-time recovery or a restore is larger
// than every token drawn before it, even when asynchronous replication
// lost the last grants; fenced writes compare them as plain int64s. A
// grant commits with at least synchronous_commit = local, so a crash never
// hands an acknowledged token out again. Waiters register again when their
// LISTEN connection comes back: a crash or a failover empties the unlogged
// table of registrations.
//
// With asynchronous standbys, grants (and keep-alives) acknowledged just
// before a failover can be lost: the lease looks free or expired on the
// new primary while its holder works on until its local deadline. So a
// new timeline grants nothing — no name, work item, semaphore slot or
// election, whether or not it was ever granted — until the longest TTL in
// use has passed since the new timeline's epoch was stored (by the first
// keep-alive, session_open or refused grant on it): the failover grace.
// By then every holder of a lost grant has reached its local deadline,
// and a holder whose lifeline reached the new primary without a later
// grant bound to it is told at its next keep-alive, which sees the epoch
// move and looks up its leases (ErrLeaseLost, cause superseded). So the
// holder learns of the loss before anyone else is granted the lease,
// across a failover too. During the grace a refused attempt is an
// ordinary "held" answer: TryAcquire returns a *HeldError with Grace set
// and Expiry the grace's end, Acquire, Elect, Campaign and Semaphore wait
// through it, Claim returns nothing; renewals, keep-alives, releases and
// forced releases work. Every timeline change imposes it (a clean
// switchover cannot be told apart from a failover); an operator turns it
// off with SELECT pgbaton.set_failover_grace(false, 'reason') where no
// failover can lose an acknowledged grant (synchronous replication with
// synchronous_commit on or remote_apply). FailoverGraceOf shows it, and
// so do pgbaton status, the admin page and its metrics. The longest TTL in
// use is the largest TTL of any grant or lifeline so far (a TTL is noted
// before its first grant is acknowledged, and never forgotten); a grant
// with a TTL longer than every one before, itself lost in the failover,
// is not covered (a Client notes its TTL when it opens its lifeline,
// before its first grant). With asynchronous standbys New and Check also
// log a warning, and Client.Replication reports it (ErrNoSyncStandby).
package leasetable
