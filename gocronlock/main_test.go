package gocronlock_test

import (
	"os"
	"testing"

	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}
