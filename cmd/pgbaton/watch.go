package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
)

func newWatchCmd(g *globals) *cobra.Command {
	var f lockFilter
	var interval time.Duration
	var count int
	cmd := &cobra.Command{
		Use:   "watch",
		Short: "A live view of locks and leases with contention; Ctrl-C to stop",
		Args:  exactArgs(0),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if interval <= 0 {
				return usageError{fmt.Errorf("--interval must be positive")}
			}
			ctx := cmd.Context()
			pool, err := g.connect(ctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil // Ctrl-C while connecting
				}
				return err
			}
			defer pool.Close()
			tick := time.NewTicker(interval)
			defer tick.Stop()
			for i := 0; count == 0 || i < count; i++ {
				rep, err := readLocks(ctx, pool, f)
				if err != nil {
					if ctx.Err() != nil {
						return nil
					}
					return err
				}
				if g.output != "json" {
					// Clear the screen and go home, like watch(1).
					fmt.Fprint(g.stdout, "\x1b[H\x1b[2J")
					fmt.Fprintf(g.stdout, "pgbaton watch — %s — every %s\n", time.Now().Format(time.TimeOnly), interval)
					fmt.Fprintln(g.stdout, contentionSummary(rep))
				}
				if err := g.renderLocks(rep); err != nil {
					return err
				}
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
		},
	}
	f.flags(cmd, true)
	cmd.Flags().DurationVar(&interval, "interval", 2*time.Second, "refresh interval")
	cmd.Flags().IntVar(&count, "count", 0, "stop after this many refreshes (0: until Ctrl-C)")
	return cmd
}

func contentionSummary(rep *locksReport) string {
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
	return fmt.Sprintf("advisory: %d held, %d contended, %d sessions waiting; leases: %d held", held, contended, waiting, len(rep.Leases))
}
