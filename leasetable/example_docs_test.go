package leasetable_test

// The Go blocks of README.md and docs/ that use leases, each the body of a
// function below that an example runs (TestDocsCodeBlocksAreCompiled in
// the root package checks that the blocks and these functions agree).

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgbaton/pgbaton/fencedwrite"
	"github.com/pgbaton/pgbaton/leasetable"
	"github.com/pgbaton/pgbaton/migrations"
)

// nightlyReport is README.md's leasetable snippet.
func nightlyReport(ctx context.Context, pool *pgxpool.Pool) error {
	client, err := leasetable.New(ctx, pool, leasetable.Config{TTL: 15 * time.Second}) // one Client per process
	if err != nil {
		return err
	}
	defer client.Close(ctx)

	lease, err := client.Acquire(ctx, "nightly-report") // waits; woken when the holder releases
	if err != nil {
		return err
	}
	defer lease.Release(ctx)
	return report(lease.Context(), lease.Token()) // the context ends if the lease is lost; the token fences writes
}

func report(ctx context.Context, token int64) error {
	fmt.Println("reporting under a token:", token > 0)
	return ctx.Err()
}

func ExampleClient_Acquire() {
	pool, done := examplePool()
	defer done()
	fmt.Println(nightlyReport(context.Background(), pool))
	// Output:
	// reporting under a token: true
	// <nil>
}

// enqueue is docs/work-queues.md's producer.
func enqueue(ctx context.Context, client *leasetable.Client, mailIDs ...string) error {
	_, err := client.Register(ctx, "mail", mailIDs...) // one call per burst: waiting workers wake once
	return err
}

// startMailer is docs/work-queues.md's setup of a worker process.
func startMailer(ctx context.Context, databaseURL string) (*pgxpool.Pool, *leasetable.Client, error) {
	pool, err := pgxpool.New(ctx, databaseURL) // the pool the worker's own transactions use too
	if err != nil {
		return nil, nil, err
	}
	if err := migrations.Up(ctx, pool); err != nil { // installs or upgrades the pgbaton schema; safe from many processes at once
		pool.Close()
		return nil, nil, err
	}
	client, err := leasetable.New(ctx, pool, leasetable.Config{}) // one Client per process; the default Owner, hostname:pid:random, is unique to it
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, client, nil
}

// sendMail is docs/work-queues.md's exactly-once worker loop.
func sendMail(ctx context.Context, pool *pgxpool.Pool, client *leasetable.Client) error {
	for {
		batch, err := client.ClaimWait(ctx, "mail", 10) // waits for items: woken by Register, releases, expiries
		if err != nil {
			return err // ctx ended, or the client was closed
		}
		for _, item := range batch {
			if err := sendOne(pool, client, item); err != nil {
				log.Printf("%s not sent: %v", item.Name(), err)
				_ = item.Release(ctx) // claimable again at once; a no-op if the lease already moved on
			}
		}
	}
}

