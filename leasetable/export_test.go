package leasetable

// ListenerWaiters counts the wake-up channels subscribed to c's listener,
// for tests that check a wait leaves none behind.
func ListenerWaiters(c *Client) int {
	c.ln.mu.Lock()
	defer c.ln.mu.Unlock()
	n := 0
	for _, set := range c.ln.waiters {
		n += len(set)
	}
	return n
}
