package admin

import (
	"context"
	"crypto/subtle"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pgbaton/pgbaton/admin/admindb"
)

const (
	maxFormBytes  = 64 << 10
	maxReasonLen  = 1000
	maxTargetLen  = 1024
	formKind      = "kind"
	kindLease     = "lease"
	kindAdvisory  = "advisory"
	terminateSure = "yes"
)

// handleRelease force-releases a lease or terminates an advisory lock's
// holder, after the checks in the package comment. A release that happened
// redirects back to the view the form was on (POST-redirect-GET); a refusal
// renders the page with an error status and changes nothing.
func (s *Server) handleRelease(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "releases are POST only: use the form on the admin page", http.StatusMethodNotAllowed)
		return
	}
	status, fl := s.release(r.Context(), w, r)
	if status == http.StatusOK {
		s.redirect(w, r, fl)
		return
	}
	s.render(w, r, status, s.formFilter(r), fl)
}

// checkForm runs the checks every POST of the page passes before it may
// do anything: releases enabled, same origin, a readable form from this
// process's page (CSRF). It returns a refusal, or a nil flash.
func (s *Server) checkForm(w http.ResponseWriter, r *http.Request) (int, *flash) {
	refuse := s.refuser(r)
	if s.cfg.AdminToken == "" {
		return refuse(http.StatusForbidden, "releases are disabled: start pgbaton serve with --admin-token or PGBATON_ADMIN_TOKEN")
	}
	if err := s.origin.Check(r); err != nil {
		return refuse(http.StatusForbidden, "cross-origin request refused: use the form on this page")
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
	if err := r.ParseForm(); err != nil {
		return refuse(http.StatusBadRequest, "unreadable form: %v", err)
	}
	cookie, err := r.Cookie(csrfCookie)
	if err != nil || !equal(cookie.Value, s.csrf) || !equal(r.PostForm.Get("csrf"), s.csrf) {
		return refuse(http.StatusForbidden, "the form is stale (served by an earlier pgbaton serve) or was not sent from this page: reload and try again")
	}
	return 0, nil
}

type refuseFunc func(status int, format string, args ...any) (int, *flash)

func (s *Server) refuser(r *http.Request) refuseFunc {
	return func(status int, format string, args ...any) (int, *flash) {
		msg := fmt.Sprintf(format, args...)
		s.cfg.Logger.Warn("pgbaton admin: release refused", "reason", msg, "remote", r.RemoteAddr)
		return status, &flash{Message: msg}
	}
}

func (s *Server) release(ctx context.Context, w http.ResponseWriter, r *http.Request) (int, *flash) {
	if status, fl := s.checkForm(w, r); fl != nil {
		return status, fl
	}
	refuse := s.refuser(r)
	// The token typed once per browser session, or in the form itself
	// (for scripts, and browsers that refuse cookies).
	if !s.unlocked(r) && !equal(r.PostForm.Get("admin_token"), s.cfg.AdminToken) {
		return refuse(http.StatusForbidden, "wrong admin token: nothing was released")
	}
	reason := strings.TrimSpace(r.PostForm.Get("reason"))
	if reason == "" || len(reason) > maxReasonLen {
		return refuse(http.StatusBadRequest, "a reason of 1 to %d bytes is required: it goes into the audit log", maxReasonLen)
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.QueryTimeout)
	defer cancel()
	switch r.PostForm.Get(formKind) {
	case kindLease:
		return s.releaseLease(ctx, r, reason, refuse)
	case kindAdvisory:
		return s.terminateHolder(ctx, r, reason, refuse)
	}
	return refuse(http.StatusBadRequest, "kind must be %q or %q", kindLease, kindAdvisory)
}

func (s *Server) releaseLease(ctx context.Context, r *http.Request, reason string, refuse refuseFunc) (int, *flash) {
	name := r.PostForm.Get("name")
	if name == "" || len(name) > maxTargetLen {
		return refuse(http.StatusBadRequest, "a lease name of 1 to %d bytes is required", maxTargetLen)
	}
	var res admindb.ForceReleaseLeaseRow
	// The release and its audit row commit together, or neither does.
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		res, err = admindb.New().ForceReleaseLease(ctx, tx, admindb.ForceReleaseLeaseParams{Name: name, Reason: reason})
		return err
	})
	if err != nil {
		status, msg := explain(err)
		return refuse(status, "lease %s was not released: %s", name, msg)
	}
	s.cfg.Logger.Warn("pgbaton admin: lease force-released", "lease", name, "old_owner", res.OldOwner,
		"old_token", res.OldToken, "new_token", res.NewToken, "reason", reason, "remote", r.RemoteAddr)
	return http.StatusOK, &flash{OK: true, Message: fmt.Sprintf("released lease %s (was held by %s with token %d; next token %d). Its holder's fenced writes now fail.",
		name, res.OldOwner, res.OldToken, res.NewToken)}
}

func (s *Server) terminateHolder(ctx context.Context, r *http.Request, reason string, refuse refuseFunc) (int, *flash) {
	pid, err := strconv.ParseInt(r.PostForm.Get("pid"), 10, 32)
	if err != nil || pid <= 0 {
		return refuse(http.StatusBadRequest, "a positive backend pid is required")
	}
	target := r.PostForm.Get("target")
	if target == "" || len(target) > maxTargetLen {
		return refuse(http.StatusBadRequest, "the lock (target) of 1 to %d bytes is required", maxTargetLen)
	}
	if r.PostForm.Get("terminate") != terminateSure {
		return refuse(http.StatusBadRequest, "an advisory lock is freed only by ending the session that holds it, which frees every lock of that session: tick \"terminate the holder's session\" to do that")
	}
	var res admindb.TerminateAdvisoryHolderRow
	err = pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		res, err = admindb.New().TerminateAdvisoryHolder(ctx, tx, admindb.TerminateAdvisoryHolderParams{Pid: int32(pid), Target: target, Reason: reason})
		return err
	})
	if err != nil {
		status, msg := explain(err)
		return refuse(status, "backend %d was not terminated: %s", pid, msg)
	}
	s.cfg.Logger.Warn("pgbaton admin: advisory lock holder terminated", "pid", pid, "lock", target,
		"locks_held", res.LocksHeld, "terminated", res.Terminated, "reason", reason, "remote", r.RemoteAddr)
	if !res.Terminated {
		return http.StatusInternalServerError, &flash{Message: fmt.Sprintf("backend %d holding %s could not be terminated (pg_terminate_backend returned false); the attempt is in the audit log", pid, target)}
	}
	return http.StatusOK, &flash{OK: true, Message: fmt.Sprintf("terminated backend %d, freeing %s and the %d advisory lock(s) it held", pid, target, res.LocksHeld)}
}

// equal compares secrets in constant time.
func equal(got, want string) bool {
	return subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}
