package check

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"golang.org/x/sys/unix"
)

// Operation kinds and outcome types of a history.
const (
	OpAcquire = "acquire"
	OpWrite   = "write"
	OpRelease = "release"

	EvInvoke  = "invoke"
	EvOK      = "ok"
	EvFail    = "fail"
	EvUnknown = "unknown"
)

// Event is one entry of a history; workers in child processes print them
// as JSON lines.
type Event struct {
	Proc  int    `json:"p"`    // worker process incarnation, unique per run
	Key   string `json:"k"`    // lease name
	Op    string `json:"op"`   // acquire, write, release
	Type  string `json:"type"` // invoke, ok, fail, unknown
	Mono  int64  `json:"t"`    // CLOCK_MONOTONIC nanoseconds, see MonoNow
	Token int64  `json:"tok,omitempty"`
	OpID  string `json:"id,omitempty"` // a write's id, stored in the ledger
	Err   string `json:"err,omitempty"`
	Seq   int64  `json:"seq,omitempty"` // a write's place in its key's commit order, from LedgerOrder; 0 unknown
}

// MonoNow is the host's CLOCK_MONOTONIC in nanoseconds. Unlike the wall
// clock it never steps, and unlike Go's monotonic readings (relative to each
// process's start) it is one clock for every process on the host: a parent
// and all its workers stamp their events on the same time line, as long as
// they all run on one host.
func MonoNow() int64 {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		panic(err) // cannot fail on Linux
	}
	return ts.Nano()
}

// Emitter writes a worker's events as JSON lines, one whole line per
// event.
type Emitter struct {
	mu   sync.Mutex
	proc int
	w    io.Writer
}

// NewEmitter returns an Emitter of proc's events to w.
func NewEmitter(proc int, w io.Writer) *Emitter { return &Emitter{proc: proc, w: w} }

// Emit stamps ev with the emitter's proc and, unless set, the time, and
// writes it.
func (e *Emitter) Emit(ev Event) {
	ev.Proc = e.proc
	if ev.Mono == 0 {
		ev.Mono = MonoNow()
	}
	b, _ := json.Marshal(ev)
	e.mu.Lock()
	defer e.mu.Unlock()
	fmt.Fprintf(e.w, "%s\n", b)
}

// History collects the events of all workers. It is safe for concurrent
// use.
type History struct {
	mu     sync.Mutex
	events []Event
	// holding is the live view a nemesis aims with: proc -> key it holds.
	holding map[int]string
}

// NewHistory returns an empty history.
func NewHistory() *History { return &History{holding: map[int]string{}} }

// Add appends ev.
func (h *History) Add(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.events = append(h.events, ev)
	switch {
	case ev.Op == OpAcquire && ev.Type == EvOK:
		h.holding[ev.Proc] = ev.Key
	case ev.Op == OpRelease && ev.Type == EvInvoke:
		delete(h.holding, ev.Proc)
	}
}

// Forget drops proc from the live view of holders (it died).
func (h *History) Forget(proc int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.holding, proc)
}

// Holders returns the procs holding a lease now, with their keys.
func (h *History) Holders() map[int]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	m := make(map[int]string, len(h.holding))
	for p, k := range h.holding {
		m[p] = k
	}
	return m
}

// Snapshot returns a copy of the events so far.
func (h *History) Snapshot() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]Event(nil), h.events...)
}
