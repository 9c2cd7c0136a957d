package admin

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/pgbaton/pgbaton"
)

// MinAdminTokenLength is the shortest admin token New accepts: the token is
// all that stands between someone who can reach the port and a forced
// release, so it must not be guessable.
const MinAdminTokenLength = 16

// Config configures a Server. The zero value is a read-only server with the
// documented defaults.
type Config struct {
	// AdminToken enables the release form: an operator must type it in to
	// release anything. Empty (the default) makes the page read-only. At
	// least MinAdminTokenLength bytes.
	AdminToken string

	// Logger receives forced releases, refused release attempts and
	// scrape errors. Default: silent.
	Logger *slog.Logger

	// TopN bounds the per-group and per-lease series of /metrics and the
	// rows per table (per page of a table) on the page. Default 50.
	TopN int

	// QueryTimeout bounds every database round of a page, a scrape or a
	// release. Default 10s.
	QueryTimeout time.Duration

	// SessionTTL is how long a browser stays unlocked after the operator
	// typed the admin token once: the page then shows release forms
	// without asking for it again. The session cookie is signed with the
	// admin token, so changing the token ends every session. Default 8h.
	SessionTTL time.Duration

	// Version is the version label of pgbaton_build_info. Default: the
	// version of this module as linked into the running binary (from its
	// build info), "(devel)" in a build from a checkout.
	Version string

	// Revision is the revision label of pgbaton_build_info. Default: the
	// VCS commit recorded in the running binary's build info, if any.
	Revision string
}

func (c Config) withDefaults() (Config, error) {
	if c.AdminToken != "" && len(c.AdminToken) < MinAdminTokenLength {
		return c, fmt.Errorf("%w: admin token is %d bytes; use at least %d random bytes (e.g. openssl rand -hex 16)",
			pgbaton.ErrInvalidArgument, len(c.AdminToken), MinAdminTokenLength)
	}
	if c.TopN < 0 || c.TopN > 10000 {
		return c, fmt.Errorf("%w: TopN must be between 1 and 10000 (0 for the default 50), got %d", pgbaton.ErrInvalidArgument, c.TopN)
	}
	if c.QueryTimeout < 0 {
		return c, fmt.Errorf("%w: QueryTimeout must not be negative, got %s", pgbaton.ErrInvalidArgument, c.QueryTimeout)
	}
	if c.SessionTTL < 0 {
		return c, fmt.Errorf("%w: SessionTTL must not be negative, got %s", pgbaton.ErrInvalidArgument, c.SessionTTL)
	}
	if c.SessionTTL == 0 {
		c.SessionTTL = 8 * time.Hour
	}
	if c.Version == "" {
		c.Version = moduleVersion()
	}
	if c.Revision == "" {
		c.Revision = revision()
	}
	if c.TopN == 0 {
		c.TopN = 50
	}
	if c.QueryTimeout == 0 {
		c.QueryTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}