// sendOne sends one mail and completes its item in the same transaction.
func sendOne(pool *pgxpool.Pool, client *leasetable.Client, item *leasetable.Lease) error {
	err := pgx.BeginFunc(item.Context(), pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(item.Context(), "INSERT INTO sent (mail) VALUES ($1)", item.Name()); err != nil {
			return err
		}
		return client.CompleteTx(item.Context(), tx, item) // fails, and aborts tx, if the lease moved on
	})
	if cause := context.Cause(item.Context()); err != nil && cause != nil {
		// Lost mid-way: pgx says "context canceled", the cause says why (ErrLeaseLost).
		err = fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// A worker sends each registered mail exactly once, then waits for more
// until it is stopped.
func Example_workQueue() {
	db, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := db.Exec(ctx, "CREATE TABLE sent (mail text PRIMARY KEY)"); err != nil {
		log.Fatal(err)
	}
	pool, client, err := startMailer(ctx, db.Config().ConnString())
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	defer client.Close(ctx)

	wctx, stop := context.WithCancel(ctx)
	stopped := make(chan error)
	go func() { stopped <- sendMail(wctx, pool, client) }()
	if err := enqueue(ctx, client, "mail-1", "mail-2", "mail-3"); err != nil {
		log.Fatal(err)
	}
	for n := 0; n < 3; time.Sleep(10 * time.Millisecond) {
		if err := pool.QueryRow(ctx, "SELECT count(*) FROM sent").Scan(&n); err != nil {
			log.Fatal(err)
		}
	}
	stop()
	fmt.Println("worker stopped:", errors.Is(<-stopped, context.Canceled))
	rows, _ := pool.Query(ctx, "SELECT mail FROM sent ORDER BY mail")
	sent, err := pgx.CollectRows(rows, pgx.RowTo[string])
	fmt.Println(sent, err)
	// Output:
	// worker stopped: true
	// [mail-1 mail-2 mail-3] <nil>
}

// importAll is docs/work-queues.md's loop over a batch that ends.
func importAll(ctx context.Context, client *leasetable.Client) error {
	for {
		batch, err := client.ClaimUntilDrained(ctx, "import", 10)
		if errors.Is(err, leasetable.ErrDrained) {
			return nil // every item of the batch is done, by this worker or another
		}
		if err != nil {
			return err // ctx ended, or the client was closed
		}
		for _, item := range batch {
			importOne(item.Context(), item.Name()) // idempotent
		}
		if err := client.Complete(ctx, batch...); err != nil {
			log.Print(err) // wraps ErrNotHeld: an item was lost, and is done again by whoever claims it
		}
	}
}

var imported = make(chan string, 10)

func importOne(_ context.Context, name string) { imported <- name }

// Two workers share a batch of three items, and both stop when it is
// done.
func ExampleClient_ClaimUntilDrained() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	if _, err := client.Register(ctx, "import", "row-1", "row-2", "row-3"); err != nil {
		log.Fatal(err)
	}

	stopped := make(chan error)
	for range 2 {
		go func() { stopped <- importAll(ctx, client) }()
	}
	fmt.Println(<-stopped, <-stopped)
	close(imported)
	var names []string
	for name := range imported {
		names = append(names, name)
	}
	slices.Sort(names)
	fmt.Println(names)
	counts, err := client.Counts(ctx, "import")
	fmt.Println(counts.Drained(), err)
	// Output:
	// <nil> <nil>
	// [row-1 row-2 row-3]
	// true <nil>
}

// renderThumbnails is docs/work-queues.md's loop for idempotent effects.
func renderThumbnails(ctx context.Context, client *leasetable.Client) error {
	batch, err := client.ClaimWait(ctx, "thumbnails", 100)
	for err == nil {
		for _, item := range batch {
			render(item.Context(), item.Name()) // idempotent: rendering twice does no harm
		}
		batch, err = client.CompleteAndClaim(ctx, "thumbnails", 100, batch...)
		if errors.Is(err, leasetable.ErrNotHeld) {
			log.Print(err) // some items were lost before completion: they are rendered again
			err = nil
		}
		if err == nil && len(batch) == 0 {
			batch, err = client.ClaimWait(ctx, "thumbnails", 100)
		}
	}
	return err
}

var rendered = make(chan string, 10)

func render(_ context.Context, name string) { rendered <- name }

func Example_idempotentWorkQueue() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	if _, err := client.Register(ctx, "thumbnails", "img-1", "img-2", "img-3"); err != nil {
		log.Fatal(err)
	}

	wctx, stop := context.WithCancel(ctx)
	stopped := make(chan error)
	go func() { stopped <- renderThumbnails(wctx, client) }()
	for range 3 {
		fmt.Println("rendered", <-rendered)
	}
	stop()
	fmt.Println("worker stopped:", errors.Is(<-stopped, context.Canceled))
	// Output:
	// rendered img-1
	// rendered img-2
	// rendered img-3
	// worker stopped: true
}

// consumeOrders is docs/shards.md's worker.
func consumeOrders(ctx context.Context, client *leasetable.Client) error {
	shards := make([]string, 16)
	for i := range shards {
		shards[i] = fmt.Sprintf("orders-%02d", i)
	}
	if _, err := client.Register(ctx, "orders", shards...); err != nil { // every worker may call it: known names stay as they are
		return err
	}
	return client.Keep(ctx, leasetable.KeepConfig{
		Group: "orders",
		Max:   4, // 16 shards over 4 workers
		Work: func(ctx context.Context, shard *leasetable.Lease) {
			consume(ctx, shard.Name(), shard.Token()) // until ctx ends: the lease was lost, or Keep's ctx ended
		},
	})
}

