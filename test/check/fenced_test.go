package check

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
)

// hist builds a history in a few words per event; times are seconds.
type hist []Event

func (h hist) ev(at float64, proc int, key, op, typ string, tok int64) hist {
	return append(h, Event{Proc: proc, Key: key, Op: op, Type: typ, Mono: int64(at * 1e9), Token: tok})
}

func (h hist) write(from, to float64, proc int, key string, tok int64, id, typ string, seq int64) hist {
	h = append(h, Event{Proc: proc, Key: key, Op: OpWrite, Type: EvInvoke, Mono: int64(from * 1e9), Token: tok, OpID: id})
	done := Event{Proc: proc, Key: key, Op: OpWrite, Type: typ, Mono: int64(to * 1e9), Token: tok, OpID: id, Seq: seq}
	if typ == EvFail {
		done.Err = "fencedwrite: stale fencing token for \"a\": presented 5, current 6 (superseded)"
	}
	return append(h, done)
}

// grant is acquire invoke and ok.
func (h hist) grant(from, to float64, proc int, key string, tok int64) hist {
	return h.ev(from, proc, key, OpAcquire, EvInvoke, 0).ev(to, proc, key, OpAcquire, EvOK, tok)
}

// release is release invoke (the last valid check) and its outcome.
func (h hist) release(from, to float64, proc int, key string, tok int64, typ string) hist {
	return h.ev(from, proc, key, OpRelease, EvInvoke, tok).ev(to, proc, key, OpRelease, typ, tok)
}

// mutexVerdict is what the mutex model and the interval check say.
func mutexVerdict(events []Event) (porcupine.CheckResult, []Overlap) {
	gs, unknown := Grants(events)
	return Linearizable(gs, unknown, 10*time.Second), Overlaps(gs)
}

// The fenced model catches what the mutex model cannot see: writes and
// tokens. Each history below is a clean mutex (no overlap of the claimed
// critical sections), and not a fenced lease.
func TestFencedBites(t *testing.T) {
	cases := []struct {
		name string
		h    hist
		want []string // in the explanation
	}{{
		// p1's local deadline is not shortened by the margin: its last
		// check passes at 2, just before the database lets the lease go;
		// p2 is granted token 6 at 4 and writes (seq 1); p1's write,
		// checked at 2, commits after p2's (seq 2), accepted.
		name: "deadline not shortened",
		h: hist{}.grant(0, 1, 1, "a", 5).
			write(2, 7, 1, "a", 5, "p1-w", EvOK, 2).
			release(2, 8, 1, "a", 5, EvFail).
			grant(3, 4, 2, "a", 6).
			write(5, 6, 2, "a", 6, "p2-w", EvOK, 1).
			release(9, 10, 2, "a", 6, EvOK),
		want: []string{"key a", "p1 write a token 5 accepted seq 2 (p1-w)", "holder p2 token 6", "p2 write a token 6 accepted seq 1"},
	}, {
		// A fence that accepts any token: p1 writes with the token of its
		// earlier grant of the key, long released, and it is accepted.
		name: "fence accepts a stale token",
		h: hist{}.grant(0, 1, 1, "a", 5).
			write(1.5, 2, 1, "a", 5, "p1-w1", EvOK, 1).
			release(2.5, 3, 1, "a", 5, EvOK).
			grant(4, 5, 1, "a", 8).
			write(6, 7, 1, "a", 5, "p1-w2", EvOK, 2).
			release(7.5, 8, 1, "a", 8, EvOK),
		want: []string{"key a", "p1 write a token 5 accepted seq 2 (p1-w2)", "holder p1 token 8"},
	}, {
		// Tokens go backwards on one key: 5 is granted after 7.
		name: "tokens backwards on a key",
		h: hist{}.grant(0, 1, 1, "a", 7).release(2, 3, 1, "a", 7, EvOK).
			grant(4, 5, 2, "a", 5).release(6, 7, 2, "a", 5, EvOK),
		want: []string{"key a", "p2 acquire a token 5", "max 7", "tokens of all keys"},
	}, {
		// Across keys: tokens come from one sequence.
		name: "tokens backwards across keys",
		h: hist{}.grant(0, 1, 1, "a", 7).release(2, 3, 1, "a", 7, EvOK).
			grant(4, 5, 2, "b", 5).release(6, 7, 2, "b", 5, EvOK),
		want: []string{"tokens of all keys", "p2 granted token 5", "largest token 7"},
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			lin, overlaps := mutexVerdict(c.h)
			if lin != porcupine.Ok || len(overlaps) != 0 {
				t.Fatalf("the mutex model sees it too (%s, overlaps %v): not a history only the fenced model catches", lin, overlaps)
			}
			r := FencedLinearizable(c.h, 10*time.Second)
			if r.Result != porcupine.Illegal {
				t.Fatalf("fenced model: %s, want Illegal", r.Result)
			}
			t.Logf("mutex model: %s, overlaps: %d; fenced model: %s:\n%s", lin, len(overlaps), r.Result, r.Explanation)
			for _, w := range c.want {
				if !strings.Contains(r.Explanation, w) {
					t.Errorf("explanation lacks %q", w)
				}
			}
			if os.Getenv("FENCED_VISUALIZE") != "" {
				path := filepath.Join(os.TempDir(), "fenced-"+strings.ReplaceAll(c.name, " ", "-")+".html")
				if err := FencedVisualize(r, path); err != nil {
					t.Fatal(err)
				}
				t.Logf("visualization: %s", path)
			}
		})
	}
}

