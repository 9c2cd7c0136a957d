package admin

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton"
)

//go:embed templates static
var assets embed.FS

// shutdownGrace is how long Serve waits for requests in flight after its
// context ends. They see the same context cancelled, so they end quickly.
const shutdownGrace = 5 * time.Second

// Server serves the admin page and /metrics for one database. It is an
// http.Handler: mount it in your own server, under any path prefix, behind
// your own authentication (see the package example). Every link, form and
// redirect of the page is relative, so it works wherever it is mounted.
type Server struct {
	pool *pgxpool.Pool
	cfg  Config
	// csrf is drawn once per process: a form rendered by an earlier process
	// (or another serve process) is refused.
	csrf string
	// flashKey signs the outcome of a release carried across the redirect
	// that follows it, so that no other page can put words in its mouth.
	flashKey []byte
	page     *template.Template
	mux      *http.ServeMux
	origin   *http.CrossOriginProtection
	metrics  *metricDescs
}

// New returns a Server that reads from and releases through pool. The
// pool's user decides what the server may see (pgbaton_reader) and release
// (pgbaton_admin).
func New(pool *pgxpool.Pool, cfg Config) (*Server, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool", pgbaton.ErrInvalidArgument)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var b [64]byte
	if _, err := rand.Read(b[:]); err != nil {
		return nil, fmt.Errorf("admin: draw CSRF token: %w", err)
	}
	page, err := template.New("page.html").Funcs(templateFuncs).ParseFS(assets, "templates/page.html")
	if err != nil {
		return nil, fmt.Errorf("admin: parse templates: %w", err) // a build defect, caught by every test
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, fmt.Errorf("admin: static assets: %w", err)
	}
	s := &Server{
		pool: pool, cfg: cfg, csrf: hex.EncodeToString(b[:32]), flashKey: b[32:], page: page,
		mux: http.NewServeMux(), origin: http.NewCrossOriginProtection(), metrics: newMetricDescs(),
	}
	s.mux.HandleFunc("GET /{$}", s.handlePage)
	s.mux.HandleFunc("/release", s.handleRelease)
	s.mux.HandleFunc("/session", s.handleSession)
	s.mux.HandleFunc("GET /metrics", s.handleMetrics)
	s.mux.HandleFunc("GET /healthz", s.handleHealth)
	s.mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	return s, nil
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	// The page has a form that releases locks: no framing (clickjacking), no
	// scripts at all (auto-refresh is a <meta> tag), and forms may post only
	// to this origin.
	h.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
	h.Set("X-Frame-Options", "DENY")
	h.Set("X-Content-Type-Options", "nosniff")
	// Not no-referrer: with it browsers send "Origin: null" on POST, and the
	// origin check would refuse our own form.
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

// ListenAndServe listens on addr (host:port) and serves until ctx ends.
func (s *Server) ListenAndServe(ctx context.Context, addr string) error {
	// An empty host would listen on every interface: say so explicitly.
	if host, _, err := net.SplitHostPort(addr); err != nil || host == "" {
		return fmt.Errorf("%w: listen address %q must be host:port, e.g. 127.0.0.1:9187", pgbaton.ErrInvalidArgument, addr)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("admin: listen: %w", err)
	}
	return s.Serve(ctx, ln)
}

// Serve serves on ln until ctx ends, then shuts down gracefully and returns
// nil. It closes ln.
func (s *Server) Serve(ctx context.Context, ln net.Listener) error {
	if ln == nil {
		return fmt.Errorf("%w: nil listener", pgbaton.ErrInvalidArgument)
	}
	if host, _, err := net.SplitHostPort(ln.Addr().String()); err == nil {
		if ip := net.ParseIP(host); ip != nil && !ip.IsLoopback() {
			s.cfg.Logger.Warn("pgbaton admin: listening on a non-loopback address without TLS; the admin token crosses the network in clear text",
				"addr", ln.Addr().String())
		}
	}
	hs := &http.Server{
		Handler:           s,
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      s.cfg.QueryTimeout + 30*time.Second,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(s.cfg.Logger.Handler(), slog.LevelWarn),
		// Requests in flight are cancelled with ctx, so shutdown is quick.
		BaseContext: func(net.Listener) context.Context { return ctx },
	}
	errc := make(chan error, 1)
	go func() { errc <- hs.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("admin: serve: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), shutdownGrace)
	defer cancel()
	err := hs.Shutdown(sctx)
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) && err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("admin: shutdown: %w", err)
	}
	return nil
}

func (s *Server) handleHealth(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.QueryTimeout)
	defer cancel()
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if err := s.pool.Ping(ctx); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "database unreachable: %v\n", err)
		return
	}
	fmt.Fprintln(w, "ok")
}
