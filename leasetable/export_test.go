package leasetable

import (
	"testing"
	"time"
)

// SetSlotKeep makes the clients that t creates from now on keep their
// listen slot for d after their last waiter left, until t ends.
func SetSlotKeep(t testing.TB, d time.Duration) {
	old := slotKeep
	slotKeep = d
	t.Cleanup(func() { slotKeep = old })
}

// SetCloseGrace sets how long a closing listener lets its statement in
// flight run, and calls stopped when a listener is told to stop, until t
// ends.
func SetCloseGrace(t testing.TB, d time.Duration, stopped func()) {
	oldGrace, oldStopped := closeGrace, listenerStopped
	closeGrace, listenerStopped = d, stopped
	t.Cleanup(func() { closeGrace, listenerStopped = oldGrace, oldStopped })
}

// ListenerWaiters counts the wake-up channels subscribed to c's listener,
// for tests that check a wait leaves none behind.
func ListenerWaiters(c *Client) int {
	n := 0
	c.ln.do(func() { n = len(c.ln.waiters) })
	return n
}
