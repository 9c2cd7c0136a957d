//go:build ha

package ha

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	// The suite brings its own servers (a Patroni cluster); pgtest gives
	// it the goroutine leak check.
	env = pgtest.Setup(pgtest.Options{NoServer: true})
	os.Exit(env.Run(m))
}

func ctxT(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
