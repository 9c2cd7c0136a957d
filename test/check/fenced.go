package check

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The fenced lease model. The mutex model sees only critical sections, as
// the holders claim them; it cannot see what the database did with their
// tokens. Here a key's state is its holder, the token of its latest grant
// and the order of its accepted writes, and writes are operations: an
// accepted write must carry the current grant's token and be its holder's,
// so a write the fence let through after a takeover is caught even when
// the writer checked its lease in time. That needs the writes' commit
// order (Event.Seq, see LedgerOrder): without it a write may linearize at
// its invoke, the holder's last valid check, where the mutex model already
// looks.

type fencedKind int

const (
	fkGrant  fencedKind = iota // acquire ok: free, and a larger token than any before
	fkEnd                      // release, expiry or loss: the grant ends
	fkWrite                    // accepted or rejected by the fence
	fkTokens                   // a grant, in the partition of all tokens
)

type fencedInput struct {
	Kind     fencedKind
	Proc     int
	Key      string // "" for the partition of all tokens
	Token    int64
	Seq      int64 // an accepted write's place in its key's commit order, 0 unknown
	Rejected bool
	OpID     string
}

type fencedState struct {
	Holder int   // proc, 0 free
	Token  int64 // the latest grant's
	Max    int64 // largest token granted (of every key, in the tokens partition)
	Seq    int64 // the last accepted write's
}

func fencedStep(state, input, _ any) []any {
	s, in := state.(fencedState), input.(fencedInput)
	switch in.Kind {
	case fkTokens:
		if in.Token <= s.Max {
			return nil
		}
		s.Max = in.Token
	case fkGrant:
		if s.Holder != 0 || in.Token <= s.Max {
			return nil
		}
		s.Holder, s.Token, s.Max = in.Proc, in.Token, in.Token
	case fkEnd:
		if s.Holder != in.Proc || s.Token != in.Token {
			return nil
		}
		s.Holder = 0
	case fkWrite:
		current := s.Holder == in.Proc && s.Token == in.Token
		switch {
		case in.Rejected && current:
			return nil // the fence turned away the current holder
		case in.Rejected:
		case !current || in.Seq != 0 && in.Seq <= s.Seq:
			return nil
		default:
			s.Seq = max(s.Seq, in.Seq)
		}
	}
	return []any{s}
}

