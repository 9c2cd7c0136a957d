package test

import (
	"context"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// grant is one critical section reconstructed from a history: a lease
// acquired by proc, from the acquire's ok to the last instant the holder
// checked it still held the lease (End). A proc that died mid-section
// ends at its last such check.
type grant struct {
	Proc                int
	Key                 string
	Token               int64
	Invoke, Start, End  int64 // acquire invoke, acquire ok, last valid
	Released            int64 // release's completion, 0 if it never completed
	ReleaseOutcomeKnown bool
}

// grants pairs acquire, write and release events per proc.
func grants(events []event) (gs []grant, unknownAcquires []event) {
	open := map[int]*grant{}
	invokes := map[int]event{} // pending acquire invoke per proc
	for _, ev := range events {
		switch ev.Op {
		case opAcquire:
			switch ev.Type {
			case evInvoke:
				invokes[ev.Proc] = ev
			case evOK:
				inv := invokes[ev.Proc]
				delete(invokes, ev.Proc)
				open[ev.Proc] = &grant{Proc: ev.Proc, Key: ev.Key, Token: ev.Token, Invoke: inv.Mono, Start: ev.Mono, End: ev.Mono}
			case evUnknown:
				unknownAcquires = append(unknownAcquires, invokes[ev.Proc])
				delete(invokes, ev.Proc)
			case evFail:
				delete(invokes, ev.Proc)
			}
		case opWrite:
			if g := open[ev.Proc]; g != nil && ev.Type == evInvoke {
				g.End = max(g.End, ev.Mono)
			}
		case opRelease:
			g := open[ev.Proc]
			if g == nil {
				continue
			}
			if ev.Type == evInvoke {
				g.End = max(g.End, ev.Mono)
				continue
			}
			g.Released = ev.Mono
			g.ReleaseOutcomeKnown = true
			gs = append(gs, *g)
			delete(open, ev.Proc)
		}
	}
	for _, g := range open { // died holding, or mid-release
		gs = append(gs, *g)
	}
	for _, inv := range invokes { // died mid-acquire
		unknownAcquires = append(unknownAcquires, inv)
	}
	sort.Slice(gs, func(i, j int) bool { return gs[i].Start < gs[j].Start })
	return gs, unknownAcquires
}

// overlap is a pair of critical sections of one key that overlap in time.
type overlap struct{ A, B grant }

func (o overlap) String() string {
	return fmt.Sprintf("key %s: p%d token %d [%s..%s] and p%d token %d [%s..%s]", o.A.Key,
		o.A.Proc, o.A.Token, ms(o.A.Start), ms(o.A.End), o.B.Proc, o.B.Token, ms(o.B.Start), ms(o.B.End))
}

// overlaps is the direct interval check of mutual exclusion: two critical
// sections of one key must not overlap. Each section runs from the
// acquire's ok (after the grant) to the holder's last successful validity
// check (before the loss), so it lies inside the true holding interval and
// any overlap found is a real violation.
func overlaps(gs []grant) []overlap {
	var out []overlap
	for i := range gs {
		for j := i + 1; j < len(gs); j++ {
			a, b := gs[i], gs[j]
			if a.Key == b.Key && a.Proc != b.Proc && b.Start <= a.End && a.Start <= b.End {
				out = append(out, overlap{a, b})
			}
		}
	}
	return out
}

func ms(mono int64) string { return fmt.Sprintf("%.3fs", float64(mono)/1e9) }

// Porcupine model: a mutex per key (one partition per key).
type mutexInput struct {
	Proc    int
	Acquire bool // else release
	Key     string
}

type mutexOutput int

const (
	outOK mutexOutput = iota
	outUnknown
)

var mutexModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range h {
			k := op.Input.(mutexInput).Key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []any { return []any{0} }, // holder proc, 0 = free
	Step: func(state, input, output any) []any {
		holder, in := state.(int), input.(mutexInput)
		switch {
		case in.Acquire && output.(mutexOutput) == outUnknown:
			// May or may not have been granted.
			if holder == 0 {
				return []any{0, in.Proc}
			}
			return []any{holder}
		case in.Acquire:
			if holder == 0 {
				return []any{in.Proc}
			}
			return nil
		default: // release by the holder
			if holder == in.Proc {
				return []any{0}
			}
			return nil
		}
	},
	DescribeOperation: func(input, output any) string {
		in := input.(mutexInput)
		verb := "release"
		if in.Acquire {
			verb = "acquire"
		}
		return fmt.Sprintf("p%d %s %s", in.Proc, verb, in.Key)
	},
}

// linearizable checks the history against the mutex model with porcupine.
// A grant is an acquire that took effect between its invoke and its ok and
// a release that took effect between the end of the critical section and
// the release's completion; an acquire whose outcome is unknown, and the
// release of a worker that died, may take effect at any time after their
// invoke (Return = infinity), as Jepsen treats indeterminate operations.
// Acquires that failed have no effect and are left out.
func linearizable(gs []grant, unknownAcquires []event, timeout time.Duration) porcupine.CheckResult {
	var ops []porcupine.Operation
	for _, g := range gs {
		ops = append(ops, porcupine.Operation{ClientId: g.Proc, Input: mutexInput{g.Proc, true, g.Key}, Call: g.Invoke, Output: outOK, Return: g.Start})
		ret := int64(math.MaxInt64)
		if g.ReleaseOutcomeKnown {
			ret = max(g.Released, g.End)
		}
		ops = append(ops, porcupine.Operation{ClientId: g.Proc, Input: mutexInput{g.Proc, false, g.Key}, Call: g.End, Output: outOK, Return: ret})
	}
	for _, inv := range unknownAcquires {
		ops = append(ops, porcupine.Operation{ClientId: inv.Proc, Input: mutexInput{inv.Proc, true, inv.Key}, Call: inv.Mono, Output: outUnknown, Return: math.MaxInt64})
	}
	return porcupine.CheckOperationsTimeout(mutexModel.ToModel(), ops, timeout)
}

// ledgerReport is the fencing checker's verdict.
type ledgerReport struct {
	Rows          int
	StaleAccepted []string // rows committed after a row of the key with a larger token
	Lost          []string // writes acknowledged but not in the ledger
	Doubled       []string // op ids twice in the ledger, or present though reported failed or never invoked
}

// checkLedger compares the ledger with the history. Rows of a key are
// ordered by seq, which the per-key head row hands out in commit order.
func checkLedger(ctx context.Context, pool *pgxpool.Pool, events []event) (ledgerReport, error) {
	var r ledgerReport
	rows, err := pool.Query(ctx, "SELECT key, token, op_id FROM chaos_ledger ORDER BY key, seq")
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
		if ev.Op == opWrite {
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
		case o == evFail:
			r.Doubled = append(r.Doubled, l.OpID+" reported failed but committed")
		case seen[l.OpID] == 2:
			r.Doubled = append(r.Doubled, l.OpID+" committed twice")
		}
		if tok, ok := token[l.OpID]; ok && tok != l.Token {
			r.Doubled = append(r.Doubled, fmt.Sprintf("%s committed with token %d, invoked with %d", l.OpID, l.Token, tok))
		}
	}
	for id, o := range outcome {
		if o == evOK && seen[id] == 0 {
			r.Lost = append(r.Lost, id)
		}
	}
	sort.Strings(r.Lost)
	return r, nil
}
