package retention

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/internal/prune"
	"github.com/pgbaton/pgbaton/internal/refusal"
)

// Pruned counts the rows a pruning pass deleted, by table.
type Pruned map[string]int

// Prune runs one pruning pass over every table of Config: batches of each
// until one comes back short or ctx ends. It does not take
// leasetable.RetentionLease; Run does. Use it from a scheduled job of
// your own instead of Run.
func Prune(ctx context.Context, pool *pgxpool.Pool, cfg Config) (Pruned, error) {
	if pool == nil {
		return nil, invalid("nil pool")
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return cfg.prune(ctx, pool)
}

func (c Config) prune(ctx context.Context, pool *pgxpool.Pool) (Pruned, error) {
	got, err := prune.Tables(ctx, pool, c.rules(), c.Batch)
	if err != nil {
		err = refusal.Wrap("retention", err)
	}
	return got, err
}
