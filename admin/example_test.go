package admin_test

import (
	"context"
	"log"
	"net/http"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/admin"
)

// Mount the admin page in your own server, under a path prefix, behind
// your own authentication. The page's links, forms and redirects are
// relative, so http.StripPrefix is all it needs. Your middleware decides
// who reaches the page; the admin token (typed once per browser session)
// and the pool's database role (pgbaton_admin) still guard every release,
// and the audit log records it.
func Example_mount() {
	ctx := context.Background()
	// A database user in role pgbaton_reader sees; pgbaton_admin releases.
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	page, err := admin.New(pool, admin.Config{
		AdminToken: os.Getenv("PGBATON_ADMIN_TOKEN"), // empty: read-only
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("/ops/pgbaton/", requireSSO(http.StripPrefix("/ops/pgbaton", page)))
	log.Fatal(http.ListenAndServe("127.0.0.1:8080", mux))
}

// requireSSO stands for your own authentication middleware.
func requireSSO(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("X-Forwarded-User") == "" { // e.g. set by your auth proxy
			http.Error(w, "sign in first", http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}
