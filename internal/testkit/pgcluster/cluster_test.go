package pgcluster_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgcluster"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{Children: map[string]pgtest.ChildFunc{
		// Starts a cluster, reports it, then dies the way args[0] says.
		"start-then": func(ctx context.Context, args []string) error {
			c, err := pgcluster.Start(ctx, pgcluster.Config{NoFsync: true})
			if err != nil {
				return err
			}
			pgtest.Printf("cluster %d %s", c.PID(), c.Dir())
			switch args[0] {
			case "panic":
				panic("deliberate panic with a cluster running")
			case "exit":
				os.Exit(3)
			default: // wait to be signalled
				<-make(chan struct{})
			}
			return nil
		},
	}})
	os.Exit(env.Run(m))
}

// alive reports whether pid is a live (not zombie) process.
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// state is the field after the parenthesised command name
	s := string(b)
	rest := s[strings.LastIndexByte(s, ')')+2:]
	return rest[0] != 'Z'
}

func TestStartQueryRestartStop(t *testing.T) {
	ctx := context.Background()
	start := time.Now()
	c, err := pgcluster.Start(ctx, pgcluster.Config{Settings: map[string]string{"application_name": "x"}})
	require.NoError(t, err)
	t.Logf("durable cluster up in %s", time.Since(start))
	defer c.Stop()

	for _, url := range []string{c.URL("postgres"), c.SocketURL("postgres")} {
		conn, err := pgx.Connect(ctx, url)
		require.NoError(t, err, url)
		var fsync string
		require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
		require.Equal(t, "on", fsync, "fsync stays on by default")
		require.NoError(t, conn.Close(ctx))
	}

	pid := c.PID()
	require.NoError(t, c.Restart(ctx, pgcluster.Immediate))
	require.NotEqual(t, pid, c.PID())
	require.False(t, alive(pid))
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	dir, pid := c.Dir(), c.PID()
	require.NoError(t, c.Stop())
	require.NoError(t, c.Stop(), "Stop is idempotent")
	require.False(t, alive(pid))
	_, err = os.Stat(dir)
	require.True(t, errors.Is(err, os.ErrNotExist), "dir removed: %v", err)
	require.ErrorIs(t, c.Restart(ctx, pgcluster.Fast), pgcluster.ErrStopped)
}

func TestNoFsync(t *testing.T) {
	c := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	conn, err := pgx.Connect(context.Background(), c.URL("postgres"))
	require.NoError(t, err)
	defer conn.Close(context.Background())
	var fsync string
	require.NoError(t, conn.QueryRow(context.Background(), "SHOW fsync").Scan(&fsync))
	require.Equal(t, "off", fsync)
}

// A process that starts a cluster and then dies in any way leaves no
// postgres process and no directory behind.
func TestNothingOutlivesTheStarter(t *testing.T) {
	for _, how := range []string{"panic", "exit", "SIGINT", "SIGTERM", "SIGKILL"} {
		t.Run(how, func(t *testing.T) {
			child := env.StartChild(t, "start-then", how)
			fields := strings.Fields(child.Expect(t, "cluster ", 60*time.Second))
			pid, err := strconv.Atoi(fields[0])
			require.NoError(t, err)
			dir := fields[1]
			require.True(t, alive(pid), "postgres %d runs while the starter lives", pid)
			switch how {
			case "SIGINT":
				child.Signal(t, syscall.SIGINT)
			case "SIGTERM":
				child.Signal(t, syscall.SIGTERM)
			case "SIGKILL":
				child.Signal(t, syscall.SIGKILL)
			}
			require.Error(t, child.Wait(t, 30*time.Second), "the child died abnormally")
			pgtest.Eventually(t, 20*time.Second, func() (bool, error) {
				_, statErr := os.Stat(dir)
				return !alive(pid) && errors.Is(statErr, os.ErrNotExist), nil
			}, "postgres %d or dir %s outlived the process that started it", pid, dir)
		})
	}
}

func TestMissingBinaries(t *testing.T) {
	_, err := pgcluster.Start(context.Background(), pgcluster.Config{BinDir: t.TempDir()})
	require.Error(t, err)
	t.Setenv("PATH", t.TempDir())
	dir, err := pgcluster.FindBinDir()
	if err != nil {
		require.ErrorIs(t, err, pgcluster.ErrNoServerBinaries)
		require.Contains(t, err.Error(), "apt-get install postgresql")
	} else {
		// Found through /usr/lib/postgresql/*/bin even without PATH.
		require.FileExists(t, dir+"/initdb")
	}
}

// With FakeClock, StepClock moves clock_timestamp() and now() of every
// backend, one already connected and a new one, by the sum of the steps
// relative to the real time; the server's monotonic timers are untouched
// (a statement timeout still fires on time).
func TestFakeClockSteps(t *testing.T) {
	ctx := pgtest.Context(t, time.Minute)
	c := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true, FakeClock: true})
	old, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer old.Close(ctx)
	// offset is the server's wall clock minus ours, within the round trip.
	offset := func(conn *pgx.Conn, fn string) time.Duration {
		t.Helper()
		before := time.Now()
		var server time.Time
		require.NoError(t, conn.QueryRow(ctx, "SELECT "+fn).Scan(&server))
		after := time.Now()
		mid := before.Add(after.Sub(before) / 2)
		return server.Sub(mid).Round(time.Second)
	}
	require.Equal(t, time.Duration(0), offset(old, "clock_timestamp()"), "a new cluster's clock is not moved")

	require.NoError(t, c.StepClock(30*time.Second))
	require.Equal(t, 30*time.Second, c.ClockOffset())
	fresh, err := pgx.Connect(ctx, c.URL("postgres"))
	require.NoError(t, err)
	defer fresh.Close(ctx)
	for _, conn := range []*pgx.Conn{old, fresh} {
		require.Equal(t, 30*time.Second, offset(conn, "clock_timestamp()"))
		require.Equal(t, 30*time.Second, offset(conn, "now()"))
	}

	require.NoError(t, c.StepClock(-60*time.Second))
	require.Equal(t, -30*time.Second, offset(old, "clock_timestamp()"), "steps add up; back is allowed")

	_, err = old.Exec(ctx, "SET statement_timeout = '200ms'")
	require.NoError(t, err)
	start := time.Now()
	_, err = old.Exec(ctx, "SELECT pg_sleep(5)")
	require.Error(t, err)
	require.Less(t, time.Since(start), 4*time.Second, "timeouts follow the real (monotonic) clock")

	plain := pgtest.NewCluster(t, pgcluster.Config{NoFsync: true})
	require.ErrorIs(t, plain.StepClock(time.Second), pgcluster.ErrNoFakeClock)
}
