// Package completion is the bookkeeping of completing leases in one
// statement: the leases are sent by name and token, and the database
// answers with names (the rows it deleted, or those still held); each
// lease sent learns from that answer whether it was completed, and the
// caller is told the names that were not. A Batch is one such completion,
// or the part of a combined round trip that is one caller's.
//
// The package holds no lease state and formats no error: what a lease
// that was not completed is told, and how, is its owner's (leasetable);
// Problem only says what is wrong with the leases given.
package completion

import "fmt"

// Lease is what the bookkeeping needs of a lease: its grant.
type Lease interface {
	Name() string
	Token() int64
}

// Batch is a completion in progress.
type Batch[L Lease] struct {
	// Sent are the leases stopped and sent (or about to be), not yet
	// answered by the database.
	Sent []L
	// Unheld are the names of those that could not be completed and were
	// not sent: released, lost or handed to a transaction before.
	Unheld []string
}

// Settle tells each lease sent, in order, whether its name is among
// deleted (the database's answer), and returns the names not completed:
// Unheld, then those sent that were not deleted (taken over meanwhile).
func (b *Batch[L]) Settle(deleted []string, each func(l L, gone bool)) []string {
	return Match(b.Sent, deleted, b.Unheld, each)
}

// Match calls each for every lease, in order, with whether its name is
// among names, and returns the names of those that are not, appended to
// missing. names are one statement's answer about leases: the rows it
// deleted, or those still held.
func Match[L Lease](leases []L, names []string, missing []string, each func(l L, in bool)) []string {
	in := make(map[string]bool, len(names))
	for _, n := range names {
		in[n] = true
	}
	for _, l := range leases {
		found := in[l.Name()]
		each(l, found)
		if !found {
			missing = append(missing, l.Name())
		}
	}
	return missing
}

// Grants appends the names and tokens of leases to names and tokens, as
// the batch protocol functions take them: the calls sent together append
// theirs to one statement's arguments.
func Grants[L Lease](names []string, tokens []int64, leases []L) ([]string, []int64) {
	for _, l := range leases {
		names, tokens = append(names, l.Name()), append(tokens, l.Token())
	}
	return names, tokens
}

// Problem says what is wrong with the leases given to call, before
// anything is stopped or sent, or "" if nothing: a lease that is not the
// caller's (own reports false: nil, or another client's) and, with once,
// a lease given twice.
func Problem[L interface {
	comparable
	Lease
}](call string, leases []L, own func(L) bool, once bool) string {
	var seen map[L]bool // with once: read nil, written only then
	if once {
		seen = make(map[L]bool, len(leases))
	}
	for _, l := range leases {
		switch {
		case !own(l):
			return call + " needs leases of this client"
		case !once:
		case seen[l]:
			return fmt.Sprintf("%s got lease %q twice", call, l.Name())
		default:
			seen[l] = true
		}
	}
	return ""
}

// Hand stops leases for a completion in the caller's transaction, in one
// statement: stop reports whether each may be sent (it is handed off
// then). names are every lease's; tokens are those of the leases handed,
// and 0 for the others, which matches no row: the statement fails and
// aborts the transaction, as for a lease taken over. unheld names the
// others.
func Hand[L Lease](leases []L, stop func(L) bool) (names []string, tokens []int64, handed []L, unheld []string) {
	names, tokens = make([]string, len(leases)), make([]int64, len(leases))
	for i, l := range leases {
		names[i] = l.Name()
		if stop(l) {
			tokens[i] = l.Token()
			handed = append(handed, l)
		} else {
			unheld = append(unheld, l.Name())
		}
	}
	return names, tokens, handed, unheld
}