// shardOf is docs/shards.md's routing of a key to its shard.
func shardOf(orderID string) string {
	return fmt.Sprintf("orders-%02d", crc32.ChecksumIEEE([]byte(orderID))%16)
}

var consuming = make(chan string, 16)

func consume(ctx context.Context, shard string, _ int64) {
	consuming <- shard
	<-ctx.Done()
}

func Example_shards() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "worker-1"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	wctx, stop := context.WithCancel(ctx)
	stopped := make(chan error)
	go func() { stopped <- consumeOrders(wctx, client) }()
	held := map[string]bool{}
	for range 4 {
		held[<-consuming] = true
	}
	stop()
	fmt.Println("worker-1 held", len(held), "shards; Keep:", <-stopped)
	fmt.Println("order 1042 goes to", shardOf("1042"))
	// Output:
	// worker-1 held 4 shards; Keep: context canceled
	// order 1042 goes to orders-15
}

// exportWithPermit is docs/shards.md's semaphore.
func exportWithPermit(ctx context.Context, client *leasetable.Client) error {
	permit, err := client.Semaphore(ctx, "exports", 3) // waits while all 3 permits are held
	if err != nil {
		return err
	}
	defer permit.Release(ctx)
	return runExport(permit.Context()) // ends if the permit's lease is lost
}

func runExport(ctx context.Context) error {
	fmt.Println("exporting")
	return ctx.Err()
}

func Example_semaphore() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)
	fmt.Println(exportWithPermit(ctx, client))
	// Output:
	// exporting
	// <nil>
}

// campaign is docs/leader-election.md's campaign.
func campaign(ctx context.Context, pool *pgxpool.Pool, client *leasetable.Client) error {
	return client.Campaign(ctx, "scheduler", "10.0.0.7:8080", leasetable.Callbacks{
		OnStartedLeading: func(ctx context.Context, term int64) {
			runScheduler(ctx, pool, term) // until ctx ends: leadership lost (ErrLeaseLost) or Campaign's ctx ended
		},
		OnStoppedLeading: func() { log.Print("no longer the leader") },
	})
}

// advance is docs/leader-election.md's fenced write of a leader.
func advance(ctx context.Context, pool *pgxpool.Pool, term int64) error {
	return fencedwrite.InTx(ctx, pool, fencedwrite.Token("scheduler", term), func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, "UPDATE schedule SET next_run = next_run + interval '1 minute', term = $1", term)
		return err // a leader whose term ended gets ErrStaleToken here, and writes nothing
	})
}

// leaderAddress is docs/leader-election.md's lookup of the leader.
func leaderAddress(ctx context.Context, client *leasetable.Client) (string, error) {
	leader, err := client.Leader(ctx, "scheduler")
	if err != nil {
		return "", err // leasetable.ErrNoLeader: nobody leads right now
	}
	return leader.Value, nil // what the leader passed to Campaign or Elect: here its address
}

var leading = make(chan error, 1)

func runScheduler(ctx context.Context, pool *pgxpool.Pool, term int64) {
	leading <- advance(ctx, pool, term)
	<-ctx.Done()
}

func Example_campaign() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE schedule (next_run timestamptz, term bigint);
		INSERT INTO schedule VALUES (now(), 0)`); err != nil {
		log.Fatal(err)
	}
	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "replica-a"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	cctx, stop := context.WithCancel(ctx)
	stopped := make(chan error)
	go func() { stopped <- campaign(cctx, pool, client) }()
	fmt.Println("fenced write as leader:", <-leading)
	fmt.Println(leaderAddress(ctx, client))
	stop()
	fmt.Println("campaign:", <-stopped)
	// a stale term is refused
	err = advance(ctx, pool, 1)
	fmt.Println("old term:", errors.Is(err, fencedwrite.ErrStaleToken))
	// Output:
	// fenced write as leader: <nil>
	// 10.0.0.7:8080 <nil>
	// campaign: context canceled
	// old term: true
}
