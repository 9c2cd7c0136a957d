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
// try_acquire, renew, release, complete, register, claim, wait_for,
// stop_waiting), so psql or any other client can take part: a waiter
// LISTENs on channel pgbaton_lease, registers with wait_for, and looks
// again on every notification or at the holder's expiry. This package calls them and adds:
//
//   - automatic renewal at Config.RenewInterval with retries;
//   - a local deadline on the monotonic clock, started before the acquire
//     or renew was sent and shortened by Config.SafetyMargin, at which the
//     lease counts as lost unless a renewal succeeded: the holder learns of
//     the loss before the database lets anyone else take the lease
//     (Lease.Done, Lease.Context with cause ErrLeaseLost);
//   - waits that wake on release (one LISTEN connection per Client, shared
//     by all waiters) or at the holder's known expiry, never by polling;
//   - claiming of shards and work items (Register, Claim) with FOR UPDATE
//     SKIP LOCKED; a worker's loop completes the finished batch and claims
//     the next in one round trip and one commit (CompleteAndClaim); the
//     claim functions stay on their indexes however stale the table's
//     statistics; semaphores, leader election with terms, job runs with
//     checkpoints fenced in pgbaton.fenced_value (package fencedwrite), and
//     cron slots claimed once across nodes;
//   - observability: OpenTelemetry metrics (Config.MeterProvider: acquire
//     attempts by result with their wait, hold durations, losses by cause,
//     renewal failures; lease names only with Config.MetricNames), log/slog
//     messages (Config.Logger) and Client.Check for readiness probes.
//
// Times inside the database come from clock_timestamp(), so calls made
// inside a caller's long transaction still use the current time.
package leasetable
