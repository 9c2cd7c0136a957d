package hacluster

import (
	"context"
	"fmt"
	"syscall"
	"time"
)

// KillNode kills node's Patroni, its postmaster and every child of the
// postmaster with SIGKILL, all at the same instant (they are frozen
// first): the node dies as a machine that loses power. Its clients' TCP
// connections are closed by the kernel. StartNode brings it back.
func (c *Cluster) KillNode(name string) error {
	n := c.Node(name)
	if n == nil {
		return fmt.Errorf("hacluster: no node %q", name)
	}
	n.mu.Lock()
	cmd, exited := n.cmd, n.exited
	n.mu.Unlock()
	var pids []int
	if cmd != nil {
		pids = append(pids, cmd.Process.Pid)
		// Patroni's helpers (pg_basebackup, pg_rewind) share its group.
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGSTOP)
	}
	if pm := n.postmaster(); pm != 0 {
		_ = syscall.Kill(pm, syscall.SIGSTOP) // forks no more children
		pids = append(pids, pm)
		pids = append(pids, children(pm)...)
	}
	killAll(pids)
	if cmd != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			return fmt.Errorf("hacluster: patroni of %s did not die", name)
		}
		n.mu.Lock()
		n.cmd = nil
		n.mu.Unlock()
	}
	return waitGone(pids, 10*time.Second)
}

// KillPostgres kills node's postmaster and all its children with SIGKILL
// (a crash of PostgreSQL alone); Patroni stays and restarts it in place.
// It returns the killed postmaster's pid.
func (c *Cluster) KillPostgres(name string) (int, error) {
	n := c.Node(name)
	if n == nil {
		return 0, fmt.Errorf("hacluster: no node %q", name)
	}
	pm := n.postmaster()
	if pm == 0 {
		return 0, fmt.Errorf("hacluster: no postmaster running on %s", name)
	}
	_ = syscall.Kill(pm, syscall.SIGSTOP)
	pids := append([]int{pm}, children(pm)...)
	killAll(pids)
	return pm, waitGone(pids, 10*time.Second)
}

// StartNode starts node's Patroni again after KillNode; it rejoins the
// cluster as a replica (with pg_rewind when it had diverged).
func (c *Cluster) StartNode(ctx context.Context, name string) error {
	n := c.Node(name)
	if n == nil {
		return fmt.Errorf("hacluster: no node %q", name)
	}
	n.mu.Lock()
	running := n.cmd != nil
	n.mu.Unlock()
	if running {
		return fmt.Errorf("hacluster: patroni of %s is running", name)
	}
	return c.startPatroni(n)
}

// StallReplication stops forwarding the replication traffic of node (as a
// leader): its replicas fall behind while it keeps committing.
func (c *Cluster) StallReplication(name string) { c.Node(name).proxy.Stall() }

// ResumeReplication undoes StallReplication.
func (c *Cluster) ResumeReplication(name string) { c.Node(name).proxy.Resume() }

// CutReplication resets node's replication connections, dropping whatever
// a stall held back.
func (c *Cluster) CutReplication(name string) { c.Node(name).proxy.Cut() }
