package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"

	"github.com/pgbaton/pgbaton/admin/admindb"
)

// advisoryLock is one row of `pgbaton locks` for an advisory lock.
type advisoryLock struct {
	Lock            string    `json:"lock"` // name if registered, else the key
	Name            string    `json:"name,omitempty"`
	Namespace       string    `json:"namespace,omitempty"`
	Key             *int64    `json:"key,omitempty,string"`
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
	State      string          `json:"state"` // held, expired, lock-delay or free
	Owner      string          `json:"owner,omitempty"`
	Token      int64           `json:"token,string"`
	Held       bool            `json:"held"`
	AcquiredAt string          `json:"acquired_at,omitempty"`
	ExpiresAt  string          `json:"expires_at,omitempty"`
	ExpiresIn  string          `json:"expires_in,omitempty"`
	HeldFor    string          `json:"held_for,omitempty"`
	Metadata   json.RawMessage `json:"metadata,omitempty"`
	// LockDelayUntil is, in state lock-delay, when the lost grant's
	// lock-delay ends: nobody is granted the lease before it.
	LockDelayUntil string `json:"lock_delay_until,omitempty"`
}

type locksReport struct {
	Advisory []advisoryLock `json:"advisory"`
	Leases   []leaseView    `json:"leases"`
	// LeaseWaiters are the wait queues, with --waiting only (absent
	// without it; also on a standby, which cannot read them).
	LeaseWaiters []waiterView `json:"lease_waiters,omitzero"`
	// cut says how the output was cut short, and how to see the rest.
	cut []string
}

// lockFilter is what `locks`, `leases` and `watch` show.
type lockFilter struct {
	prefix  string
	group   string
	holder  string
	state   string // leases: held, expired, lock-delay, free, all
	after   string // leases after this name (the next page)
	waiting bool
	limit   int
}

// Lease states `leases --state` accepts.
var leaseStates = []string{"held", "expired", "lock-delay", "free", "all"}

func (f *lockFilter) flags(g *globals, cmd *cobra.Command, what string, withWaiting bool) {
	cmd.Flags().StringVar(&f.prefix, "prefix", "", "only "+what+" whose name starts with this")
	cmd.Flags().StringVar(&f.group, "group", "", "only leases of this group")
	cmd.Flags().StringVar(&f.holder, "holder", "", "only locks whose holder (lease owner, or advisory holder's application name or pid) contains this")
	cmd.Flags().IntVar(&f.limit, "limit", 1000, "at most this many leases (and advisory locks); says so on stderr when there are more")
	_ = cmd.RegisterFlagCompletionFunc("prefix", g.completeNames(f.groupOf))
	_ = cmd.RegisterFlagCompletionFunc("group", g.completeGroups)
	if withWaiting {
		cmd.Flags().BoolVar(&f.waiting, "waiting", false, "only advisory locks somebody waits for, the waits, and lease waiters")
	}
}

func (f *lockFilter) groupOf() string { return f.group }

func (f *lockFilter) check() error {
	if f.limit <= 0 || f.limit >= math.MaxInt32 {
		return usageError{fmt.Errorf("--limit must be between 1 and %d", math.MaxInt32-1)}
	}
	if f.state == "" {
		f.state = "held"
	}
	return oneOf("--state", f.state, leaseStates)
}

func newLocksCmd(g *globals) *cobra.Command {
	var f lockFilter
	cmd := &cobra.Command{
		Use:   "locks",
		Short: "Show every advisory lock and held lease, with holders and waiters",
		Example: `  pgbaton locks
  pgbaton locks --prefix job: --holder billing
  pgbaton locks --waiting -o wide   # contention: who waits for whom
  pgbaton locks -o json | jq '.advisory[] | select(.waiters > 0)'`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := f.check(); err != nil {
				return err
			}
			return g.withPool(cmd.Context(), func(pool *pgxpool.Pool) error {
				rep, err := readLocks(cmd.Context(), pool, f)
				if err != nil {
					return err
				}
				if err := g.renderLocks(rep); err != nil {
					return err
				}
				g.sayCut(rep.cut)
				return nil
			})
		},
	}
	f.flags(g, cmd, "locks and leases", true)
	return cmd
}

// sayCut tells on stderr (stdout stays parseable) that a list was cut
// short and how to get the rest.
func (g *globals) sayCut(cut []string) {
	for _, c := range cut {
		fmt.Fprintln(g.stderr, "pgbaton: "+c)
	}
}

