//go:build ha

package hacluster

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{NoServer: true, Children: map[string]pgtest.ChildFunc{
		// Starts a cluster, reports its directory, then waits to be killed.
		"start-then-wait": func(ctx context.Context, _ []string) error {
			c, err := Start(ctx, Config{})
			if err != nil {
				return err
			}
			pgtest.Printf("cluster %s", c.Dir())
			<-make(chan struct{})
			return nil
		},
	}})
	os.Exit(env.Run(m))
}

func leader(t *testing.T, ctx context.Context, c *Cluster) (name string, port int, inRecovery bool) {
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, conn.QueryRow(ctx, "SELECT inet_server_port(), pg_is_in_recovery()").Scan(&port, &inRecovery))
	for _, n := range c.Nodes() {
		if n.Port == port {
			name = n.Name
		}
	}
	return name, port, inRecovery
}

// The cluster comes up, the multi-host URL reaches the leader, a
// switchover and a killed leader move it, and Stop leaves nothing behind.
func TestCluster(t *testing.T) {
	ctx := pgtest.Context(t, 5*time.Minute)
	start := time.Now()
	c, err := Start(ctx, Config{})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Stop() })
	t.Logf("cluster up in %s", time.Since(start))

	first, _, ro := leader(t, ctx, c)
	require.False(t, ro)
	s, err := c.Status(ctx)
	require.NoError(t, err)
	l, ok := s.Leader()
	require.True(t, ok)
	require.Equal(t, first, l.Name)

	other := "n1"
	if first == "n1" {
		other = "n2"
	}
	start = time.Now()
	require.NoError(t, c.Switchover(ctx, first, other))
	t.Logf("switchover in %s", time.Since(start))
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		name, _, ro := leader(t, ctx, c)
		return name == other && !ro, nil
	}, "switchover to %s", other)
	_, err = c.WaitHealthy(ctx, false)
	require.NoError(t, err)

	start = time.Now()
	require.NoError(t, c.KillNode(other))
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			return false, nil
		}
		defer conn.Close(ctx)
		return true, nil
	}, "failover to %s", first)
	t.Logf("failover in %s", time.Since(start))
	require.NoError(t, c.StartNode(ctx, other))
	start = time.Now()
	_, err = c.WaitHealthy(ctx, false)
	require.NoError(t, err)
	t.Logf("%s rejoined in %s", other, time.Since(start))

	pm, err := c.KillPostgres(first)
	require.NoError(t, err)
	start = time.Now()
	_, err = c.WaitHealthy(ctx, false)
	require.NoError(t, err)
	t.Logf("postgres %d of %s crashed and restarted in %s", pm, first, time.Since(start))

	dir := c.Dir()
	require.NotEmpty(t, c.Leftovers())
	require.NoError(t, c.Stop())
	require.Empty(t, c.Leftovers())
	_, err = os.Stat(dir)
	require.True(t, errors.Is(err, os.ErrNotExist), "dir removed: %v", err)
}

// A process that starts a cluster and is then SIGKILLed leaves no process
// and no directory behind: the watchdog cleans up.
func TestNothingOutlivesTheStarter(t *testing.T) {
	child := env.StartChild(t, "start-then-wait")
	dir := child.Expect(t, "cluster ", 3*time.Minute)
	token := filepath.Base(dir)
	require.NotEmpty(t, matching(token))
	child.Signal(t, syscall.SIGKILL)
	require.Error(t, child.Wait(t, 30*time.Second))
	var left []proc
	pgtest.Eventually(t, time.Minute, func() (bool, error) {
		left = matching(token)
		_, err := os.Stat(dir)
		return len(left) == 0 && errors.Is(err, os.ErrNotExist), nil
	}, "processes or dir %s left after the starter died: %v", dir, &left)
}
