package check

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// Grant is one critical section reconstructed from a history: a lease
// acquired by Proc, from the acquire's ok to the last instant the holder
// checked it still held the lease (End). A proc that died mid-section
// ends at its last such check.
type Grant struct {
	Proc                int
	Key                 string
	Token               int64
	Invoke, Start, End  int64 // acquire invoke, acquire ok, last valid
	Released            int64 // release's completion, 0 if it never completed
	ReleaseOutcomeKnown bool
}

// Grants pairs acquire, write and release events per proc. It returns the
// critical sections, ordered by start, and the invokes of acquires whose
// outcome is unknown.
func Grants(events []Event) (gs []Grant, unknownAcquires []Event) {
	open := map[int]*Grant{}
	invokes := map[int]Event{} // pending acquire invoke per proc
	for _, ev := range events {
		switch ev.Op {
		case OpAcquire:
			switch ev.Type {
			case EvInvoke:
				invokes[ev.Proc] = ev
			case EvOK:
				inv := invokes[ev.Proc]
				delete(invokes, ev.Proc)
				open[ev.Proc] = &Grant{Proc: ev.Proc, Key: ev.Key, Token: ev.Token, Invoke: inv.Mono, Start: ev.Mono, End: ev.Mono}
			case EvUnknown:
				unknownAcquires = append(unknownAcquires, invokes[ev.Proc])
				delete(invokes, ev.Proc)
			case EvFail:
				delete(invokes, ev.Proc)
			}
		case OpWrite:
			if g := open[ev.Proc]; g != nil && ev.Type == EvInvoke {
				g.End = max(g.End, ev.Mono)
			}
		case OpRelease:
			g := open[ev.Proc]
			if g == nil {
				continue
			}
			if ev.Type == EvInvoke {
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

// Overlap is a pair of critical sections of one key that overlap in time.
type Overlap struct{ A, B Grant }

func (o Overlap) String() string {
	return fmt.Sprintf("key %s: p%d token %d [%s..%s] and p%d token %d [%s..%s]", o.A.Key,
		o.A.Proc, o.A.Token, Seconds(o.A.Start), Seconds(o.A.End), o.B.Proc, o.B.Token, Seconds(o.B.Start), Seconds(o.B.End))
}

// Overlaps is the direct interval check of mutual exclusion: two critical
// sections of one key must not overlap. Each section runs from the
// acquire's ok (after the grant) to the holder's last successful validity
// check (before the loss), so it lies inside the true holding interval and
// any overlap found is a real violation.
func Overlaps(gs []Grant) []Overlap {
	var out []Overlap
	for i := range gs {
		for j := i + 1; j < len(gs); j++ {
			a, b := gs[i], gs[j]
			if a.Key == b.Key && a.Proc != b.Proc && b.Start <= a.End && a.Start <= b.End {
				out = append(out, Overlap{a, b})
			}
		}
	}
	return out
}

// Seconds formats a MonoNow reading.
func Seconds(mono int64) string { return fmt.Sprintf("%.3fs", float64(mono)/1e9) }

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

// Linearizable checks the history against the mutex model with porcupine.
// A grant is an acquire that took effect between its invoke and its ok and
// a release that took effect between the end of the critical section and
// the release's completion; an acquire whose outcome is unknown, and the
// release of a worker that died, may take effect at any time after their
// invoke (Return = infinity), as Jepsen treats indeterminate operations.
// Acquires that failed have no effect and are left out.
func Linearizable(gs []Grant, unknownAcquires []Event, timeout time.Duration) porcupine.CheckResult {
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
