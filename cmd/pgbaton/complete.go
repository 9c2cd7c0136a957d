package main

import (
	"context"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/cmd/pgbaton/internal/opdb"
)

// Shell completion (`pgbaton completion bash|zsh|fish|powershell`, cobra's)
// completes lock and lease names from the database the command line
// connects to (--dsn, PGBATON_DSN, DATABASE_URL, PG*): a name typed on the
// command line must be a name the database knows.
const (
	completeTimeout = 3 * time.Second
	completeMax     = 200
)

// completeNames completes lease and registered advisory lock names, of the
// group group() returns when it is set.
func (g *globals) completeNames(group func() string) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
		return g.complete(cmd, func(ctx context.Context, q *opdb.Queries, db opdb.DBTX) ([]string, error) {
			return q.CompleteNames(ctx, db, opdb.CompleteNamesParams{Prefix: toComplete, LeaseGroup: group(), MaxRows: completeMax})
		})
	}
}

// completeGroups completes lease group names.
func (g *globals) completeGroups(cmd *cobra.Command, _ []string, toComplete string) ([]string, cobra.ShellCompDirective) {
	return g.complete(cmd, func(ctx context.Context, q *opdb.Queries, db opdb.DBTX) ([]string, error) {
		return q.CompleteGroups(ctx, db, opdb.CompleteGroupsParams{Prefix: toComplete, MaxRows: completeMax})
	})
}

// complete runs one completion query within completeTimeout. A database
// that cannot be reached completes nothing (and no file names): a shell
// must never hang on a Tab.
func (g *globals) complete(cmd *cobra.Command, query func(context.Context, *opdb.Queries, opdb.DBTX) ([]string, error)) ([]string, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(cmd.Context(), completeTimeout)
	defer cancel()
	pool, err := g.connect(ctx)
	if err != nil {
		cobra.CompDebugln("pgbaton: completion: "+err.Error(), true)
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	defer pool.Close()
	names, err := query(ctx, opdb.New(), pool)
	if err != nil {
		cobra.CompDebugln("pgbaton: completion: "+explainQueryError(err).Error(), true)
		return nil, cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveError
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
