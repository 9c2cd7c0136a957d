package test

import (
	"os"
	"testing"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	// Durable: the chaos suite restarts the cluster in immediate mode and
	// checks that acknowledged writes and fencing tokens survive the crash.
	env = pgtest.Setup(pgtest.Options{Durable: true, Children: children})
	os.Exit(env.Run(m))
}

// children run in separate OS processes of the test binary.
var children = map[string]pgtest.ChildFunc{
	"worker": childWorker,
}
