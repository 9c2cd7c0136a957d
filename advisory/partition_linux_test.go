//go:build linux

package advisory_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// The end-to-end proof of the timing argument (pgsession.serverTimeouts): a client cut off
// silently (no FIN, no RST reach the server) reports ErrLockLost while the
// server still holds its lock, and the server frees the lock later, when
// the session's TCP keepalive / tcp_user_timeout drop the dead client.
//
// The server runs in one private network namespace and the client dials
// from another, joined by a veth pair; downing the client's end cuts the
// link without telling the server anything. Needs root and iproute2.
func TestSilentPartition(t *testing.T) {
	if testing.Short() {
		t.Skip("network namespaces: runs without -short")
	}
	n := newNetnsPair(t)
	hba := filepath.Join(n.dir, "pg_hba.conf")
	require.NoError(t, os.WriteFile(hba, []byte("local all all trust\nhost all all 127.0.0.1/32 trust\nhost all all "+n.clientAddr+"/32 trust\n"), 0o644))
	var c *pgcluster.Cluster
	n.in(t, n.server, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		var err error
		c, err = pgcluster.Start(ctx, pgcluster.Config{NoFsync: true, Settings: map[string]string{
			"listen_addresses": "127.0.0.1," + n.serverAddr,
			"hba_file":         hba,
		}})
		return err
	})
	t.Cleanup(func() { require.NoError(t, c.Stop()) })
	// The admin looks through the unix socket, which the partition does
	// not touch.
	admin := pgtest.Pool(t, c.SocketURL("postgres"))
	ctx := pgtest.Context(t, time.Minute)

	pool := pgtest.Pool(t, fmt.Sprintf("postgres://postgres@%s:%d/postgres?sslmode=disable", n.serverAddr, c.Port()), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DialFunc = n.dialer(n.client)
	})
	l := newLocker(t, pool, advisory.Config{PingInterval: 200 * time.Millisecond, PingTimeout: 300 * time.Millisecond})
	lk, err := l.TryLock(ctx, advisory.Int64(4242))
	require.NoError(t, err)
	var pid int32
	var from string
	require.NoError(t, admin.QueryRow(ctx, `
		SELECT l.pid, host(a.client_addr) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
		 WHERE l.locktype = 'advisory' AND l.granted AND l.objid = 4242`).Scan(&pid, &from))
	require.Equal(t, n.clientAddr, from, "the session crosses the veth link")
	heldBy := func() (bool, error) {
		var held bool
		err := admin.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_locks
			 WHERE locktype = 'advisory' AND granted AND objid = 4242 AND pid = $1)`, pid).Scan(&held)
		return held, err
	}

	n.ip(t, "-n", n.client, "link", "set", "vc", "down")
	cut := time.Now()
	select {
	case <-lk.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the client did not report the loss")
	}
	clientGaveUp := time.Since(cut)
	require.ErrorIs(t, lk.Err(), advisory.ErrLockLost)
	held, err := heldBy()
	require.NoError(t, err)
	require.True(t, held, "the client reported the loss while the server still holds the lock")

	pgtest.Eventually(t, 30*time.Second, func() (bool, error) {
		held, err := heldBy()
		return !held, err
	}, "the server drops the partitioned session and frees its lock")
	serverFreed := time.Since(cut)
	t.Logf("client reported ErrLockLost %s after the cut, the server freed the lock %s after it", clientGaveUp.Round(time.Millisecond), serverFreed.Round(time.Millisecond))
	require.Greater(t, serverFreed, clientGaveUp)
}

// netnsPair is two private network namespaces joined by a veth pair: vs
// (serverAddr) in server, vc (clientAddr) in client. Nothing is changed
// in the namespace the test runs in.
type netnsPair struct {
	server, client         string
	serverAddr, clientAddr string
	dir                    string
}

func newNetnsPair(t *testing.T) *netnsPair {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		// A missing binary is an install step, not a reason to skip.
		t.Fatalf("needs iproute2 (ip): apt-get install iproute2; .ci/run installs it: %v", err)
	}
	dir, err := os.MkdirTemp("", "pgbaton-netns-")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	require.NoError(t, os.Chmod(dir, 0o755)) // postgres runs as another user
	prefix := fmt.Sprintf("pgbaton-%d-%s", os.Getpid(), filepath.Base(dir)[len("pgbaton-netns-"):])
	n := &netnsPair{server: prefix + "-s", client: prefix + "-c", serverAddr: "10.254.0.1", clientAddr: "10.254.0.2", dir: dir}
	for _, ns := range []string{n.server, n.client} {
		n.ip(t, "netns", "add", ns)
		t.Cleanup(func() { n.ip(t, "netns", "del", ns) })
		n.ip(t, "-n", ns, "link", "set", "lo", "up")
	}
	n.ip(t, "link", "add", "vs", "netns", n.server, "type", "veth", "peer", "name", "vc", "netns", n.client)
	n.ip(t, "-n", n.server, "addr", "add", n.serverAddr+"/30", "dev", "vs")
	n.ip(t, "-n", n.client, "addr", "add", n.clientAddr+"/30", "dev", "vc")
	n.ip(t, "-n", n.server, "link", "set", "vs", "up")
	n.ip(t, "-n", n.client, "link", "set", "vc", "up")
	return n
}

func (n *netnsPair) ip(t *testing.T, args ...string) {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil && len(args) > 0 && args[0] == "netns" && strings.Contains(string(out), "ermission") {
		t.Skipf("cannot create network namespaces here: %s", out)
	}
	require.NoError(t, err, "ip %s: %s", strings.Join(args, " "), out)
}

// inNetns runs fn on an OS thread moved into namespace ns. Sockets and
// processes it creates belong to ns for good. The thread is never
// unlocked, so it ends with the goroutine instead of running other code
// in ns.
func inNetns(ns string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		f, err := os.Open(filepath.Join("/run/netns", ns))
		if err != nil {
			errc <- err
			return
		}
		defer f.Close()
		if err := unix.Setns(int(f.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("setns %s: %w", ns, err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func (n *netnsPair) in(t *testing.T, ns string, fn func() error) {
	t.Helper()
	require.NoError(t, inNetns(ns, fn))
}

// dialer dials TCP from namespace ns.
func (n *netnsPair) dialer(ns string) func(ctx context.Context, network, addr string) (net.Conn, error) {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		var conn net.Conn
		err := inNetns(ns, func() error {
			var err error
			conn, err = (&net.Dialer{}).DialContext(ctx, network, addr)
			return err
		})
		return conn, err
	}
}
