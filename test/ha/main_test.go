//go:build ha

package ha

import (
	"os"
	"testing"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	// The suite brings its own servers (a Patroni cluster); pgtest gives
	// it the goroutine leak check.
	env = pgtest.Setup(pgtest.Options{NoServer: true})
	os.Exit(env.Run(m))
}
