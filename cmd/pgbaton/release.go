package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/admin/admindb"
	"github.com/pgbaton/pgbaton/advisory"
)

type releaseOpts struct {
	reason     string
	clearDelay bool
	yes        bool
	terminate  bool
	kind       string
	namespace  string
	stdin      io.Reader
}

func newReleaseCmd(g *globals) *cobra.Command {
	o := releaseOpts{stdin: g.stdin}
	cmd := &cobra.Command{
		Use:   "release NAME",
		Short: "Force-release a lease, or an advisory lock by terminating its holder's session",
		Long: `Force-release a stuck lock, with a reason written to the audit log
(pgbaton events) in the same transaction. Needs role pgbaton_admin.

A lease is freed and its token bumped, so the old holder's fenced writes fail
from then on. A lease taken with a lock-delay (leasetable.Config.LockDelay) is
then granted to nobody until the delay has passed, as if its holder had lost
it; --clear-lock-delay frees it at once instead, and also ends the lock-delay
of a lease lost before.

An advisory lock can only be freed by ending the session that holds it, which
frees every lock that session holds: pgbaton shows them and does it only with
--terminate-backend.

NAME is a lease name or an advisory lock name; an advisory lock can also be
given as a bigint key or as "a,b" for an (int, int) pair. Shell completion
offers the names the database knows.

It asks for confirmation when standard input is a terminal; otherwise (a
script, CI, a pipe) it changes nothing unless --yes is given.`,
		Example: `  pgbaton release nightly-report --reason "worker-3 wedged since 02:00"
  pgbaton release shard-7 --reason "node drained" --yes       # no question (scripts)
  pgbaton release job:export --reason "hung" --terminate-backend
  pgbaton release 42 --kind advisory --reason "stuck key" --terminate-backend`,
		Args: exactArgs(1),
		ValidArgsFunction: func(cmd *cobra.Command, args []string, toComplete string) ([]string, cobra.ShellCompDirective) {
			if len(args) > 0 {
				return nil, cobra.ShellCompDirectiveNoFileComp
			}
			return g.completeNames(func() string { return "" })(cmd, args, toComplete)
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if strings.TrimSpace(o.reason) == "" {
				return usageError{fmt.Errorf("--reason is required: it goes into the audit log")}
			}
			switch o.kind {
			case "auto", "lease", "advisory":
			default:
				return usageError{fmt.Errorf("--kind must be auto, lease or advisory, not %q", o.kind)}
			}
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				return g.release(cmd.Context(), pool, args[0], o)
			})
		},
	}
	cmd.Flags().StringVar(&o.reason, "reason", "", "why (required; written to the audit log)")
	cmd.Flags().BoolVarP(&o.yes, "yes", "y", false, "do not ask for confirmation")
	cmd.Flags().BoolVar(&o.terminate, "terminate-backend", false, "for an advisory lock: terminate the session holding it")
	cmd.Flags().BoolVar(&o.clearDelay, "clear-lock-delay", false, "for a lease: free it at once, without its lock-delay (also ends a lock-delay under way)")
	cmd.Flags().StringVar(&o.kind, "kind", "auto", "lease, advisory, or auto (a held lease of that name first)")
	cmd.Flags().StringVar(&o.namespace, "namespace", "", "advisory lock namespace (advisory.Config.Namespace)")
	return cmd
}

func (g *globals) release(ctx context.Context, pool *pgxpool.Pool, name string, o releaseOpts) error {
	if o.kind != "advisory" {
		// Names sort after their prefixes: the lease named name, if held,
		// is the first held lease whose name starts with it.
		rows, err := admindb.New().Leases(ctx, pool, admindb.LeasesParams{Prefix: name, LeaseState: "held", MaxRows: 1})
		if err == nil && o.clearDelay && (len(rows) == 0 || rows[0].Name != name) {
			rows, err = admindb.New().Leases(ctx, pool, admindb.LeasesParams{Prefix: name, LeaseState: "lock-delay", MaxRows: 1})
		}
		if err != nil {
			return explainQueryError(err)
		}
		if len(rows) == 1 && rows[0].Name == name {
			return g.releaseLease(ctx, pool, leaseFromRow(rows[0]), o)
		}
		if o.kind == "lease" {
			return fmt.Errorf("%w: no held lease named %q", errNotFound, name)
		}
	}
	return g.releaseAdvisory(ctx, pool, name, o)
}

// confirm asks prompt on stderr and reads the answer from stdin, only when
// stdin is a terminal: a script's empty or piped stdin must not be taken
// for an answer, nor leave it waiting.
func (g *globals) confirm(o releaseOpts, prompt string) error {
	if o.yes {
		return nil
	}
	if !isTerminal(o.stdin) {
		return usageError{fmt.Errorf("standard input is not a terminal, so nothing was asked (%q) and nothing was changed; pass --yes to confirm", prompt)}
	}
	fmt.Fprintf(g.stderr, "%s [y/N] ", prompt)
	line, _ := bufio.NewReader(o.stdin).ReadString('\n')
	if a := strings.ToLower(strings.TrimSpace(line)); a == "y" || a == "yes" {
		return nil
	}
	return fmt.Errorf("not confirmed; nothing was changed (pass --yes to skip the question)")
}

