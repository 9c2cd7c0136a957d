package advisory_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/advisory"
)

// A name gives the same key in Go and in SQL, so SQL scripts can take the
// locks Go code takes.
func ExampleNameKey() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	key, err := advisory.NameKey("", "job:daily-export")
	if err != nil {
		panic(err)
	}
	var fromSQL int64
	err = pool.QueryRow(ctx, "SELECT pgbaton.advisory_key('job:daily-export')").Scan(&fromSQL)
	if err != nil {
		panic(err)
	}
	fmt.Println(key, key == fromSQL)
	// Output:
	// -2645831965366952325 true
}
