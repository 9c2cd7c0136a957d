package leasetable

import (
	"testing"
	"time"

	"github.com/pgbaton/pgbaton/internal/backoff"
	"github.com/pgbaton/pgbaton/internal/leaseset"
	"github.com/pgbaton/pgbaton/internal/listener"
)

// SetSlotKeep makes the clients that t creates from now on keep their
// listen slot for d after their last waiter left, until t ends.
func SetSlotKeep(t testing.TB, d time.Duration) {
	old := listener.SlotKeep
	listener.SlotKeep = d
	t.Cleanup(func() { listener.SlotKeep = old })
}

// SetCloseGrace sets how long a closing listener lets its statement in
// flight run, and calls stopped when a listener is told to stop, until t
// ends.
func SetCloseGrace(t testing.TB, d time.Duration, stopped func()) {
	oldGrace, oldStopped := listener.CloseGrace, listener.Stopped
	listener.CloseGrace, listener.Stopped = d, stopped
	t.Cleanup(func() { listener.CloseGrace, listener.Stopped = oldGrace, oldStopped })
}

// SetListenOpened makes the clients that t creates from now on call
// opened when a LISTEN connection of theirs has been opened, before its
// first statement, until t ends.
func SetListenOpened(t testing.TB, opened func()) {
	old := listener.Opened
	listener.Opened = opened
	t.Cleanup(func() { listener.Opened = old })
}

// SetListenReadyWait makes the waiters of the clients that t creates from
// now on wait up to d for their LISTEN connection before they poll
// instead, until t ends.
func SetListenReadyWait(t testing.TB, d time.Duration) {
	old := listener.ReadyWait
	listener.ReadyWait = d
	t.Cleanup(func() { listener.ReadyWait = old })
}

// SetListenRetry makes the clients that t creates from now on wait from
// lo, doubling up to hi, between reconnections of their LISTEN connection
// unless a waiter kicks it, until t ends.
func SetListenRetry(t testing.TB, lo, hi time.Duration) {
	old := listener.Retry
	listener.Retry = backoff.Backoff{Min: lo, Max: hi}
	t.Cleanup(func() { listener.Retry = old })
}

// ListenerStarted reports whether c's listener runs.
func ListenerStarted(c *Client) bool {
	started, _, _ := c.ln.State()
	return started
}

// ListenerIdle reports whether c's listener has a connection that does
// not listen as nobody waits (paused).
func ListenerIdle(c *Client) bool {
	_, idle, _ := c.ln.State()
	return idle
}

// ListenerWaiters counts the wake-up channels subscribed to c's listener,
// for tests that check a wait leaves none behind.
func ListenerWaiters(c *Client) int {
	_, _, n := c.ln.State()
	return n
}

// SetSessionTaken has the clients that t creates from now on call taken
// after each grant took its session and before the grant is sent, until t
// ends.
func SetSessionTaken(t testing.TB, taken func()) {
	old := sessionTaken
	sessionTaken = taken
	t.Cleanup(func() { sessionTaken = old })
}

// SetUndeliveredRetry makes the clients that t creates from now on prove
// again a LISTEN connection found not to deliver, at the next wait d after
// that, until t ends.
func SetUndeliveredRetry(t testing.TB, d time.Duration) {
	old := listener.UndeliveredRetry
	listener.UndeliveredRetry = d
	t.Cleanup(func() { listener.UndeliveredRetry = old })
}

// CombinedQueued counts the CompleteAndClaim calls of c queued for group,
// waiting for a round trip.
func CombinedQueued(c *Client, group string) (n int) {
	c.k.Ask(func(k *keeper) { n = k.cc.Pending(group) })
	return n
}

// KeeperHeld counts the leases c's keeper keeps for its session, ended
// ones it has not dropped yet included.
func KeeperHeld(c *Client) (n int) {
	c.k.Ask(func(k *keeper) { n = k.leases.Carried() })
	return n
}

// KeeperPruneMin is how many leases the keeper keeps, ended ones
// included, before it drops the ended ones.
const KeeperPruneMin = leaseset.PruneMin

// SetLeaveMargin sets the least time before its deadline at which a wait
// leaves the queue (listener.LeaveMargin), until t ends.
func SetLeaveMargin(t testing.TB, d time.Duration) {
	old := listener.LeaveMarginMin
	listener.LeaveMarginMin = d
	t.Cleanup(func() { listener.LeaveMarginMin = old })
}
