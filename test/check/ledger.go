package check

import (
	"context"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
)

// Querier runs a query: a pool, a connection or a transaction.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// LedgerReport is the fencing checker's verdict.
type LedgerReport struct {
	Rows          int
	StaleAccepted []string // rows committed after a row of the key with a larger token
	Lost          []string // writes acknowledged but not in the ledger
	Doubled       []string // op ids twice in the ledger, or present though reported failed or never invoked
}

// CheckLedger compares the ledger table with the history's writes. The
// table has columns key text, token bigint, op_id text and seq bigint;
// rows of a key are ordered by seq, which the writers take from a per-key
// counter row in the write's own transaction, so it is the commit order.
func CheckLedger(ctx context.Context, q Querier, table pgx.Identifier, events []Event) (LedgerReport, error) {
	var r LedgerReport
	rows, err := q.Query(ctx, "SELECT key, token, op_id FROM "+table.Sanitize()+" ORDER BY key, seq")
	if err != nil {
		return r, err
	}
	type row struct {
		Key   string
		Token int64
		OpID  string
	}
	ledger, err := pgx.CollectRows(rows, pgx.RowToStructByPos[row])
	if err != nil {
		return r, err
	}
	r.Rows = len(ledger)
	outcome := map[string]string{} // op id -> last write event type
	token := map[string]int64{}
	for _, ev := range events {
		if ev.Op == OpWrite {
			outcome[ev.OpID] = ev.Type
			token[ev.OpID] = ev.Token
		}
	}
	seen := map[string]int{}
	maxTok := map[string]int64{}
	for _, l := range ledger {
		if l.Token < maxTok[l.Key] {
			r.StaleAccepted = append(r.StaleAccepted, fmt.Sprintf("%s token %d committed after token %d (%s)", l.Key, l.Token, maxTok[l.Key], l.OpID))
		}
		maxTok[l.Key] = max(maxTok[l.Key], l.Token)
		seen[l.OpID]++
		switch o, ok := outcome[l.OpID]; {
		case !ok:
			r.Doubled = append(r.Doubled, l.OpID+" never invoked")
		case o == EvFail:
			r.Doubled = append(r.Doubled, l.OpID+" reported failed but committed")
		case seen[l.OpID] == 2:
			r.Doubled = append(r.Doubled, l.OpID+" committed twice")
		}
		if tok, ok := token[l.OpID]; ok && tok != l.Token {
			r.Doubled = append(r.Doubled, fmt.Sprintf("%s committed with token %d, invoked with %d", l.OpID, l.Token, tok))
		}
	}
	for id, o := range outcome {
		if o == EvOK && seen[id] == 0 {
			r.Lost = append(r.Lost, id)
		}
	}
	sort.Strings(r.Lost)
	return r, nil
}

// LedgerOrder returns a copy of events in which every write found in the
// ledger carries its Seq: the ledger tells which writes committed, also
// those of unknown outcome and of workers killed mid-write, and in which
// order, which the fenced model needs to place a write after a takeover.
func LedgerOrder(ctx context.Context, q Querier, table pgx.Identifier, events []Event) ([]Event, error) {
	rows, err := q.Query(ctx, "SELECT op_id, seq FROM "+table.Sanitize())
	if err != nil {
		return nil, err
	}
	seq := map[string]int64{}
	var id string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&id, &n}, func() error { seq[id] = n; return nil }); err != nil {
		return nil, err
	}
	out := append([]Event(nil), events...)
	for i, ev := range out {
		if ev.Op == OpWrite {
			out[i].Seq = seq[ev.OpID]
		}
	}
	return out, nil
}
