package leasetable

// Locks and atomics of the package, in one place. Field comments point
// here; change this block with the code.
//
// Lock order: a lock may be taken while holding only locks above it.
//
//  1. Client.lineSem  serialises opening a lifeline (lifelineFor): a
//     one-slot channel, so a grant waiting for it honours its context;
//     held across the session_open round trip (until it ends, even when
//     the grant that started it gave up), takes Client.mu under it.
//  2. Lease.mu        a lease's state and its fields (state, err,
//     finishedAs, releaseErr, own, expiresAt, deadlineT, onLifeline,
//     afterRenew, grantedAt, recorded). Under it the lease binds to and
//     unbinds from its lifeline (lifeline.setMu), and transitionLocked
//     moves it between the client's sets (Client.mu, also through spawn
//     when a lost lease is given back in the background).
//  3. lifeline.mu     a lifeline's expiresAt, renewedAt, revoked, orphans,
//     idleSince, keepT, deadT, stopKeep. Under it keepalive counts the
//     bound leases (lifeline.setMu). Never held while taking a Lease.mu
//     or Client.mu.
//  4. Client.mu       closed, leases, sems, unreturned, handedOff,
//     toSettle, settling, line; also orders enter (spawn, the lifeline's
//     timers, inFlight) with Close: nothing is added to Client.background
//     after closed is set.
//  5. lifeline.setMu  the leases bound to a lifeline. A leaf: nothing is
//     taken under it.
//
// Leaves that nest with nothing: listener.mu (the LISTEN connection's
// waiters, registrations, probes and state), replicationLog.mu (the
// last replication warning logged), combiner.mu (CompleteAndClaim calls
// queued per group) and combined.mu (whether a queued call's caller gave
// up). The sync.Mutex local to each inFlight
// call orders its reply with the caller giving up.
//
// Atomics, read without a lock:
//
//   - Client.waiterSeq   numbers waiter ids.
//   - Client.returning   one returnUnreturned at a time.
//   - lifeline.deadline  the lifeline's local deadline as an offset from
//     base, so a Lease reads it under its own mu without lifeline.mu;
//     written under lifeline.mu.
//   - lifeline.state     alive, then, once and under lifeline.mu (stop),
//     dead (expired locally or gone from the database) or closed (on
//     purpose: Close, idle; a keep-alive it cancels is not a failure).
//   - lifeline.failing   the last keep-alive failed.
//   - lifeline.inflight  a keep-alive is on its way (failing is set before
//     inflight clears, so trouble never blinks).
