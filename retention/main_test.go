package retention_test

import (
	"os"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

// examplePool gives an Example function, which has no testing.T, a fresh
// migrated database; done drops it.
func examplePool() (*pgxpool.Pool, func()) { return env.ExamplePool() }
