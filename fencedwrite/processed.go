package fencedwrite

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// MarkProcessed records in tx that consumer has processed the message (or
// request) messageID: the idempotent consumer. Call it first in the
// transaction that does the message's work; the record commits with the
// work or not at all.
//
// A message already recorded returns an error wrapping ErrAlreadyProcessed
// and aborts tx (SQLSTATE PB409), so nothing done in tx can commit even if
// the error is ignored: roll back, acknowledge the message and move on. A
// second delivery that arrives while the first is still in its transaction
// waits for it: it gets ErrAlreadyProcessed if the first commits and goes
// ahead if the first rolls back. Under REPEATABLE READ or SERIALIZABLE
// such a wait can end in a serialization failure (40001) instead; retry,
// and the retry reports the repeat.
//
// consumer names the handler (one record per consumer and message), both
// 1 to 255 bytes. Records are kept until PruneProcessed removes them. The
// SQL twin is pgbaton.mark_processed(consumer, message_id).
func MarkProcessed(ctx context.Context, tx pgbaton.Tx, consumer, messageID string) error {
	switch {
	case isNil(tx):
		return fmt.Errorf("%w: nil transaction; MarkProcessed records in the transaction that does the work", pgbaton.ErrInvalidArgument)
	case consumer == "" || len(consumer) > maxName:
		return fmt.Errorf("%w: consumer must be 1 to %d bytes, got %d", pgbaton.ErrInvalidArgument, maxName, len(consumer))
	case messageID == "" || len(messageID) > maxName:
		return fmt.Errorf("%w: message id must be 1 to %d bytes, got %d", pgbaton.ErrInvalidArgument, maxName, len(messageID))
	}
	err := db.New().ProcessedMark(ctx, tx, db.ProcessedMarkParams{Consumer: consumer, MessageID: messageID})
	if err == nil {
		return nil
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == SQLStateAlreadyProcessed {
		return fmt.Errorf("%w: consumer %q, message %q (%s): %w", ErrAlreadyProcessed, consumer, messageID, pgErr.Detail, err)
	}
	return fmt.Errorf("fencedwrite: mark message %q processed for %q: %w", messageID, consumer, standbyError(ctx, tx, notMigrated(err)))
}

// Defaults of PruneConfig.
const (
	// DefaultRetention is how long processed-message records are kept by
	// default: longer than the redelivery window of most brokers.
	DefaultRetention = 7 * 24 * time.Hour
	// DefaultPruneBatch is how many records one pruning statement deletes
	// by default.
	DefaultPruneBatch = 1000
	// MaxPruneBatch is the largest PruneConfig.Batch.
	MaxPruneBatch = 100000
)

// PruneConfig configures PruneProcessed. The zero value is usable.
type PruneConfig struct {
	// Retention: records older than this, by the database clock, are
	// deleted. A message redelivered after its record is gone is
	// processed again, so keep it longer than the longest redelivery
	// (broker retention, retries, replays). Default DefaultRetention (7
	// days).
	Retention time.Duration
	// Batch is how many records each statement deletes, oldest first:
	// small batches keep every transaction, and its locks, short. Default
	// DefaultPruneBatch (1000), at most MaxPruneBatch.
	Batch int
}

func (c PruneConfig) withDefaults() (PruneConfig, error) {
	if c.Retention == 0 {
		c.Retention = DefaultRetention
	}
	if c.Batch == 0 {
		c.Batch = DefaultPruneBatch
	}
	switch {
	case c.Retention < time.Microsecond:
		return c, fmt.Errorf("%w: retention must be positive, got %s", pgbaton.ErrInvalidArgument, c.Retention)
	case c.Batch < 1 || c.Batch > MaxPruneBatch:
		return c, fmt.Errorf("%w: batch size must be 1 to %d, got %d", pgbaton.ErrInvalidArgument, MaxPruneBatch, c.Batch)
	}
	return c, nil
}

// PruneProcessed deletes the processed-message records older than
// cfg.Retention, cfg.Batch at a time, until none is left or ctx ends,
// and returns how many it deleted (also when it returns an error). With a
// pool each batch is a transaction of its own; inside a transaction q all
// batches are part of it. Concurrent calls (one per node) skip each
// other's rows rather than wait. Run it periodically; the SQL twin, one
// batch per call, is pgbaton.prune_processed(older_than, batch).
func PruneProcessed(ctx context.Context, q Querier, cfg PruneConfig) (int64, error) {
	if isNil(q) {
		return 0, fmt.Errorf("%w: nil pool, connection or transaction", pgbaton.ErrInvalidArgument)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return 0, err
	}
	params := db.ProcessedPruneParams{OlderThanSeconds: cfg.Retention.Seconds(), Batch: int32(cfg.Batch)}
	var total int64
	for {
		n, err := db.New().ProcessedPrune(ctx, q, params)
		if err != nil {
			return total, fmt.Errorf("fencedwrite: prune processed messages: %w", standbyError(ctx, q, notMigrated(err)))
		}
		total += int64(n)
		if int(n) < cfg.Batch {
			return total, nil
		}
	}
}
