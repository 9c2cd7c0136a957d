// Package health turns pgbaton's Check methods into an HTTP readiness
// endpoint, for Kubernetes probes and load balancers.
//
//	mux.Handle("/readyz", health.Handler(health.Checks{
//		"advisory": locker,
//		"leases":   client,
//	}))
//
// The handler answers 200 with a JSON body when every check passes within
// the timeout, and 503 naming the failed checks otherwise. A check that
// reports only a degraded mode (an error wrapping pgbaton.ErrDegraded, such
// as lease waiters polling behind a transaction pooler) keeps the answer
// 200, with status "degraded" and the reason in the body.
//
// [Operating] says what makes the probe fail, and [Running in production]
// why asynchronous replication does not (wrap leasetable's
// Client.Replication in a CheckerFunc to make it).
//
// [Operating]: https://github.com/pgbaton/pgbaton/blob/main/docs/operating.md
// [Running in production]: https://github.com/pgbaton/pgbaton/blob/main/docs/production.md
package health

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/pgbaton/pgbaton"
)

// Checker is anything with a health check: advisory.Locker and
// leasetable.Client are.
type Checker interface {
	Check(ctx context.Context) error
}

// CheckerFunc adapts a function to Checker.
type CheckerFunc func(ctx context.Context) error

// Check calls f.
func (f CheckerFunc) Check(ctx context.Context) error { return f(ctx) }

// Checks names the checks a Handler runs.
type Checks map[string]Checker

// DefaultTimeout bounds all checks of one request together.
const DefaultTimeout = 2 * time.Second

// Report is the JSON body of a Handler's answer.
type Report struct {
	Status string            `json:"status"` // "ok", "degraded" or "unavailable"
	Checks map[string]string `json:"checks"` // name → "ok", or the error
}

// Run runs every check concurrently and reports them all.
func Run(ctx context.Context, checks Checks) Report {
	rep := Report{Status: "ok", Checks: make(map[string]string, len(checks))}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for name, c := range checks {
		wg.Go(func() {
			res, status := "ok", "ok"
			if c == nil {
				res, status = "no checker", "unavailable"
			} else if err := c.Check(ctx); err != nil {
				res, status = err.Error(), "unavailable"
				if onlyDegraded(err) {
					status = "degraded"
				}
			}
			mu.Lock()
			defer mu.Unlock()
			rep.Checks[name] = res
			switch {
			case status == "unavailable":
				rep.Status = status
			case status == "degraded" && rep.Status == "ok":
				rep.Status = status
			}
		})
	}
	wg.Wait()
	return rep
}

// Handler answers GET and HEAD with the checks' Report: 200 when all pass,
// 503 otherwise. Checks share one DefaultTimeout.
func Handler(checks Checks) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), DefaultTimeout)
		defer cancel()
		rep := Run(ctx, checks)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		if rep.Status == "unavailable" {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
		if r.Method == http.MethodGet {
			_ = json.NewEncoder(w).Encode(rep)
		}
	})
}

// onlyDegraded reports whether err, and every error joined in it, wraps
// pgbaton.ErrDegraded.
func onlyDegraded(err error) bool {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range joined.Unwrap() {
			if !onlyDegraded(e) {
				return false
			}
		}
		return true
	}
	return errors.Is(err, pgbaton.ErrDegraded)
}
