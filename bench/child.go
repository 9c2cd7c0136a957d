package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"
)

// runChild is the holder process of the SIGKILL scenarios: it takes the
// lock, says "held" and waits to be killed.
func runChild(mode, key string) error {
	ctx := context.Background()
	e := &env{dsn: os.Getenv("PGBATON_DSN"), redisAddr: os.Getenv("BENCH_REDIS")}
	if strings.HasPrefix(mode, "contend-") {
		return runContender(ctx, e, mode, key) // not a holder: loops, then reports
	}
	var h held
	var err error
	switch mode {
	case "adv-pgbaton", "adv-raw", "adv-pglock":
		newNode := map[string]func(context.Context) (lockNode, error){
			"adv-pgbaton": e.newPgbatonNode, "adv-raw": e.newRawNode, "adv-pglock": e.newPglockNode,
		}[mode]
		var n lockNode
		if n, err = newNode(ctx); err != nil {
			return err
		}
		var w lockWorker
		if w, err = n.worker(ctx); err != nil {
			return err
		}
		h, err = w.try(ctx, key)
	default:
		h, err = childExtra(ctx, e, mode, key)
	}
	if err != nil {
		return err
	}
	if h == nil {
		return fmt.Errorf("child %s: %s is held", mode, key)
	}
	fmt.Println("held")
	time.Sleep(time.Hour) // until SIGKILL
	return nil
}
