package advisory_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// Golden vectors: SHA-256 of the name, first 8 bytes big-endian signed.
// For example sha256("job:daily-export") starts db481dd880edde7b.
var golden = []struct {
	namespace, name string
	key             int64
}{
	{"", "job:daily-export", -2645831965366952325},
	{"", "a", -3848465438864589366},
	{"", "ünïcode ключ", -4786336670942294424},
	{"billing", "job:daily-export", -8703999526582831348},
	{"", "x/y", -4810811663722648527},
}

func TestNameKeyGolden(t *testing.T) {
	for _, g := range golden {
		k, err := advisory.NameKey(g.namespace, g.name)
		require.NoError(t, err)
		require.Equal(t, g.key, k, "NameKey(%q, %q)", g.namespace, g.name)
	}
}

func TestNameKeyMatchesSQL(t *testing.T) {
	pool := env.DB(t).Pool(t)
	for _, g := range golden {
		var k int64
		require.NoError(t, pool.QueryRow(pgtest.Context(t, time.Minute), "SELECT pgbaton.advisory_key($1, $2)", g.name, g.namespace).Scan(&k))
		require.Equal(t, g.key, k, "pgbaton.advisory_key(%q, %q)", g.name, g.namespace)
		if g.namespace == "" {
			require.NoError(t, pool.QueryRow(pgtest.Context(t, time.Minute), "SELECT pgbaton.advisory_key($1)", g.name).Scan(&k))
			require.Equal(t, g.key, k)
		}
	}
}

func TestNameKeyBadInput(t *testing.T) {
	for _, c := range []struct{ ns, name string }{
		{"", ""},
		{"", strings.Repeat("x", advisory.MaxNameLen+1)},
		{"", "bad\xffutf8"},
		{"", "nul\x00"},
		{"a/b", "name"},
		{strings.Repeat("n", advisory.MaxNamespaceLen+1), "name"},
	} {
		_, err := advisory.NameKey(c.ns, c.name)
		require.ErrorIs(t, err, pgbaton.ErrInvalidArgument, "NameKey(%q, %q)", c.ns, c.name)
	}
	_, err := advisory.NameKey("", strings.Repeat("x", advisory.MaxNameLen))
	require.NoError(t, err)
}

func TestKeyString(t *testing.T) {
	require.Equal(t, "name:job", advisory.Name("job").String())
	require.Equal(t, "key:-5", advisory.Int64(-5).String())
	require.Equal(t, "pair:1,2", advisory.Pair(1, 2).String())
	require.Equal(t, "invalid key", advisory.Key{}.String())
}
