package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/admin/admindb"
)

func newResignCmd(g *globals) *cobra.Command {
	var reason string
	cmd := &cobra.Command{
		Use:   "resign NAME",
		Short: "Ask the leader of an election to step down; another candidate takes over",
		Long: `Ask the leader of a leasetable election (Campaign, Elect) to step down,
with a reason written to the audit log (pgbaton events) in the same
transaction. Needs role pgbaton_admin.

The leader is told at once: its term's context ends (Campaign) or
Leadership.ResignRequested is closed (Elect). It finishes its work, resigns,
and the first waiting candidate (the highest Preference, then the one that
waited longest) takes over. Nothing is forced: a leader that does not
resign keeps leading; pgbaton release takes the lease away instead.`,
		Example: `  pgbaton resign scheduler --reason "move the leader off node-3 before draining it"
  pgbaton resign scheduler --reason "pick up the new version" -o json`,
		Args: exactArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return g.completeNames(func() string { return "" })(cmd, args, toComplete)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(reason) == "" {
				return usageError{fmt.Errorf("--reason is required: it goes into the audit log")}
			}
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				return g.resign(cmd.Context(), pool, args[0], reason)
			})
		},
	}
	cmd.Flags().StringVar(&reason, "reason", "", "why (required; written to the audit log)")
	return cmd
}

func (g *globals) resign(ctx context.Context, pool *pgxpool.Pool, name, reason string) error {
	// One statement: the request and its audit row commit together.
	res, err := admindb.New().RequestLeaderResign(ctx, pool, admindb.RequestLeaderResignParams{Name: name, Reason: reason})
	if err != nil {
		return explainQueryError(err)
	}
	out := struct {
		Kind   string `json:"kind"`
		Name   string `json:"name"`
		Leader string `json:"leader"`
		Term   int64  `json:"term,string"`
	}{"election", name, res.Leader, res.Term}
	return g.render(out, []string{"ASKED TO RESIGN", "LEADER", "TERM"}, func() [][]string {
		return [][]string{{"election " + name, res.Leader, strconv.FormatInt(res.Term, 10)}}
	})
}
