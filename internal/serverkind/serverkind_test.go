package serverkind_test

import (
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/serverkind"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

var env *pgtest.Env

func TestMain(m *testing.M) {
	env = pgtest.Setup(pgtest.Options{})
	os.Exit(env.Run(m))
}

const (
	crdbVersion = "CockroachDB CCL v23.1.11 (x86_64-pc-linux-gnu, built 2023/09/27 01:53:43, go1.19.10)"
	ybVersion   = "PostgreSQL 11.2-YB-2.18.3.0-b0 on x86_64-pc-linux-gnu, compiled by clang version 15.0.3, 64-bit"
)

func TestClassify(t *testing.T) {
	none := func(string) string { return "" }
	for _, c := range []struct {
		version string
		params  map[string]string
		want    serverkind.Kind
	}{
		{"PostgreSQL 15.20 (Debian 15.20-0+deb12u1) on x86_64-pc-linux-gnu", nil, serverkind.PostgreSQL},
		{crdbVersion, nil, serverkind.CockroachDB},
		{"", map[string]string{"crdb_version": crdbVersion, "server_version": "13.0.0"}, serverkind.CockroachDB},
		{ybVersion, nil, serverkind.YugabyteDB},
		{"", map[string]string{"server_version": "11.2-YB-2.18.3.0-b0"}, serverkind.YugabyteDB},
	} {
		param := none
		if c.params != nil {
			param = func(k string) string { return c.params[k] }
		}
		require.Equal(t, c.want, serverkind.Classify(c.version, param), "%q %v", c.version, c.params)
		err := c.want.Err(c.version)
		if c.want == serverkind.PostgreSQL {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, pgbaton.ErrUnsupportedServer)
			require.ErrorContains(t, err, c.want.String())
		}
	}
}

// A server that answers like CockroachDB, at the protocol level: refused
// from its startup parameters alone, or, when a proxy hid them, from
// version(), which is asked with the simple protocol.
func TestCheckRefusesCockroachDB(t *testing.T) {
	ctx := pgtest.Context(t, 30*time.Second)
	withParam := pgtest.StartFakeServer(t, crdbVersion, map[string]string{"server_version": "13.0.0", "crdb_version": crdbVersion})
	err := serverkind.Check(ctx, pgtest.Pool(t, withParam.URL()))
	require.ErrorIs(t, err, pgbaton.ErrUnsupportedServer)
	require.ErrorContains(t, err, "CockroachDB")
	require.ErrorContains(t, err, "without locking anything")
	require.Empty(t, withParam.Queries(), "the startup parameters were enough")

	versionOnly := pgtest.StartFakeServer(t, crdbVersion, map[string]string{"server_version": "13.0.0"})
	err = serverkind.Check(ctx, pgtest.Pool(t, versionOnly.URL()))
	require.ErrorIs(t, err, pgbaton.ErrUnsupportedServer)
	require.Equal(t, []string{"SELECT version()"}, versionOnly.Queries())
}

func TestCheckRefusesYugabyteDB(t *testing.T) {
	ctx := pgtest.Context(t, 30*time.Second)
	yb := pgtest.StartFakeServer(t, ybVersion, map[string]string{"server_version": "11.2-YB-2.18.3.0-b0"})
	err := serverkind.Check(ctx, pgtest.Pool(t, yb.URL()))
	require.ErrorIs(t, err, pgbaton.ErrUnsupportedServer)
	require.ErrorContains(t, err, "sequence")
}

func TestCheckAcceptsPostgreSQL(t *testing.T) {
	d := env.DB(t)
	require.NoError(t, serverkind.Check(pgtest.Context(t, 30*time.Second), d.Pool(t)))
	require.ErrorIs(t, serverkind.Check(pgtest.Context(t, 30*time.Second), nil), pgbaton.ErrInvalidArgument)
}