func readLocks(ctx context.Context, pool *pgxpool.Pool, f lockFilter) (*locksReport, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	rep := &locksReport{Leases: []leaseView{}}
	var cuts [2]string
	var err error
	if rep.Advisory, cuts[0], err = readAdvisory(ctx, pool, f); err != nil {
		return nil, err
	}
	// With --waiting, the leases' side of contention is their wait
	// queues, as pgbaton leases --waiting shows them.
	if f.waiting {
		if rep.LeaseWaiters, cuts[1], err = readLeaseWaiters(ctx, pool, f); err != nil {
			if !errors.Is(err, errStandby) {
				return nil, err
			}
			rep.LeaseWaiters, cuts[1] = nil, "lease waiters are not shown: a standby cannot read them; connect to the primary"
		}
	} else {
		if rep.Leases, cuts[1], err = readLeases(ctx, pool, f); err != nil {
			return nil, err
		}
	}
	for _, c := range cuts {
		if c != "" {
			rep.cut = append(rep.cut, c)
		}
	}
	return rep, nil
}

// readAdvisory reads the advisory locks f selects, at most f.limit; cut
// says so when there were more.
func readAdvisory(ctx context.Context, pool *pgxpool.Pool, f lockFilter) ([]advisoryLock, string, error) {
	lockState := ""
	if f.waiting {
		lockState = "contended"
	}
	rows, err := admindb.New().AdvisoryLocks(ctx, pool, admindb.AdvisoryLocksParams{
		Prefix: f.prefix, Holder: f.holder, LockState: lockState, MaxRows: int32(f.limit) + 1,
	})
	if err != nil {
		return nil, "", explainQueryError(err)
	}
	var cut string
	if len(rows) > f.limit {
		rows = rows[:f.limit]
		cut = fmt.Sprintf("showing the first %d advisory locks; there are more: pass a larger --limit, or narrow with --prefix or --holder", f.limit)
	}
	locks := make([]advisoryLock, 0, len(rows))
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
		locks = append(locks, a)
	}
	return locks, cut, nil
}

// readLeases reads one page of leases; cut is the note that says how to
// get the next page, "" when this was the last.
func readLeases(ctx context.Context, pool *pgxpool.Pool, f lockFilter) ([]leaseView, string, error) {
	rows, err := admindb.New().Leases(ctx, pool, admindb.LeasesParams{
		Prefix: f.prefix, After: f.after, LeaseGroup: f.group, Holder: f.holder, LeaseState: f.state, MaxRows: int32(f.limit) + 1,
	})
	if err != nil {
		return nil, "", explainQueryError(err)
	}
	var cut string
	if len(rows) > f.limit {
		rows = rows[:f.limit]
		cut = fmt.Sprintf("showing the first %d leases; there are more: the next page is `pgbaton leases ... --after %s`", f.limit, shellQuote(rows[len(rows)-1].Name))
	}
	views := make([]leaseView, 0, len(rows))
	for _, r := range rows {
		views = append(views, leaseFromRow(r))
	}
	return views, cut, nil
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r == '-' || r == '_' || r == ':' || r == '.' || r == '/' || r == '@' || r == '=' || r == ',' ||
			(r >= 'a' && r <= 'z') || (r >= 'A' && r <= 'Z') || (r >= '0' && r <= '9'))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

func leaseFromRow(l admindb.LeasesRow) leaseView {
	v := leaseView{Name: l.Name, Group: l.LeaseGroup, State: l.LeaseState, Owner: l.Owner, Token: l.Token, Held: l.Held}
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
	if l.LockDelayUntil != nil {
		v.LockDelayUntil = l.LockDelayUntil.UTC().Format(time.RFC3339Nano)
		// EXPIRES IN says when it can be granted again.
		v.ExpiresIn = "delay " + fmtDuration(time.Until(*l.LockDelayUntil))
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
	if err := g.renderLockTable(rep); err != nil {
		return err
	}
	// With --waiting, the wait queues follow in a table of their own
	// (JSON and YAML have them in the report).
	if rep.LeaseWaiters == nil || g.output == "json" || g.output == "yaml" {
		return nil
	}
	fmt.Fprintln(g.stdout)
	return g.renderWaiters(rep.LeaseWaiters)
}

func (g *globals) renderLockTable(rep *locksReport) error {
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
			row := []string{"lease", l.Name, l.Owner, fmt.Sprintf("token %d", l.Token), l.State, l.ExpiresIn, l.HeldFor, "-"}
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
