package leasetable_test

import (
	"context"
	"fmt"
	"log"

	"github.com/pgbaton/pgbaton/leasetable"
)

// The leader's term is its lease token: larger for every new leader, so
// writes made as leader can be fenced with it.
func ExampleClient_Elect() {
	pool, done := examplePool()
	defer done()
	ctx := context.Background()
	client, err := leasetable.New(ctx, pool, leasetable.Config{Owner: "replica-a"})
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close(ctx)

	leadership, err := client.Elect(ctx, "scheduler", "10.0.0.7:8080")
	if err != nil {
		log.Fatal(err)
	}
	leader, err := client.Leader(ctx, "scheduler")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println(leader.Owner, leader.Value, leader.Term == leadership.Term())
	_ = leadership.Resign(ctx)
	// Output:
	// replica-a 10.0.0.7:8080 true
}
