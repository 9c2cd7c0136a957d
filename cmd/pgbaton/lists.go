package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/admin/admindb"
)

// waiterView is one row of `pgbaton leases --waiting` (and of `locks
// --waiting`): a live waiter in the wait queue of a lease or group
// (pgbaton.lease_queue). Position and waiting_ms are counts, plain numbers.
type waiterView struct {
	Name      string `json:"name"`     // the lease, or the group of a semaphore
	Group     bool   `json:"group"`    // name is a group: any of its leases will do
	Position  int64  `json:"position"` // in the name's queue: 1 is served next
	Owner     string `json:"owner"`    // the waiter's client
	Waiter    string `json:"waiter"`
	Since     string `json:"since"`
	Waiting   string `json:"waiting"` // rounded for people
	WaitingMs int64  `json:"waiting_ms"`
}

func newLeasesCmd(g *globals) *cobra.Command {
	var f lockFilter
	var all, waiting bool
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "Show leases: held ones, or expired, free or all with --state; or who waits for them",
		Example: `  pgbaton leases
  pgbaton leases --group shards --state all
  pgbaton leases --state expired          # an owner whose expiry passed; nobody took it over yet
  pgbaton leases --state lock-delay       # lost grants whose lock-delay still holds the name back
  pgbaton leases --limit 100 --after shard-0099   # the next page
  pgbaton leases --waiting                # the wait queues: who is served next, and how long each waited`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if all {
				if cmd.Flags().Changed("state") && f.state != "all" {
					return usageError{fmt.Errorf("--all is --state all; give one of them")}
				}
				f.state = "all"
			}
			if err := f.check(); err != nil {
				return err
			}
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				if waiting {
					return g.leaseWaiters(cmd, pool, f)
				}
				views, cut, err := readLeases(cmd.Context(), pool, f)
				if err != nil {
					return err
				}
				header := []string{"NAME", "GROUP", "STATE", "OWNER", "TOKEN", "EXPIRES IN", "HELD FOR"}
				if g.output == "wide" {
					header = append(header, "ACQUIRED AT", "EXPIRES AT", "METADATA")
				}
				err = g.render(views, header, func() [][]string {
					var out [][]string
					for _, v := range views {
						row := []string{v.Name, orDash(v.Group), v.State, orDash(v.Owner), strconv.FormatInt(v.Token, 10), orDash(v.ExpiresIn), orDash(v.HeldFor)}
						if g.output == "wide" {
							row = append(row, orDash(v.AcquiredAt), orDash(v.ExpiresAt), orDash(string(v.Metadata)))
						}
						out = append(out, row)
					}
					return out
				})
				if cut != "" {
					g.sayCut([]string{cut})
				}
				return err
			})
		},
	}
	f.flags(g, cmd, "leases", false)
	cmd.Flags().StringVar(&f.state, "state", "held", "held, expired (expiry passed, not taken over yet), lock-delay (expired, its lock-delay not over), free, or all")
	cmd.Flags().BoolVar(&all, "all", false, "include free and expired leases (--state all)")
	cmd.Flags().StringVar(&f.after, "after", "", "start after this lease name: the next page of a list cut at --limit")
	cmd.Flags().BoolVar(&waiting, "waiting", false, "show who waits for leases, in queue order (pgbaton.lease_queue), instead")
	_ = cmd.RegisterFlagCompletionFunc("state", cobra.FixedCompletions(leaseStates, cobra.ShellCompDirectiveNoFileComp))
	_ = cmd.RegisterFlagCompletionFunc("after", g.completeNames(f.groupOf))
	return cmd
}

func (g *globals) leaseWaiters(cmd *cobra.Command, pool *pgxpool.Pool, f lockFilter) error {
	views, cut, err := readLeaseWaiters(cmd.Context(), pool, f)
	if err != nil {
		return err
	}
	err = g.renderWaiters(views)
	if cut != "" {
		g.sayCut([]string{cut})
	}
	return err
}

