package backoff

import (
	"math/rand/v2"
	"time"
)

// SlotlessPoll is how soon a waiter of a client without a listen slot
// looks again the first time; the delay doubles up to PollInterval. A
// lease held briefly, the common case in a fleet, is found free within
// tens of milliseconds; a waiter behind a long hold settles at one look
// per PollInterval.
const SlotlessPoll = 50 * time.Millisecond

// QueuePoll is how long a polling waiter for a held lease, with ahead
// waiters before it in the queue, waits before it looks again: to the
// holder's expiry (remaining), no longer than headPoll times its place in
// the queue. Only the head of the queue can be granted a lease that is
// freed, so the head looks often and those behind it less and less often:
// a queue of pollers costs the server about what two pollers at headPoll
// do, and a freed lease does not wait a whole PollInterval for its next
// holder (a fleet of 500 NoListen clients, 10 per name, PollInterval
// 100ms: 646 calls/s before the queue, 286 with it and every poller at
// PollInterval).
func QueuePoll(remaining time.Duration, ahead int, pollInterval time.Duration) time.Duration {
	return min(remaining, headPoll(pollInterval)*time.Duration(ahead+1))
}

// headPoll is how often a polling waiter at the head of its queue looks
// again: half of PollInterval, between 5 and 50ms (WaitFor caps the
// others at PollInterval). A tenth made a fleet's pollers send a third
// more statements for fewer calls (500 NoListen clients, PollInterval
// 100ms, on 2 cores: 3.4-4.3 commits per call against 2.8-3.4, and
// 0.59-0.92 of raw pgx's calls/s against 0.77-0.99). A quarter let the
// same fleet on a 2-core AMD EPYC guest fall into a state where every
// round trip was slow (the holder's Renew 119-419ms at p50 against raw
// pgx's 26-91ms): 277-1,540 calls/s over 11 processes, 121-502 errors
// in most; with a half, 963-1,849 over 6 (median 1,310, errors 0-20),
// against raw pgx's 1,306-1,967 in the 4 processes alternating with
// them (median 1,822, errors 121-184). The freed lease waits a few
// milliseconds longer for its head, and the server serves the fleet's
// calls meanwhile.
func headPoll(pollInterval time.Duration) time.Duration {
	return min(max(pollInterval/2, 5*time.Millisecond), 50*time.Millisecond)
}

// WaitFor is how long a wait for d (the time to a known expiry) lasts
// before its waiter looks again: d plus jitter, and pollInterval at most
// when no notification will come (polls; also while the LISTEN
// connection is down and reconnected: it is not ready then).
func WaitFor(d time.Duration, polls bool, pollInterval, ttl time.Duration) time.Duration {
	if polls {
		d = min(d, pollInterval)
	}
	return max(d, 0) + lookJitter(ttl)
}

// lookJitter spreads waiters that look again at the same expiry: up to
// 1% of the TTL, at least 1ms and at most 20ms.
func lookJitter(ttl time.Duration) time.Duration {
	hi := min(max(ttl/100, time.Millisecond), 20*time.Millisecond)
	return time.Millisecond + rand.N(hi)
}

// Outage paces a waiter looking again while the server is down or
// failing over.
func Outage() Backoff {
	return Backoff{Min: 50 * time.Millisecond, Max: 250 * time.Millisecond}
}
