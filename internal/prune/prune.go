// Package prune is the machinery the pruning of leasetable (its own
// tables, in a Client's background loop) and of package retention (every
// other table) share: one pass of pgbaton.prune over a set of tables, and
// the jittered loop that runs passes under a lease.
package prune

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/internal/db"
)

// Rule is a table pgbaton.prune knows, with the setting of how long its
// rows are kept (a negative one keeps them forever) and the default for a
// zero setting.
type Rule struct {
	Table   string
	Keep    *time.Duration
	Default time.Duration
}

// Defaults checks the settings of a pruning loop, filling in the defaults
// of zero ones (Interval 1 minute, Batch 1000, each rule's Default), and
// says what is wrong, or "". what names the struct in the message.
func Defaults(what string, interval *time.Duration, batch *int, rules []Rule) string {
	if *interval == 0 {
		*interval = time.Minute
	}
	if *interval < 0 {
		return fmt.Sprintf("%s.Interval must be positive, got %s", what, *interval)
	}
	if *batch == 0 {
		*batch = 1000
	}
	if *batch < 0 || *batch > 100000 {
		return fmt.Sprintf("%s.Batch must be in 1..100000, got %d", what, *batch)
	}
	for _, r := range rules {
		if *r.Keep == 0 {
			*r.Keep = r.Default
		} else if *r.Keep > 0 && *r.Keep < time.Millisecond {
			return fmt.Sprintf("retention of %s must be at least 1ms, got %s", r.Table, *r.Keep)
		}
	}
	return ""
}

// Tables runs one pass over rules: batches of each table until one comes
// back short or ctx ends. It returns the rows deleted by table, also when
// a statement failed.
func Tables(ctx context.Context, pool db.DBTX, rules []Rule, batch int) (map[string]int, error) {
	q := db.New()
	out := map[string]int{}
	for _, r := range rules {
		keep := *r.Keep
		if keep < 0 {
			continue
		}
		p := db.PruneParams{TableName: r.Table, OlderThan: pgtype.Interval{Microseconds: keep.Microseconds(), Valid: true}, Batch: int32(batch)}
		for {
			n, err := q.Prune(ctx, pool, p)
			if err != nil {
				return out, fmt.Errorf("prune %s: %w", r.Table, err)
			}
			out[r.Table] += int(n)
			if int(n) < batch {
				break
			}
		}
	}
	return out, nil
}

// Lease is what a pass prunes under: a leasetable lease.
type Lease interface {
	Context() context.Context
	Err() error
	Release(ctx context.Context) error
}

// Loop calls pass every interval, with jitter so that a fleet started at
// once does not knock together, until ctx ends or pass returns an error,
// which it returns.
func Loop(ctx context.Context, interval time.Duration, pass func(ctx context.Context) error) error {
	t := time.NewTimer(interval/2 + rand.N(interval))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-t.C:
		}
		if err := pass(ctx); err != nil {
			return err
		}
		t.Reset(interval + rand.N(interval/10+1))
	}
}

// Under prunes with prune while l is held, stops when l is lost (another
// process may prune now), releases l and logs what it did.
func Under(l Lease, log *slog.Logger, prune func(ctx context.Context) (map[string]int, error)) {
	ctx := l.Context()
	defer func() { _ = l.Release(context.WithoutCancel(ctx)) }()
	start := time.Now()
	got, err := prune(ctx)
	total := 0
	for _, n := range got {
		total += n
	}
	switch {
	case err != nil && l.Err() == nil:
		log.Warn("pgbaton: pruning failed; trying again at the next pass", "error", err, "deleted", got)
	case total > 0:
		log.Info("pgbaton: pruned old rows", "deleted", got, "took", time.Since(start).Round(time.Millisecond))
	}
}

// Leased runs Loop with passes that each try to take the lease with take
// and, if they get it, prune with prune under it (Under), until ctx ends
// or take fails with pgbaton.ErrClosed (its client closed), which it
// returns. A pass that does not get the lease does nothing more: quietly
// when held(err) (the lease is held elsewhere) or ctx has ended, else
// after a Debug line.
func Leased(ctx context.Context, interval time.Duration, log *slog.Logger, take func(ctx context.Context) (Lease, error),
	held func(err error) bool, prune func(ctx context.Context) (map[string]int, error)) error {
	return Loop(ctx, interval, func(ctx context.Context) error {
		l, err := take(ctx)
		switch {
		case err == nil:
		case errors.Is(err, pgbaton.ErrClosed):
			return err
		case held(err), ctx.Err() != nil:
			return nil
		default:
			log.Debug("pgbaton: retention lease not taken", "error", err)
			return nil
		}
		Under(l, log, prune)
		return nil
	})
}
