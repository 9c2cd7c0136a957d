// Package check holds the history format and the checkers shared by
// pgbaton's fault suites: the chaos suite (package test) and the HA suite
// (test/ha). It has no dependency on the suites themselves.
//
// A history is a list of Events, Jepsen-style: every operation is an
// invoke followed by ok, fail (certainly had no effect) or unknown (may or
// may not have had an effect); a process that dies leaves its last invoke
// open, which counts as unknown. Events are stamped with the host's
// CLOCK_MONOTONIC (MonoNow), one clock for every process on the host.
//
// The checkers:
//   - Grants, Overlaps and Linearizable: mutual exclusion, by a direct
//     interval check and with porcupine against a mutex model;
//   - CheckLedger: fencing, against a ledger table the workers append to
//     under their tokens (stale tokens accepted, acknowledged writes lost,
//     writes doubled);
//   - TokensBackwards: fencing tokens never go backwards in real time;
//   - FencedLinearizable: porcupine against a fenced lease per key (holder,
//     latest token, commit order of the accepted writes) and the tokens of
//     all keys: sees a write accepted under a superseded token, which the
//     mutex model cannot (it sees only the critical sections as the
//     holders claim them). LedgerOrder adds the commit order it needs.
package check
