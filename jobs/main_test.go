package jobs_test

import (
	"context"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
	"github.com/pgbaton/pgbaton/leasetable"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{Children: map[string]pgtest.ChildFunc{
		"job":   childJob,
		"slots": childSlots,
	}})
	os.Exit(env.Run(m))
}

// shortTTL keeps fault tests quick: losses and takeovers happen within a
// second or two.
const shortTTL = time.Second

// newClient is a client closed at the end of the test.
func newClient(t testing.TB, pool *pgxpool.Pool, cfg leasetable.Config) *leasetable.Client {
	t.Helper()
	c, err := leasetable.New(context.Background(), pool, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, c.Close(context.Background())) })
	return c
}

// childClient opens a pool and client in a child process.
func childClient(ctx context.Context, url string) (*leasetable.Client, func(), error) {
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return nil, nil, err
	}
	c, err := leasetable.New(ctx, pool, leasetable.Config{TTL: shortTTL, Owner: "child-" + strconv.Itoa(os.Getpid())})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return c, func() { _ = c.Close(ctx); pool.Close() }, nil
}

// examplePool gives an Example function, which has no testing.T, a fresh
// migrated database; done drops it.
func examplePool() (*pgxpool.Pool, func()) { return env.ExamplePool() }
