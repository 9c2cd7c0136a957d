package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/internal/db"
)

// advisoryLock is one row of `pgbaton locks` for an advisory lock.
type advisoryLock struct {
	Lock            string    `json:"lock"` // name if registered, else the key
	Name            string    `json:"name,omitempty"`
	Namespace       string    `json:"namespace,omitempty"`
	Key             *int64    `json:"key,omitempty"`
	Pair            *[2]int32 `json:"pair,omitempty"`
	Mode            string    `json:"mode"`
	Granted         bool      `json:"granted"`
	PID             int32     `json:"pid"`
	ApplicationName string    `json:"application_name"`
	ClientAddr      string    `json:"client_addr"`
	SessionSince    string    `json:"session_since,omitempty"`
	State           string    `json:"state"`
	Waiters         int32     `json:"waiters"`
	BlockedBy       []int32   `json:"blocked_by"`
}

// leaseView is one row of `pgbaton locks` and `pgbaton leases`.
type leaseView struct {
	Name       string          `json:"name"`
	Group      string          `json:"group,omitempty"`
	Owner      string          `json:"owner,omitempty"`
	Token      int64           `json:"token"`
	Held       bool            `json:"held"`
	AcquiredAt string          `json:"acquired_at,omitempty"`
	ExpiresAt  string          `json:"expires_at,omitempty"`
	ExpiresIn  string          `json:"expires_in,omitempty"`
	HeldFor    string          `json:"held_for,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
}

type locksReport struct {
	Advisory []advisoryLock `json:"advisory"`
	Leases   []leaseView    `json:"leases"`
}

type lockFilter struct {
	prefix  string
	group   string
	waiting bool
	limit   int
}

func (f *lockFilter) flags(cmd *cobra.Command, withWaiting bool) {
	cmd.Flags().StringVar(&f.prefix, "prefix", "", "only locks whose name starts with this")
	cmd.Flags().StringVar(&f.group, "group", "", "only leases of this group")
	cmd.Flags().IntVar(&f.limit, "limit", 1000, "at most this many leases")
	if withWaiting {
		cmd.Flags().BoolVar(&f.waiting, "waiting", false, "only advisory locks somebody waits for, and the waits")
	}
}

func newLocksCmd(g *globals) *cobra.Command {
	var f lockFilter
	cmd := &cobra.Command{
		Use:   "locks",
		Short: "Show every advisory lock and held lease, with holders and waiters",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			pool, err := g.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer pool.Close()
			rep, err := readLocks(cmd.Context(), pool, f)
			if err != nil {
				return err
			}
			return g.renderLocks(rep)
		},
	}
	f.flags(cmd, true)
	return cmd
}

func readLocks(ctx context.Context, pool *pgxpool.Pool, f lockFilter) (*locksReport, error) {
	if f.limit <= 0 {
		return nil, usageError{fmt.Errorf("--limit must be positive")}
	}
	q := db.New()
	rows, err := q.AdvisoryLocks(ctx, pool)
	if err != nil {
		return nil, explainQueryError(err)
	}
	rep := &locksReport{Advisory: []advisoryLock{}, Leases: []leaseView{}}
	for _, r := range rows {
		a := advisoryLock{
			Name: r.Name, Namespace: r.Namespace, Mode: r.Mode, Granted: r.Granted, PID: r.Pid,
			ApplicationName: r.ApplicationName, ClientAddr: r.ClientAddr, State: r.State,
			Waiters: r.Waiters, BlockedBy: r.BlockedBy,
		}
		if r.BackendStart != nil {
			a.SessionSince = r.BackendStart.UTC().Format(time.RFC3339)
		}
		if r.Objsubid == 2 {
			a.Pair = &[2]int32{r.Key1, r.Key2}
			a.Lock = fmt.Sprintf("(%d,%d)", r.Key1, r.Key2)
		} else {
			key := r.Key
			a.Key = &key
			a.Lock = strconv.FormatInt(key, 10)
		}
		if r.Name != "" {
			a.Lock = r.Name
			if r.Namespace != "" {
				a.Lock = r.Namespace + "/" + r.Name
			}
		}
		if f.prefix != "" && (r.Name == "" || !strings.HasPrefix(r.Name, f.prefix)) {
			continue
		}
		if f.waiting && r.Waiters == 0 && r.Granted {
			continue
		}
		rep.Advisory = append(rep.Advisory, a)
	}
	if f.waiting {
		return rep, nil // lease waiters are not visible in the database
	}
	leases, err := q.Leases(ctx, pool, db.LeasesParams{Prefix: f.prefix, LeaseGroup: f.group, IncludeFree: false, MaxRows: int32(f.limit)})
	if err != nil {
		return nil, explainQueryError(err)
	}
	for _, l := range leases {
		rep.Leases = append(rep.Leases, leaseFromRow(l))
	}
	return rep, nil
}

func leaseFromRow(l db.LeasesRow) leaseView {
	v := leaseView{Name: l.Name, Group: l.LeaseGroup, Owner: l.Owner, Token: l.Token, Held: l.Held}
	if l.AcquiredAt != nil {
		v.AcquiredAt = l.AcquiredAt.UTC().Format(time.RFC3339Nano)
	}
	if l.ExpiresAt != nil {
		v.ExpiresAt = l.ExpiresAt.UTC().Format(time.RFC3339Nano)
	}
	if l.Held {
		v.ExpiresIn = fmtDuration(time.Duration(l.ExpiresInMs) * time.Millisecond)
		v.HeldFor = fmtDuration(time.Duration(l.HeldForMs) * time.Millisecond)
	}
	if len(l.Metadata) > 0 && string(l.Metadata) != "{}" {
		v.Metadata = json.RawMessage(l.Metadata)
	}
	return v
}

// fmtDuration rounds for people: 1.2s, 45s, 3m20s, 2h5m.
func fmtDuration(d time.Duration) string {
	switch {
	case d < 0:
		return "-" + fmtDuration(-d)
	case d < 10*time.Second:
		return d.Round(100 * time.Millisecond).String()
	case d < time.Hour:
		return d.Round(time.Second).String()
	}
	return d.Round(time.Minute).String()
}

func (g *globals) renderLocks(rep *locksReport) error {
	wide := g.output == "wide"
	header := []string{"KIND", "LOCK", "HOLDER", "MODE/TOKEN", "STATE", "EXPIRES IN", "HELD FOR", "WAITERS"}
	if wide {
		header = append(header, "CLIENT", "SESSION SINCE", "BLOCKED BY", "GROUP")
	}
	return g.render(rep, header, func() [][]string {
		var rows [][]string
		for _, a := range rep.Advisory {
			state := "held"
			if !a.Granted {
				state = "waiting"
			}
			row := []string{"advisory", a.Lock, fmt.Sprintf("pid %d %s", a.PID, a.ApplicationName), a.Mode, state, "-", "-", strconv.Itoa(int(a.Waiters))}
			if wide {
				row = append(row, orDash(a.ClientAddr), orDash(a.SessionSince), fmtPids(a.BlockedBy), "-")
			}
			rows = append(rows, row)
		}
		for _, l := range rep.Leases {
			row := []string{"lease", l.Name, l.Owner, fmt.Sprintf("token %d", l.Token), "held", l.ExpiresIn, l.HeldFor, "-"}
			if wide {
				row = append(row, "-", "-", "-", orDash(l.Group))
			}
			rows = append(rows, row)
		}
		return rows
	})
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func fmtPids(pids []int32) string {
	if len(pids) == 0 {
		return "-"
	}
	s := make([]string, len(pids))
	for i, p := range pids {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}