var fencedModel = porcupine.NondeterministicModel{
	Partition: func(h []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		for _, op := range h {
			k := op.Input.(fencedInput).Key
			byKey[k] = append(byKey[k], op)
		}
		keys := make([]string, 0, len(byKey))
		for k := range byKey {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init:              func() []any { return []any{fencedState{}} },
	Step:              fencedStep,
	DescribeOperation: func(input, _ any) string { return describeFenced(input.(fencedInput)) },
	DescribeState: func(state any) string {
		s := state.(fencedState)
		return fmt.Sprintf("holder p%d token %d max %d seq %d", s.Holder, s.Token, s.Max, s.Seq)
	},
}

func describeFenced(in fencedInput) string {
	switch in.Kind {
	case fkTokens:
		return fmt.Sprintf("p%d granted token %d", in.Proc, in.Token)
	case fkGrant:
		return fmt.Sprintf("p%d acquire %s token %d", in.Proc, in.Key, in.Token)
	case fkEnd:
		return fmt.Sprintf("p%d end %s token %d", in.Proc, in.Key, in.Token)
	}
	if in.Rejected {
		return fmt.Sprintf("p%d write %s token %d rejected (%s)", in.Proc, in.Key, in.Token, in.OpID)
	}
	return fmt.Sprintf("p%d write %s token %d accepted seq %d (%s)", in.Proc, in.Key, in.Token, in.Seq, in.OpID)
}

// FencedResult is the fenced model's verdict.
type FencedResult struct {
	Result porcupine.CheckResult
	Info   porcupine.LinearizationInfo // for porcupine.Visualize (FencedVisualize)
	Ops    int
	// Explanation names, for an Illegal history, the first key (or "all
	// keys" for the tokens partition) that cannot be linearized: the
	// state its longest linearizable prefix reaches and the operations
	// that cannot follow it.
	Explanation string
}

// FencedLinearizable checks the history against the fenced lease model,
// one partition per key plus one of the grants of all keys (tokens come
// from one sequence, so they grow in real-time order across keys too).
//
// Operations, with the windows they take effect in:
//   - grant: an acquire's ok, between its invoke and its ok; the key must
//     be free and the token larger than every earlier grant's;
//   - end: the grant's release, expiry or loss, from the holder's last
//     valid check (Grant.End) to the release's completion, or at any
//     later time (Return infinity) when its outcome is unknown or the
//     holder died: the lease may have run out at any instant after;
//   - write accepted (ok, or found in the ledger: Seq > 0): between its
//     invoke and its completion (infinity if none), by the holder of the
//     current grant with its token, after every write of the key with a
//     smaller Seq;
//   - write rejected (a fail whose error is the fence's, see Rejected):
//     the token was not the current holder's.
//
// Left out: events without a token (advisory locks, which have no fence:
// the mutex model's), acquires of unknown outcome (a grant nobody knew of
// was never used: it can explain nothing and forbid nothing), and writes
// neither accepted nor rejected (no effect, or one nobody can see).
func FencedLinearizable(events []Event, timeout time.Duration) FencedResult {
	ops := fencedOps(events)
	res, info := porcupine.CheckOperationsVerbose(fencedModel.ToModel(), ops, timeout)
	r := FencedResult{Result: res, Info: info, Ops: len(ops)}
	if res == porcupine.Illegal {
		r.Explanation = explainFenced(ops, info)
	}
	return r
}

// FencedVisualize writes porcupine's HTML view of r to path.
func FencedVisualize(r FencedResult, path string) error {
	return porcupine.VisualizePath(fencedModel.ToModel(), r.Info, path)
}

// Rejected reports whether a write's failure is the fence turning its
// token away (fencedwrite.ErrStaleToken, leasetable.ErrNotHeld from
// CompleteTx), rather than an error that left the fence unasked.
func Rejected(ev Event) bool {
	return ev.Type == EvFail && (strings.Contains(ev.Err, "stale fencing token") || strings.Contains(ev.Err, "no longer held by this grant"))
}

func fencedOps(events []Event) []porcupine.Operation {
	var ops []porcupine.Operation
	op := func(in fencedInput, call, ret int64) {
		ops = append(ops, porcupine.Operation{ClientId: in.Proc, Input: in, Call: call, Return: ret})
	}
	gs, _ := Grants(events)
	for _, g := range gs {
		if g.Token == 0 {
			continue
		}
		op(fencedInput{Kind: fkGrant, Proc: g.Proc, Key: g.Key, Token: g.Token}, g.Invoke, g.Start)
		op(fencedInput{Kind: fkTokens, Proc: g.Proc, Token: g.Token}, g.Invoke, g.Start)
		ret := int64(math.MaxInt64)
		if g.ReleaseOutcomeKnown {
			ret = max(g.Released, g.End)
		}
		op(fencedInput{Kind: fkEnd, Proc: g.Proc, Key: g.Key, Token: g.Token}, g.End, ret)
	}
	type write struct {
		inv, done Event
		finished  bool
	}
	writes := map[string]*write{}
	var order []string
	for _, ev := range events {
		if ev.Op != OpWrite || ev.Token == 0 {
			continue
		}
		w := writes[ev.OpID]
		if w == nil {
			w = &write{}
			writes[ev.OpID] = w
			order = append(order, ev.OpID)
		}
		if ev.Type == EvInvoke {
			w.inv = ev
		} else {
			w.done, w.finished = ev, true
		}
	}
	for _, id := range order {
		w := writes[id]
		if w.inv.Op == "" {
			continue // never invoked: CheckLedger's business
		}
		in := fencedInput{Kind: fkWrite, Proc: w.inv.Proc, Key: w.inv.Key, Token: w.inv.Token, Seq: max(w.inv.Seq, w.done.Seq), OpID: id}
		ret := int64(math.MaxInt64)
		if w.finished {
			ret = w.done.Mono
		}
		switch {
		case in.Seq > 0 || w.done.Type == EvOK:
		case Rejected(w.done):
			in.Rejected = true
		default:
			continue
		}
		op(in, w.inv.Mono, ret)
	}
	return ops
}

// explainFenced describes each partition porcupine could not linearize,
// the keys' before the tokens': the end of its longest partial
// linearization, the state that reaches, and the operations left over that
// were due by then (called before the earliest return among the
// leftovers), none of which can follow: the violation lies between them.
func explainFenced(ops []porcupine.Operation, info porcupine.LinearizationInfo) string {
	parts := fencedModel.Partition(ops)
	partials := info.PartialLinearizationsOperations()
	var out []string
	for i, part := range parts {
		if i >= len(partials) {
			break
		}
		var longest []porcupine.Operation
		for _, l := range partials[i] {
			if len(l) > len(longest) {
				longest = l
			}
		}
		if len(longest) == len(part) {
			continue
		}
		key := part[0].Input.(fencedInput).Key
		state := fencedState{}
		done := map[fencedInput]bool{}
		for _, o := range longest {
			state = fencedStep(state, o.Input, nil)[0].(fencedState)
			done[o.Input.(fencedInput)] = true
		}
		var b strings.Builder
		if key == "" {
			fmt.Fprintf(&b, "tokens of all keys: %d of %d grants linearize, up to the largest token %d", len(longest), len(part), state.Max)
		} else {
			fmt.Fprintf(&b, "key %s: %d of %d operations linearize, ending in state %s", key, len(longest), len(part), fencedModel.DescribeState(state))
		}
		b.WriteString("; the last of them:")
		for _, o := range longest[max(0, len(longest)-4):] {
			fmt.Fprintf(&b, "\n    %s", describeOp(o))
		}
		b.WriteString("\n  and none of these can follow:")
		var left []porcupine.Operation
		due := int64(math.MaxInt64)
		for _, o := range part {
			if !done[o.Input.(fencedInput)] {
				left = append(left, o)
				due = min(due, o.Return)
			}
		}
		sort.Slice(left, func(a, b int) bool { return left[a].Call < left[b].Call })
		for _, o := range left {
			in := o.Input.(fencedInput)
			switch {
			case o.Call <= due:
				fmt.Fprintf(&b, "\n    %s", describeOp(o))
			case in.Kind == fkEnd && in.Proc == state.Holder && in.Token == state.Token:
				// Called too late to be due, but what holds the others up.
				fmt.Fprintf(&b, "\n    %s: the holder's, not before its last valid check", describeOp(o))
			}
		}
		if key == "" {
			out = append(out, b.String())
		} else {
			out = append([]string{b.String()}, out...)
		}
	}
	if len(out) == 0 {
		return "every partition linearizes: the check timed out"
	}
	return strings.Join(out, "\n")
}

func describeOp(o porcupine.Operation) string {
	return fmt.Sprintf("%s [%s..%s]", describeFenced(o.Input.(fencedInput)), Seconds(o.Call), secondsOrNever(o.Return))
}

func secondsOrNever(mono int64) string {
	if mono == math.MaxInt64 {
		return "never"
	}
	return Seconds(mono)
}
