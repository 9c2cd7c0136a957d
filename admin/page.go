package admin

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgerrcode"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton/admin/admindb"
)

// csrfCookie carries the per-process CSRF token next to the form's hidden
// field. SameSite=Strict keeps browsers from sending it with a request
// another site starts.
const csrfCookie = "pgbaton_csrf"

// sqlstateNotFound is pgbaton's own SQLSTATE for "no such lock" (raised by
// pgbaton.force_release_lease and terminate_advisory_holder); pgerrcode
// knows only PostgreSQL's.
const sqlstateNotFound = "PB404"

// flash is the outcome of a release or an unlock, shown at the top of the
// page.
type flash struct {
	OK      bool   `json:"ok"`
	Message string `json:"m"`
}

// advisoryView is an advisory lock row with its display name: the
// registered name, else the bigint key, else the (int, int) pair.
type advisoryView struct {
	admindb.AdvisoryLocksRow
	Lock string
}

type pageData struct {
	Identity  admindb.AdminIdentityRow
	Filter    filter
	Releases  bool // the server has an admin token
	Unlocked  bool // this browser typed it in (see session.go)
	CSRF      string
	Flash     *flash
	Error     string
	Advisory  []advisoryView
	Leases    []admindb.LeasesRow
	Waiters   []admindb.LeaseWaitersRow
	Elections []admindb.ElectionsRow
	Runs      []admindb.JobRunsRow
	Events    []admindb.PgbatonEvent
	LockTable admindb.LockTableUsageRow
	Grace     admindb.FailoverGraceRow
	Limit     int
	Generated time.Time

	// Pagination links (relative URLs, "" when there is no such page).
	AdvisoryPrev, AdvisoryNext, LeasesFirst, LeasesNext string
	// RefreshLinks link to this view with each auto-refresh interval.
	RefreshLinks []refreshLink
}

type refreshLink struct {
	Label, URL string
	Current    bool
}

var templateFuncs = template.FuncMap{
	"list": func(xs ...string) []string { return xs },
	// Whole seconds: the page is a snapshot, finer detail would be noise.
	"ms": func(ms int64) string { return (time.Duration(ms) * time.Millisecond).Round(time.Second).String() },
	"ts": func(t any) string {
		switch v := t.(type) {
		case time.Time:
			return v.UTC().Format("2006-01-02 15:04:05Z")
		case *time.Time:
			if v != nil {
				return v.UTC().Format("2006-01-02 15:04:05Z")
			}
		}
		return "-"
	},
	"pids": func(pids []int32) string {
		s := make([]string, len(pids))
		for i, p := range pids {
			s[i] = strconv.Itoa(int(p))
		}
		return strings.Join(s, ", ")
	},
	"pct": func(used, capacity int64) string {
		if capacity <= 0 {
			return "-"
		}
		return fmt.Sprintf("%.1f%%", 100*float64(used)/float64(capacity))
	},
}

func (s *Server) handlePage(w http.ResponseWriter, r *http.Request) {
	f, err := parseFilter(r.URL.Query())
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	s.render(w, r, http.StatusOK, f, s.takeFlash(w, r))
}