// readLeaseWaiters reads the wait queues f selects, by name and position,
// at most f.limit waiters; cut says so when there were more.
func readLeaseWaiters(ctx context.Context, pool *pgxpool.Pool, f lockFilter) ([]waiterView, string, error) {
	rows, err := admindb.New().LeaseWaiters(ctx, pool, admindb.LeaseWaitersParams{Prefix: f.prefix, Holder: f.holder, MaxRows: int32(f.limit) + 1})
	if err != nil {
		return nil, "", explainQueryError(err)
	}
	var cut string
	if len(rows) > f.limit {
		rows = rows[:f.limit]
		cut = fmt.Sprintf("showing the first %d lease waiters; there are more: pass a larger --limit, or narrow with --prefix or --holder", f.limit)
	}
	views := make([]waiterView, 0, len(rows))
	for _, r := range rows {
		views = append(views, waiterView{Name: r.Name, Group: r.IsGroup, Position: r.Position, Owner: r.Owner, Waiter: r.Waiter,
			Since: r.Since.UTC().Format(time.RFC3339), WaitingMs: r.WaitingMs,
			Waiting: fmtDuration(time.Duration(r.WaitingMs) * time.Millisecond)})
	}
	return views, cut, nil
}

// renderWaiters writes the wait queues: a table, one row per waiter, or
// the views as JSON or YAML.
func (g *globals) renderWaiters(views []waiterView) error {
	return g.render(views, waitersHeader(g.output == "wide"), func() [][]string { return waiterRows(views, g.output == "wide") })
}

func waitersHeader(wide bool) []string {
	header := []string{"LEASE OR GROUP", "KIND", "POSITION", "OWNER", "WAITER", "WAITED"}
	if wide {
		header = append(header, "SINCE")
	}
	return header
}

func waiterRows(views []waiterView, wide bool) [][]string {
	var out [][]string
	for _, v := range views {
		kind := "lease"
		if v.Group {
			kind = "group"
		}
		row := []string{v.Name, kind, strconv.FormatInt(v.Position, 10), orDash(v.Owner), v.Waiter, v.Waiting}
		if wide {
			row = append(row, v.Since)
		}
		out = append(out, row)
	}
	return out
}

// runView is one row of `pgbaton runs`.
type runView struct {
	ID         int64           `json:"id,string"`
	Job        string          `json:"job"`
	Status     string          `json:"status"`
	Owner      string          `json:"owner"`
	Token      int64           `json:"token,string"`
	StartedAt  string          `json:"started_at"`
	FinishedAt string          `json:"finished_at,omitempty"`
	Duration   string          `json:"duration"`
	Error      string          `json:"error,omitempty"`
	Checkpoint json.RawMessage `json:"checkpoint,omitempty"`
}

// pageFlags are --limit and --before of the lists newest first.
type pageFlags struct {
	limit  int
	before int64
}

func (p *pageFlags) flags(cmd *cobra.Command, what string) {
	cmd.Flags().IntVar(&p.limit, "limit", 50, "at most this many "+what+"; says so on stderr when there are more")
	cmd.Flags().Int64Var(&p.before, "before", 0, "only "+what+" with an id below this: the next page of a list cut at --limit")
}

func (p *pageFlags) check() error {
	if p.limit <= 0 || p.limit > 1_000_000 {
		return usageError{fmt.Errorf("--limit must be between 1 and 1000000")}
	}
	if p.before < 0 {
		return usageError{fmt.Errorf("--before must be a positive id")}
	}
	return nil
}

// cut is the note for a page of n+1 rows fetched for a limit of n, whose
// last shown row has id last.
func (p *pageFlags) cut(command, what string, last int64) string {
	return fmt.Sprintf("showing the newest %d %s; there are older ones: the next page is `pgbaton %s ... --before %d`", p.limit, what, command, last)
}

