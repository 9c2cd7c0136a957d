package admin

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

const (
	// sessionCookie marks a browser in which the operator typed the admin
	// token: "expiry.mac", the MAC keyed with the token, so a session
	// outlives a restart of the server (and is valid on every replica with
	// the same token) but not a change of the token.
	sessionCookie = "pgbaton_admin_session"
	// flashCookie carries the outcome of a POST across the redirect that
	// follows it (POST-redirect-GET), signed with the process's flash key.
	flashCookie = "pgbaton_flash"
	flashTTL    = time.Minute
)

// handleSession unlocks releases in this browser (action=unlock, with the
// admin token) or locks them again (action=lock), then redirects back to
// the view the form was on. It runs the same origin and CSRF checks as a
// release.
func (s *Server) handleSession(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST only: use the form on the admin page", http.StatusMethodNotAllowed)
		return
	}
	status, fl := s.checkForm(w, r)
	if fl != nil {
		s.render(w, r, status, s.formFilter(r), fl)
		return
	}
	switch r.PostForm.Get("action") {
	case "unlock":
		if !equal(r.PostForm.Get("admin_token"), s.cfg.AdminToken) {
			s.cfg.Logger.Warn("pgbaton admin: unlock refused: wrong admin token", "remote", r.RemoteAddr)
			s.render(w, r, http.StatusForbidden, s.formFilter(r), &flash{Message: "wrong admin token: releases stay locked"})
			return
		}
		exp := time.Now().Add(s.cfg.SessionTTL).Unix()
		http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: strconv.FormatInt(exp, 10) + "." + s.sessionMAC(exp),
			MaxAge: int(s.cfg.SessionTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		s.cfg.Logger.Info("pgbaton admin: releases unlocked in a browser", "remote", r.RemoteAddr, "until", time.Unix(exp, 0).UTC())
		s.redirect(w, r, &flash{OK: true, Message: "releases unlocked in this browser for " + s.cfg.SessionTTL.String()})
	case "lock":
		http.SetCookie(w, &http.Cookie{Name: sessionCookie, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
		s.redirect(w, r, &flash{OK: true, Message: "releases locked in this browser"})
	default:
		s.render(w, r, http.StatusBadRequest, s.formFilter(r), &flash{Message: "action must be unlock or lock"})
	}
}

// sessionMAC signs a session's expiry with the admin token.
func (s *Server) sessionMAC(exp int64) string {
	m := hmac.New(sha256.New, []byte(s.cfg.AdminToken))
	m.Write([]byte("pgbaton admin session\x00" + strconv.FormatInt(exp, 10)))
	return hex.EncodeToString(m.Sum(nil))
}

// unlocked reports whether r comes from a browser that typed the admin
// token within the last SessionTTL.
func (s *Server) unlocked(r *http.Request) bool {
	if s.cfg.AdminToken == "" {
		return false
	}
	c, err := r.Cookie(sessionCookie)
	if err != nil {
		return false
	}
	expStr, mac, ok := strings.Cut(c.Value, ".")
	if !ok {
		return false
	}
	exp, err := strconv.ParseInt(expStr, 10, 64)
	if err != nil || time.Now().Unix() >= exp {
		return false
	}
	return equal(mac, s.sessionMAC(exp))
}

// redirect ends a POST that did what it was asked: the outcome goes into a
// signed cookie, and the browser is sent to the view it came from with a
// GET (303), so reloading the page never repeats the POST.
func (s *Server) redirect(w http.ResponseWriter, r *http.Request, fl *flash) {
	b, _ := json.Marshal(fl) // a struct of a bool and a string: cannot fail
	v := base64.RawURLEncoding.EncodeToString(b)
	http.SetCookie(w, &http.Cookie{Name: flashCookie, Value: v + "." + s.flashMAC(v), MaxAge: int(flashTTL / time.Second),
		HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	// Not http.Redirect: it would resolve "./" against the path this
	// handler sees, which lacks the prefix it is mounted under. The
	// browser resolves it against the URL it posted to.
	w.Header().Set("Location", returnURL(r.PostForm))
	w.WriteHeader(http.StatusSeeOther)
}

// takeFlash returns the outcome a redirect left, if its signature is this
// process's, and clears it so that a reload does not show it again.
func (s *Server) takeFlash(w http.ResponseWriter, r *http.Request) *flash {
	c, err := r.Cookie(flashCookie)
	if err != nil {
		return nil
	}
	http.SetCookie(w, &http.Cookie{Name: flashCookie, MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode, Secure: r.TLS != nil})
	v, mac, ok := strings.Cut(c.Value, ".")
	if !ok || !equal(mac, s.flashMAC(v)) {
		return nil
	}
	b, err := base64.RawURLEncoding.DecodeString(v)
	if err != nil {
		return nil
	}
	var fl flash
	if json.Unmarshal(b, &fl) != nil {
		return nil
	}
	return &fl
}

func (s *Server) flashMAC(v string) string {
	m := hmac.New(sha256.New, s.flashKey)
	m.Write([]byte(v))
	return hex.EncodeToString(m.Sum(nil))
}

// formFilter is the view a POSTed form came from, to render a refusal in.
func (s *Server) formFilter(r *http.Request) filter {
	if r.PostForm != nil {
		if q, err := parseQueryFilter(r.PostForm.Get("return")); err == nil {
			return q
		}
	}
	f, _ := parseFilter(nil)
	return f
}