// A correct history passes: acquires of unknown outcome, a holder that
// died holding (its lease expires), a takeover after an expiry whose
// loser's late write is rejected, writes in commit order, a write of
// unknown outcome that committed, and grants of other keys interleaved.
func TestFencedAcceptsCorrect(t *testing.T) {
	h := hist{}.
		ev(0, 3, "a", OpAcquire, EvInvoke, 0).ev(0.5, 3, "a", OpAcquire, EvUnknown, 0).
		grant(0, 1, 1, "a", 5).
		write(1, 1.5, 1, "a", 5, "p1-w1", EvOK, 1).
		write(2, 9, 1, "a", 5, "p1-w2", EvFail, 0). // checked at 2, rejected after the takeover
		release(2, 9.5, 1, "a", 5, EvFail).
		grant(1, 3.5, 4, "b", 6). // concurrent with a's grants: any order
		write(4, 5, 4, "b", 6, "p4-w1", EvOK, 1).
		release(5, 5.5, 4, "b", 6, EvOK).
		grant(2.5, 4.5, 2, "a", 7). // after p1's lease expired
		write(5, 6, 2, "a", 7, "p2-w1", EvOK, 2).
		write(6.5, 7, 2, "a", 7, "p2-w2", EvUnknown, 3). // found in the ledger
		ev(7, 2, "a", OpRelease, EvInvoke, 7).           // p2 died releasing
		ev(10, 5, "a", OpAcquire, EvInvoke, 0).
		ev(10, 6, "b", OpAcquire, EvInvoke, 0). // died acquiring
		ev(12, 5, "a", OpAcquire, EvOK, 9).
		write(12, 13, 5, "a", 9, "p5-w1", EvOK, 4).
		write(13, 14, 5, "a", 9, "p5-w2", EvOK, 0). // acknowledged, order unknown
		ev(14, 5, "a", OpRelease, EvInvoke, 9)      // died holding
	r := FencedLinearizable(h, 10*time.Second)
	if r.Result != porcupine.Ok {
		t.Fatalf("fenced model: %s\n%s", r.Result, r.Explanation)
	}
	if lin, overlaps := mutexVerdict(h); lin != porcupine.Ok || len(overlaps) != 0 {
		t.Fatalf("mutex model: %s, overlaps %v", lin, overlaps)
	}
	t.Logf("%d operations linearize", r.Ops)
}
