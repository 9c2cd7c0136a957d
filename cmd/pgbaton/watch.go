package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/spf13/cobra"
)

func newWatchCmd(g *globals) *cobra.Command {
	var f lockFilter
	var interval time.Duration
	var count int
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "A live view of locks and leases with contention; Ctrl-C to stop",
		Long: `A live view of locks and leases with contention, redrawn every --interval.

On a terminal the screen is cleared before each view, like watch(1); piped or
redirected, the views follow each other with no control characters (JSON:
one document per view; YAML: documents separated by ---). Colour only on a
terminal and without NO_COLOR.`,
		Example: `  pgbaton watch
  pgbaton watch --prefix job: --interval 5s
  pgbaton watch --count 3 -o json > snapshots.json   # three views, then exit`,
		Args: exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return usageError{fmt.Errorf("--interval must be positive")}
			}
			if count < 0 {
				return usageError{fmt.Errorf("--count must not be negative")}
			}
			if err := f.check(); err != nil {
				return err
			}
			ctx := cmd.Context()
			err := g.withPool(ctx, func(pool *pgxpool.Pool) error { return g.watch(ctx, pool, f, interval, count) })
			if err != nil && ctx.Err() != nil {
				return nil // Ctrl-C while connecting or reading: a clean exit
			}
			return err
		},
	}
	f.flags(g, cmd, "locks and leases", true)
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "refresh interval")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many refreshes (0: until Ctrl-C)")
	return cmd
}

// watch redraws the locks every interval, count times (0: until ctx ends).
func (g *globals) watch(ctx context.Context, pool *pgxpool.Pool, f lockFilter, interval time.Duration, count int) error {
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for i := 0; count == 0 || i < count; i++ {
		rep, err := readLocks(ctx, pool, f)
		if err != nil {
			return err
		}
		switch {
		case g.output == "json":
		case g.output == "yaml":
			if i > 0 {
				fmt.Fprintln(g.stdout, "---")
			}
		default:
			if g.cursor() {
				fmt.Fprint(g.stdout, clearHome)
			} else if i > 0 {
				fmt.Fprintln(g.stdout) // a blank line between views
			}
			fmt.Fprintln(g.stdout, g.paint(sgrBold, fmt.Sprintf("pgbaton watch — %s — every %s", time.Now().Format(time.TimeOnly), interval)))
			summary, contended := contentionSummary(rep)
			if contended {
				summary = g.paint(sgrYellow, summary)
			}
			fmt.Fprintln(g.stdout, summary)
		}
		if err := g.renderLocks(rep); err != nil {
			return err
		}
		g.sayCut(rep.cut)
		if count != 0 && i == count-1 {
			break
		}
		select {
		case <-ctx.Done():
			return nil // Ctrl-C: a clean exit
		case <-tick.C:
		}
	}
	return nil
}

// contentionSummary is one line about the view; contended is true when
// anybody waits.
func contentionSummary(rep *locksReport) (string, bool) {
	held, waiting, contended := 0, 0, 0
	for _, a := range rep.Advisory {
		if a.Granted {
			held++
			if a.Waiters > 0 {
				contended++
			}
		} else {
			waiting++
		}
	}
	if rep.LeaseWaiters != nil { // --waiting: the wait queues instead of the held leases
		return fmt.Sprintf("advisory: %d held, %d contended, %d sessions waiting; leases: %d waiters", held, contended, waiting, len(rep.LeaseWaiters)),
			waiting > 0 || len(rep.LeaseWaiters) > 0
	}
	return fmt.Sprintf("advisory: %d held, %d contended, %d sessions waiting; leases: %d held", held, contended, waiting, len(rep.Leases)), waiting > 0
}