func newRunsCmd(g *globals) *cobra.Command {
	var prefix, status string
	var page pageFlags
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "Show job runs, newest first: status, duration, owner, token, last checkpoint",
		Example: `  pgbaton runs
  pgbaton runs --job nightly- --status failed
  pgbaton runs --limit 20 --before 1234   # the next page`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := page.check(); err != nil {
				return err
			}
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				rows, err := admindb.New().JobRuns(cmd.Context(), pool, admindb.JobRunsParams{Prefix: prefix, Status: status, Before: page.before, MaxRows: int32(page.limit) + 1})
				if err != nil {
					return explainQueryError(err)
				}
				var cut []string
				if len(rows) > page.limit {
					rows = rows[:page.limit]
					cut = append(cut, page.cut("runs", "runs", rows[len(rows)-1].ID))
				}
				views := make([]runView, 0, len(rows))
				for _, r := range rows {
					v := runView{
						ID: r.ID, Job: r.Job, Status: r.Status, Owner: r.Owner, Token: r.Token,
						StartedAt: r.StartedAt.UTC().Format(time.RFC3339), Error: r.Error,
						Duration: fmtDuration(time.Duration(r.DurationMs) * time.Millisecond),
					}
					if r.FinishedAt != nil {
						v.FinishedAt = r.FinishedAt.UTC().Format(time.RFC3339)
					}
					if r.Checkpoint != "" {
						v.Checkpoint = json.RawMessage(r.Checkpoint)
					}
					views = append(views, v)
				}
				header := []string{"ID", "JOB", "STATUS", "DURATION", "OWNER", "TOKEN", "CHECKPOINT"}
				if g.output == "wide" {
					header = append(header, "STARTED AT", "FINISHED AT", "ERROR")
				}
				err = g.render(views, header, func() [][]string {
					var out [][]string
					for _, v := range views {
						row := []string{strconv.FormatInt(v.ID, 10), v.Job, v.Status, v.Duration, v.Owner, strconv.FormatInt(v.Token, 10), orDash(string(v.Checkpoint))}
						if g.output == "wide" {
							row = append(row, v.StartedAt, orDash(v.FinishedAt), orDash(v.Error))
						}
						out = append(out, row)
					}
					return out
				})
				g.sayCut(cut)
				return err
			})
		},
	}
	cmd.Flags().StringVar(&prefix, "job", "", "only jobs whose name starts with this")
	cmd.Flags().StringVar(&status, "status", "", "only runs with this status (started, succeeded, failed, cancelled, lost)")
	page.flags(cmd, "runs")
	_ = cmd.RegisterFlagCompletionFunc("status", cobra.FixedCompletions([]string{"started", "succeeded", "failed", "cancelled", "lost"}, cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// eventView is one row of `pgbaton events`.
type eventView struct {
	ID       int64           `json:"id,string"`
	At       string          `json:"at"`
	Actor    string          `json:"actor"`
	Action   string          `json:"action"`
	Target   string          `json:"target"`
	Reason   string          `json:"reason"`
	OldToken *int64          `json:"old_token,omitempty,string"`
	NewToken *int64          `json:"new_token,omitempty,string"`
	Detail   json.RawMessage `json:"detail"`
}

func newEventsCmd(g *globals) *cobra.Command {
	var page pageFlags
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Show the audit log of forced releases, newest first",
		Example: `  pgbaton events
  pgbaton events -o wide            # with the released lock's details
  pgbaton events --limit 20 --before 77`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := page.check(); err != nil {
				return err
			}
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				rows, err := admindb.New().Events(cmd.Context(), pool, admindb.EventsParams{Before: page.before, MaxRows: int32(page.limit) + 1})
				if err != nil {
					return explainQueryError(err)
				}
				var cut []string
				if len(rows) > page.limit {
					rows = rows[:page.limit]
					cut = append(cut, page.cut("events", "events", rows[len(rows)-1].ID))
				}
				views := make([]eventView, 0, len(rows))
				for _, r := range rows {
					v := eventView{ID: r.ID, At: r.At.UTC().Format(time.RFC3339), Actor: r.Actor, Action: r.Action,
						Target: r.Target, Reason: r.Reason, Detail: json.RawMessage(r.Detail)}
					if r.OldToken.Valid {
						v.OldToken = &r.OldToken.Int64
					}
					if r.NewToken.Valid {
						v.NewToken = &r.NewToken.Int64
					}
					views = append(views, v)
				}
				header := []string{"ID", "AT", "ACTOR", "ACTION", "TARGET", "TOKENS", "REASON"}
				if g.output == "wide" {
					header = append(header, "DETAIL")
				}
				err = g.render(views, header, func() [][]string {
					var out [][]string
					for _, v := range views {
						tokens := "-"
						switch {
						case v.OldToken != nil && v.NewToken != nil:
							tokens = fmt.Sprintf("%d→%d", *v.OldToken, *v.NewToken)
						case v.OldToken != nil: // a request to resign: the term asked
							tokens = strconv.FormatInt(*v.OldToken, 10)
						}
						row := []string{strconv.FormatInt(v.ID, 10), v.At, v.Actor, v.Action, v.Target, tokens, v.Reason}
						if g.output == "wide" {
							row = append(row, string(v.Detail))
						}
						out = append(out, row)
					}
					return out
				})
				g.sayCut(cut)
				return err
			})
		},
	}
	page.flags(cmd, "events")
	return cmd
}
