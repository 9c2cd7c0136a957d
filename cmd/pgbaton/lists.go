package main

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/internal/db"
)

func newLeasesCmd(g *globals) *cobra.Command {
	var f lockFilter
	var all bool
	cmd := &cobra.Command{
		Use:   "leases",
		Short: "Show leases: held ones, or all with --all",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if f.limit <= 0 {
				return usageError{fmt.Errorf("--limit must be positive")}
			}
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := db.New().Leases(cmd.Context(), pool, db.LeasesParams{Prefix: f.prefix, LeaseGroup: f.group, IncludeFree: all, MaxRows: int32(f.limit)})
			if err != nil {
				return explainQueryError(err)
			}
			views := make([]leaseView, 0, len(rows))
			for _, r := range rows {
				views = append(views, leaseFromRow(r))
			}
			header := []string{"NAME", "GROUP", "OWNER", "TOKEN", "HELD", "EXPIRES IN", "HELD FOR"}
			if g.output == "wide" {
				header = append(header, "ACQUIRED AT", "EXPIRES AT", "METADATA")
			}
			return g.render(views, header, func() [][]string {
				var out [][]string
				for _, v := range views {
					row := []string{v.Name, orDash(v.Group), orDash(v.Owner), strconv.FormatInt(v.Token, 10), strconv.FormatBool(v.Held), orDash(v.ExpiresIn), orDash(v.HeldFor)}
					if g.output == "wide" {
						row = append(row, orDash(v.AcquiredAt), orDash(v.ExpiresAt), orDash(string(v.Metadata)))
					}
					out = append(out, row)
				}
				return out
			})
		},
	}
	f.flags(cmd, false)
	cmd.Flags().BoolVar(&all, "all", false, "include free and expired leases")
	return cmd
}

// runView is one row of `pgbaton runs`.
type runView struct {
	ID         int64           `json:"id"`
	Job        string          `json:"job"`
	Status     string          `json:"status"`
	Owner      string          `json:"owner"`
	Token      int64           `json:"token"`
	StartedAt  string          `json:"started_at"`
	FinishedAt string          `json:"finished_at,omitempty"`
	Duration   string          `json:"duration"`
	Error      string          `json:"error,omitempty"`
	Checkpoint json.RawMessage `json:"checkpoint,omitempty"`
}

func newRunsCmd(g *globals) *cobra.Command {
	var prefix, status string
	var limit int
	cmd := &cobra.Command{
		Use:   "runs",
		Short: "Show job runs, newest first: status, duration, owner, token, last checkpoint",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit <= 0 {
				return usageError{fmt.Errorf("--limit must be positive")}
			}
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := db.New().JobRuns(cmd.Context(), pool, db.JobRunsParams{Prefix: prefix, Status: status, MaxRows: int32(limit)})
			if err != nil {
				return explainQueryError(err)
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
			return g.render(views, header, func() [][]string {
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
		},
	}
	cmd.Flags().StringVar(&prefix, "job", "", "only jobs whose name starts with this")
	cmd.Flags().StringVar(&status, "status", "", "only runs with this status (started, succeeded, failed, cancelled, lost)")
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many runs")
	return cmd
}

// eventView is one row of `pgbaton events`.
type eventView struct {
	ID       int64           `json:"id"`
	At       string          `json:"at"`
	Actor    string          `json:"actor"`
	Action   string          `json:"action"`
	Target   string          `json:"target"`
	Reason   string          `json:"reason"`
	OldToken *int64          `json:"old_token,omitempty"`
	NewToken *int64          `json:"new_token,omitempty"`
	Detail   json.RawMessage `json:"detail"`
}

func newEventsCmd(g *globals) *cobra.Command {
	var limit int
	cmd := &cobra.Command{
		Use:   "events",
		Short: "Show the audit log of forced releases, newest first",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if limit <= 0 {
				return usageError{fmt.Errorf("--limit must be positive")}
			}
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			rows, err := db.New().Events(cmd.Context(), pool, int32(limit))
			if err != nil {
				return explainQueryError(err)
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
			return g.render(views, header, func() [][]string {
				var out [][]string
				for _, v := range views {
					tokens := "-"
					if v.OldToken != nil && v.NewToken != nil {
						tokens = fmt.Sprintf("%d→%d", *v.OldToken, *v.NewToken)
					}
					row := []string{strconv.FormatInt(v.ID, 10), v.At, v.Actor, v.Action, v.Target, tokens, v.Reason}
					if g.output == "wide" {
						row = append(row, string(v.Detail))
					}
					out = append(out, row)
				}
				return out
			})
		},
	}
	cmd.Flags().IntVar(&limit, "limit", 50, "at most this many events")
	return cmd
}