// render writes the page for filter f with status, or 503 if the database
// cannot be read; fl, when set, reports the outcome of a refused request.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, f filter, fl *flash) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
	defer cancel()
	data, err := s.load(ctx, f)
	if err != nil {
		_, msg := explain(err)
		data.Error = "cannot read the database: " + msg
		s.cfg.Logger.Warn("pgbaton admin: page", "error", err)
		if status == http.StatusOK {
			status = http.StatusServiceUnavailable
		}
	}
	data.Unlocked = data.Releases && s.unlocked(r)
	data.Flash = fl
	var buf bytes.Buffer
	if err := s.page.Execute(&buf, data); err != nil {
		s.cfg.Logger.Error("pgbaton admin: render page", "error", err)
		http.Error(w, "cannot render the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	// No Path: the browser scopes the cookie to the folder the page is
	// mounted at, which also holds /release and /session.
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: s.csrf, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) load(ctx context.Context, f filter) (*pageData, error) {
	data := &pageData{
		Filter: f, Releases: s.cfg.AdminToken != "", CSRF: s.csrf, Limit: s.cfg.TopN, Generated: time.Now().UTC(),
		RefreshLinks: f.refreshLinks(),
	}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return data, err
	}
	defer conn.Release()
	q := admindb.New()
	if data.Identity, err = q.AdminIdentity(ctx, conn); err != nil {
		return data, err
	}
	if data.LockTable, err = q.LockTableUsage(ctx, conn); err != nil {
		return data, err
	}
	if data.Grace, err = q.FailoverGrace(ctx, conn); err != nil {
		return data, err
	}
	// One row more than a page says whether there is a next page.
	limit := int32(s.cfg.TopN)
	locks, err := q.AdvisoryLocks(ctx, conn, admindb.AdvisoryLocksParams{
		Prefix: f.Prefix, Holder: f.Holder, LockState: f.Locks, MaxRows: limit + 1, SkipRows: int32(f.Offset),
	})
	if err != nil {
		return data, err
	}
	if len(locks) > s.cfg.TopN {
		locks = locks[:s.cfg.TopN]
		data.AdvisoryNext = f.with(func(n *filter) { n.Offset += s.cfg.TopN })
	}
	if f.Offset > 0 {
		data.AdvisoryPrev = f.with(func(n *filter) { n.Offset = max(0, n.Offset-s.cfg.TopN) })
	}
	for _, l := range locks {
		data.Advisory = append(data.Advisory, advisoryView{AdvisoryLocksRow: l, Lock: lockLabel(l)})
	}
	leases, err := q.Leases(ctx, conn, admindb.LeasesParams{
		Prefix: f.Prefix, After: f.After, Holder: f.Holder, LeaseState: f.State, MaxRows: limit + 1,
	})
	if err != nil {
		return data, err
	}
	if len(leases) > s.cfg.TopN {
		leases = leases[:s.cfg.TopN]
		last := leases[len(leases)-1].Name
		data.LeasesNext = f.with(func(n *filter) { n.After = last })
	}
	if f.After != "" {
		data.LeasesFirst = f.with(func(n *filter) { n.After = "" })
	}
	data.Leases = leases
	// A standby cannot read the (unlogged) waiter registry.
	if !data.Identity.InRecovery {
		if data.Waiters, err = q.LeaseWaiters(ctx, conn, admindb.LeaseWaitersParams{Prefix: f.Prefix, Holder: f.Holder, MaxRows: limit}); err != nil {
			return data, err
		}
	}
	if data.Elections, err = q.Elections(ctx, conn, admindb.ElectionsParams{Prefix: f.Prefix, Holder: f.Holder, MaxRows: limit}); err != nil {
		return data, err
	}
	if data.Runs, err = q.JobRuns(ctx, conn, admindb.JobRunsParams{Prefix: f.Prefix, MaxRows: limit}); err != nil {
		return data, err
	}
	if data.Events, err = q.Events(ctx, conn, admindb.EventsParams{MaxRows: limit}); err != nil {
		return data, err
	}
	return data, nil
}

func lockLabel(l admindb.AdvisoryLocksRow) string {
	switch {
	case l.Name != "" && l.Namespace != "":
		return l.Namespace + "/" + l.Name
	case l.Name != "":
		return l.Name
	case l.Objsubid == 2:
		return fmt.Sprintf("(%d,%d)", l.Key1, l.Key2)
	}
	return strconv.FormatInt(l.Key, 10)
}

// explain maps a database error to an HTTP status and a message that says
// what to do.
func explain(err error) (int, string) {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return http.StatusGatewayTimeout, "the database did not answer in time"
	case !errors.As(err, &pgErr):
		return http.StatusServiceUnavailable, err.Error()
	}
	switch pgErr.Code {
	case pgerrcode.UndefinedTable, pgerrcode.InvalidSchemaName, pgerrcode.UndefinedFunction:
		return http.StatusServiceUnavailable, "the pgbaton schema is missing or too old in this database: run `pgbaton migrate up`"
	case pgerrcode.InsufficientPrivilege:
		msg := pgErr.Message
		if pgErr.Hint != "" {
			msg += " (" + pgErr.Hint + ")"
		}
		return http.StatusForbidden, msg
	case sqlstateNotFound:
		return http.StatusNotFound, pgErr.Message
	case pgerrcode.InvalidParameterValue:
		return http.StatusBadRequest, pgErr.Message
	}
	return http.StatusInternalServerError, pgErr.Message
}
