// Package leasetable provides durable leases stored as rows of
// pgbaton.lease: an expiry by the database clock and a fencing token that
// grows with every grant.
//
//	client, err := leasetable.New(ctx, pool, leasetable.Config{TTL: 15 * time.Second})
//	defer client.Close(ctx)
//	lease, err := client.Acquire(ctx, "nightly-report") // waits; wakes on release
//	defer lease.Release(ctx)
//	// work under lease.Context(); pass lease.Token() to your writes
//
// A lease survives connection loss and failover and is visible to
// operators. Unlike an advisory lock it is not tied to a connection: a
// holder that stops renewing (crashed, paused, partitioned) loses the
// lease when its TTL runs out, and the next holder gets a strictly larger
// token. Pass the token to package fencedwrite so that writes of a stale
// holder are rejected; a lease alone only prevents wasted duplicate work.
//
// # What a lease guarantees
//
//   - Expiry is computed and compared by the database's clock
//     (clock_timestamp(), also inside a caller's long transaction).
//   - Every grant's token is larger than every earlier token of any name,
//     across failovers too (see Failover).
//   - Renew and release are guarded by (name, token): a renewal never
//     inserts or steals, and a release of a lease somebody else holds now
//     changes nothing and returns ErrNotHeld.
//   - The holder learns of a loss before anyone else can be granted the
//     lease. Each lease has a local deadline on the monotonic clock,
//     started before the request that granted or last kept it alive was
//     sent and shortened by Config.SafetyMargin; at that deadline, unless a
//     keep-alive succeeded, the lease ends: Done closes, and Err and
//     Context's cause wrap ErrLeaseLost. Err, Done and Context report the
//     loss from the instant the deadline passes.
//
// A Client keeps all its leases alive with one statement per
// Config.RenewInterval, however many it holds: every grant is bound to the
// client's lease session, a row of pgbaton.lease_session, and the database
// counts a lease valid while its own grant or its session has not
// expired. A session that expired is never revived: a client paused past
// its TTL cannot bring back leases the database already let go. An
// operator's forced release reaches the holder at the next keep-alive.
// A session with no lease and no waiter for a TTL lapses, and Close
// deletes it.
//
// # Calls by job
//
//   - one holder of a name: TryAcquire (ErrHeld, a *HeldError saying who
//     holds it), Acquire (waits), Do (runs a function under the lease),
//     Semaphore (one of n slots);
//   - several names at once, all or none, never deadlocking: AcquireAll,
//     TryAcquireAll (a LeaseSet);
//   - work items and shards: Register, Claim, ClaimWait, CompleteTx,
//     Complete, CompleteAndClaim, Keep;
//   - leader election with the token as the term: Elect, Campaign,
//     Leader;
//   - operating: Info, Check (a health.Checker), Replication,
//     FailoverGrace, Prune, Close.
//
// Job runs with fenced checkpoints and cron slots are package jobs, built
// on this one. See [Work queues], [Shards], [Leader election] and [Cron
// jobs].
//
// # Work loops
//
// Claim hands out free items (never held, released or expired) with FOR
// UPDATE SKIP LOCKED, oldest first in the order they were registered, so a
// crashed worker's items come back when their TTL runs out, ahead of items
// nobody has claimed yet. ClaimWait waits until at least one is free.
//
// The safe worker loop completes each item inside the transaction that
// holds its effects (CompleteTx): the effect and the completion commit
// together, so a worker killed at any instant leaves an item either done
// and completed or neither, and a worker whose lease was taken over cannot
// commit its effect at all (ExampleClient_CompleteTx). Complete and
// CompleteAndClaim commit separately from the effects: use them when the
// effects are idempotent or outside the database.
//
// # Cancellation and cleanup
//
//   - A call that may grant leases (TryAcquire, Acquire, AcquireAll,
//     TryAcquireAll, Claim, ClaimWait, CompleteAndClaim, Semaphore, Keep)
//     returns as soon as its context ends. If the grant was already on its
//     way, it is given back when the reply arrives: the caller either gets
//     the lease or holds nothing.
//   - Release, Complete and Close give leases back even when their context
//     has ended, on a context of their own bounded by Config.ReleaseTimeout.
//     A release that cannot reach the database is tried again by Close,
//     whose error names the leases it could not give back (they expire at
//     their TTL).
//   - Complete after Release, or after the lease was lost, fails with
//     ErrNotHeld: the item was not completed and will be claimed again.
//     Completing twice, or releasing after completing, returns the first
//     result.
//   - Close stops everything the Client started and waits for it, except
//     the callers' own Work in Keep, which ends when the lease does (Close
//     releases it); nothing of the Client outlives Close.
//
// # Waiting
//
// Waiters (Acquire, Semaphore, Elect, ClaimWait, Keep) queue in the
// database in the order they came; pgbaton.lease_queue shows the queue
// (position, owner, time waited). A lease nobody holds goes to the oldest
// live waiter, and TryAcquire on a free lease that others wait for returns
// a *HeldError whose Ahead says how many. A release or a Register wakes as
// many waiters as leases became free, oldest first. A work queue's items
// go to whoever claims first (Claim does not wait its turn): throughput
// comes first there. A waiter is bound to its Client's session, so one
// whose process died leaves the queue when its session expires; one that
// gives up is removed in the background and hands its turn on (a removal
// that fails is tried again after each keep-alive). A wait whose context
// has a deadline leaves the queue itself shortly before it (twice its
// last look, at least 20 ms, at most a quarter of the wait) and looks no
// more: what it could be granted then would come back too late to use, so
// when the call returns its place is gone already. A look that fails on
// a broken connection, in a failover, or because the server did not
// answer within the TTL does not end a wait: it is made again, with
// backoff, until the wait's context ends.
//
// Waiters wake through one LISTEN connection per Client (application_name
// "pgbaton lease listener <owner>"), held only while a listen slot is free
// (Config.ListenSlots), and at the holder's known expiry. Clients that
// poll (NoListen, no free slot, a transaction pooler) keep their place in
// the queue and find out at their next look that their turn came. Behind
// a transaction pooler Check reports the degraded mode
// (pgbaton.ErrDegraded; see Config.ListenDSN). [Running in production]
// says when a client listens and how often a poller looks.
//
// # The database's clock
//
// Local deadlines come before the database's expiry as long as the
// database's wall clock moves no faster than the client's monotonic clock,
// less SafetyMargin over a TTL. A forward step of the database's clock
// larger than SafetyMargin is seen at the next keep-alive: the leases the
// database may have let go are lost at once, with a cause wrapping
// ErrLeaseLost and ErrClockStep (metric cause CauseClockStep), and the
// step is logged and counted. Until then, at most RenewInterval plus a
// keep-alive's round trip, another client may hold a lease its holder
// still counts as held: pass tokens to fenced writes. A step back never
// lengthens a holder's hold. See [Safety].
//
// # Failover
//
// Leases are rows, so they survive a failover that loses no commit. A
// token is epoch * 2^40 + a sequence value, and the epoch grows on a new
// timeline, so tokens never go backwards; fenced writes compare them as
// plain int64s. A grant commits with at least synchronous_commit = local.
// With asynchronous standbys a grant acknowledged just
// before a failover can be lost while its holder works on, so a new
// timeline grants nothing until the longest TTL in use has passed: the
// failover grace. During it TryAcquire returns a *HeldError with Grace set
// and ExpiresAt the grace's end, Acquire, Elect, Campaign and Semaphore
// wait through it, and Claim returns nothing; renewals, keep-alives and
// releases work. FailoverGraceOf and Client.FailoverGrace show it; an
// operator turns it off with SELECT pgbaton.set_failover_grace(false,
// 'reason'). New and Check log a warning when no standby is synchronous
// (Client.Replication: ErrNoSyncStandby). See [Running in production].
//
// # Lock-delay
//
// For resources that cannot check a fencing token, Config.LockDelay (at
// most MaxLockDelay, default none) gives the leases a client takes by name
// a lock-delay: when one is lost rather than released (it expires, its
// holder is paused or cut off past it, the database's clock steps, a
// failover loses it, an operator force-releases it without
// --clear-lock-delay), nobody is granted it before the delay has passed
// after its expiry, so the lost holder's writes in flight land first.
// Release and Complete free it at once; a Release after the loss does not.
// TryAcquire returns a *HeldError with LockDelay set and ExpiresAt the
// delay's end; Acquire waits through it. Claim, ClaimWait and semaphores
// grant without one. See [Safety].
//
// # SQL protocol, retention, metrics and logs
//
// The protocol is SQL functions in the pgbaton schema, so psql or any
// other client can take part ([SQL protocol]). The rows of this package's
// tables that pile up with use are pruned in the background by one Client
// at a time (Config.Retention, Prune). Config.MeterProvider and
// Config.Logger (log/slog) get metrics, losses, reconnects and refusals,
// and Config.TracerProvider a span per call that waits or touches the
// database and per keep-alive ([Operating] lists them).
//
// [Work queues]: https://github.com/pgbaton/pgbaton/blob/main/docs/work-queues.md
// [Shards]: https://github.com/pgbaton/pgbaton/blob/main/docs/shards.md
// [Leader election]: https://github.com/pgbaton/pgbaton/blob/main/docs/leader-election.md
// [Cron jobs]: https://github.com/pgbaton/pgbaton/blob/main/docs/cron-jobs.md
// [Safety]: https://github.com/pgbaton/pgbaton/blob/main/docs/safety.md
// [Running in production]: https://github.com/pgbaton/pgbaton/blob/main/docs/production.md
// [SQL protocol]: https://github.com/pgbaton/pgbaton/blob/main/docs/sql-protocol.md
// [Operating]: https://github.com/pgbaton/pgbaton/blob/main/docs/operating.md
package leasetable