func (g *globals) releaseLease(ctx context.Context, pool *pgxpool.Pool, l leaseView, o releaseOpts) error {
	if l.LockDelayUntil != "" {
		fmt.Fprintf(g.stderr, "lease %s lost by %s with token %d, in lock-delay until %s\n", l.Name, l.Owner, l.Token, l.LockDelayUntil)
	} else {
		fmt.Fprintf(g.stderr, "lease %s held by %s with token %d for %s, expires in %s\n", l.Name, l.Owner, l.Token, l.HeldFor, l.ExpiresIn)
	}
	if err := g.confirm(o, "Force-release it? Its holder's fenced writes will fail."); err != nil {
		return err
	}
	var res admindb.ForceReleaseLeaseRow
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var err error
		res, err = admindb.New().ForceReleaseLease(ctx, tx, admindb.ForceReleaseLeaseParams{Name: l.Name, Reason: o.reason, ClearDelay: o.clearDelay})
		return err
	})
	if err != nil {
		return explainQueryError(err)
	}
	if d := time.Until(res.FreeAt); d > 0 {
		fmt.Fprintf(g.stderr, "its lock-delay was kept: nobody is granted it for %s (until %s); --clear-lock-delay frees it now\n",
			fmtDuration(d), res.FreeAt.UTC().Format(time.RFC3339))
	}
	out := struct {
		Kind     string `json:"kind"`
		Name     string `json:"name"`
		OldOwner string `json:"old_owner"`
		OldToken int64  `json:"old_token,string"`
		NewToken int64  `json:"new_token,string"`
		FreeAt   string `json:"free_at"` // when it can be granted again: now, or when its lock-delay ends
	}{"lease", l.Name, res.OldOwner, res.OldToken, res.NewToken, res.FreeAt.UTC().Format(time.RFC3339Nano)}
	return g.render(out, []string{"RELEASED", "OLD OWNER", "OLD TOKEN", "NEW TOKEN"}, func() [][]string {
		return [][]string{{"lease " + l.Name, res.OldOwner, strconv.FormatInt(res.OldToken, 10), strconv.FormatInt(res.NewToken, 10)}}
	})
}

func (g *globals) releaseAdvisory(ctx context.Context, pool *pgxpool.Pool, name string, o releaseOpts) error {
	// Every advisory lock: the holders of this one, and what else each of
	// them holds.
	all, _, err := readAdvisory(ctx, pool, lockFilter{limit: math.MaxInt32 - 1})
	if err != nil {
		return err
	}
	match, err := advisoryMatcher(name, o.namespace)
	if err != nil {
		return err
	}
	var holders []advisoryLock
	for _, a := range all {
		if a.Granted && match(a) {
			holders = append(holders, a)
		}
	}
	if len(holders) == 0 {
		return fmt.Errorf("%w: no held lease or advisory lock named %q", errNotFound, name)
	}
	for _, h := range holders {
		fmt.Fprintf(g.stderr, "advisory lock %s is held (%s) by backend pid %d (%s, %s), which holds:\n", h.Lock, h.Mode, h.PID, orDash(h.ApplicationName), orDash(h.ClientAddr))
		for _, other := range all {
			if other.PID == h.PID && other.Granted {
				fmt.Fprintf(g.stderr, "  %s (%s)\n", other.Lock, other.Mode)
			}
		}
	}
	if !o.terminate {
		return usageError{fmt.Errorf("an advisory lock is freed only by ending the session that holds it, which frees every lock listed above; pass --terminate-backend to do that")}
	}
	if err := g.confirm(o, fmt.Sprintf("Terminate %d backend(s)?", len(holders))); err != nil {
		return err
	}
	type result struct {
		PID        int32 `json:"pid"`
		Terminated bool  `json:"terminated"`
		LocksHeld  int32 `json:"locks_held"`
	}
	var results []result
	for _, h := range holders {
		var res admindb.TerminateAdvisoryHolderRow
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			res, err = admindb.New().TerminateAdvisoryHolder(ctx, tx, admindb.TerminateAdvisoryHolderParams{Pid: h.PID, Target: h.Lock, Reason: o.reason})
			return err
		})
		if err != nil {
			return explainQueryError(err)
		}
		results = append(results, result{h.PID, res.Terminated, res.LocksHeld})
	}
	return g.render(results, []string{"TERMINATED PID", "OK", "LOCKS FREED"}, func() [][]string {
		var rows [][]string
		for _, r := range results {
			rows = append(rows, []string{strconv.Itoa(int(r.PID)), strconv.FormatBool(r.Terminated), strconv.Itoa(int(r.LocksHeld))})
		}
		return rows
	})
}

// advisoryMatcher recognises the lock an operator named: "a,b" is an int
// pair, a number is a bigint key, anything else a name hashed the way
// advisory.Name does (pgbaton.advisory_key).
func advisoryMatcher(name, namespace string) (func(advisoryLock) bool, error) {
	if a, b, ok := strings.Cut(name, ","); ok {
		k1, err1 := strconv.ParseInt(strings.TrimSpace(a), 10, 32)
		k2, err2 := strconv.ParseInt(strings.TrimSpace(b), 10, 32)
		if err1 == nil && err2 == nil {
			return func(l advisoryLock) bool { return l.Pair != nil && l.Pair[0] == int32(k1) && l.Pair[1] == int32(k2) }, nil
		}
	}
	if k, err := strconv.ParseInt(name, 10, 64); err == nil {
		return func(l advisoryLock) bool { return l.Key != nil && *l.Key == k }, nil
	}
	// The same hash advisory.Name uses (and pgbaton.advisory_key in SQL).
	key, err := advisory.NameKey(namespace, name)
	if err != nil {
		return nil, usageError{err}
	}
	return func(l advisoryLock) bool { return l.Key != nil && *l.Key == key }, nil
}
