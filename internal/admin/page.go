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

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton/internal/db"
)

// csrfCookie carries the per-process CSRF token next to the form's hidden
// field. SameSite=Strict keeps browsers from sending it with a request
// another site starts.
const csrfCookie = "pgbaton_csrf"

// flash is the outcome of a release, shown at the top of the page.
type flash struct {
	OK      bool
	Message string
}

// advisoryView is an advisory lock row with its display name: the
// registered name, else the bigint key, else the (int, int) pair.
type advisoryView struct {
	db.AdvisoryLocksRow
	Lock string
}

type pageData struct {
	Identity   db.AdminIdentityRow
	CanRelease bool
	CSRF       string
	Flash      *flash
	Error      string
	Advisory   []advisoryView
	Leases     []db.LeasesRow
	Runs       []db.JobRunsRow
	Events     []db.PgbatonEvent
	LockTable  db.LockTableUsageRow
	Limit      int
	Generated  time.Time
}

var templateFuncs = template.FuncMap{
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
	s.render(w, r, http.StatusOK, nil)
}

// render writes the page with status, or 503 if the database cannot be
// read; fl, when set, reports the outcome of a release.
func (s *Server) render(w http.ResponseWriter, r *http.Request, status int, fl *flash) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
	defer cancel()
	data, err := s.load(ctx)
	if err != nil {
		_, msg := explain(err)
		data.Error = "cannot read the database: " + msg
		s.cfg.Logger.Warn("pgbaton admin: page", "err", err)
		if status == http.StatusOK {
			status = http.StatusServiceUnavailable
		}
	}
	data.Flash = fl
	var buf bytes.Buffer
	if err := s.page.Execute(&buf, data); err != nil {
		s.cfg.Logger.Error("pgbaton admin: render page", "err", err)
		http.Error(w, "cannot render the page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: csrfCookie, Value: s.csrf, Path: "/", HttpOnly: true, SameSite: http.SameSiteStrictMode})
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

func (s *Server) load(ctx context.Context) (*pageData, error) {
	data := &pageData{CanRelease: s.cfg.AdminToken != "", CSRF: s.csrf, Limit: s.cfg.TopN, Generated: time.Now().UTC()}
	conn, err := s.pool.Acquire(ctx)
	if err != nil {
		return data, err
	}
	defer conn.Release()
	q := db.New()
	if data.Identity, err = q.AdminIdentity(ctx, conn); err != nil {
		return data, err
	}
	if data.LockTable, err = q.LockTableUsage(ctx, conn); err != nil {
		return data, err
	}
	locks, err := q.AdvisoryLocks(ctx, conn)
	if err != nil {
		return data, err
	}
	for _, l := range locks {
		data.Advisory = append(data.Advisory, advisoryView{AdvisoryLocksRow: l, Lock: lockLabel(l)})
	}
	limit := int32(s.cfg.TopN)
	if data.Leases, err = q.Leases(ctx, conn, db.LeasesParams{MaxRows: limit}); err != nil {
		return data, err
	}
	if data.Runs, err = q.JobRuns(ctx, conn, db.JobRunsParams{MaxRows: limit}); err != nil {
		return data, err
	}
	if data.Events, err = q.Events(ctx, conn, limit); err != nil {
		return data, err
	}
	return data, nil
}

func lockLabel(l db.AdvisoryLocksRow) string {
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
	case "42P01", "3F000", "42883": // undefined table, schema, function
		return http.StatusServiceUnavailable, "the pgbaton schema is missing or too old in this database: run `pgbaton migrate up`"
	case "42501": // insufficient privilege
		msg := pgErr.Message
		if pgErr.Hint != "" {
			msg += " (" + pgErr.Hint + ")"
		}
		return http.StatusForbidden, msg
	case "PB404":
		return http.StatusNotFound, pgErr.Message
	case "22023": // invalid_parameter_value
		return http.StatusBadRequest, pgErr.Message
	}
	return http.StatusInternalServerError, pgErr.Message
}
