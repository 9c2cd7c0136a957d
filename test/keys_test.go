package test

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pgbaton/pgbaton/advisory"
	"github.com/pgbaton/pgbaton/internal/testkit/pgtest"
)

// TestCorpusMatchesSQL checks every committed fuzz seed for key hashing
// against PostgreSQL: Go's NameKey and SQL's pgbaton.advisory_key give the
// same key for every name Go accepts (DESIGN rule 7: the same lock from Go
// and from psql).
func TestCorpusMatchesSQL(t *testing.T) {
	pool := env.DB(t).Pool(t)
	ctx := pgtest.Context(t, time.Minute)
	files, err := filepath.Glob(filepath.Join("fuzz", "testdata", "fuzz", "FuzzName*", "*"))
	require.NoError(t, err)
	require.NotEmpty(t, files)
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(string(b)), "\n")
		require.Len(t, lines, 3, f)
		var vals [2]string
		for i, l := range lines[1:] {
			q, ok := strings.CutPrefix(l, "string(")
			require.True(t, ok, f)
			vals[i], err = strconv.Unquote(strings.TrimSuffix(q, ")"))
			require.NoError(t, err, f)
		}
		key, err := advisory.NameKey(vals[0], vals[1])
		if err != nil {
			continue // refused in Go: never reaches SQL
		}
		var sqlKey int64
		require.NoError(t, pool.QueryRow(ctx, "SELECT pgbaton.advisory_key($2, $1)", vals[0], vals[1]).Scan(&sqlKey), f)
		assert.Equal(t, key, sqlKey, "%s: namespace %q name %q", f, vals[0], vals[1])
		checked++
	}
	require.Greater(t, checked, 5)
}
