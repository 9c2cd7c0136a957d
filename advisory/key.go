package advisory

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pgbaton/pgbaton"
	"github.com/pgbaton/pgbaton/advisory/internal/pgsession"
)

// Limits on names, in bytes of UTF-8. The registry table enforces them too.
const (
	MaxNameLen      = 1024
	MaxNamespaceLen = 255
)

// Keys pgbaton takes for itself. The library refuses them to its users
// (pgbaton.ErrInvalidArgument), so no lock of a user's can block pgbaton's
// own or be blocked by them; a session that takes them in SQL outside
// pgbaton can.
//
// ReservedPairHi to ReservedPairHi+3 are the first halves of the (int4,
// int4) keys the lease protocol takes: Pair(ReservedPairHi, slot) is a
// leasetable.Client's listen slot (pgbaton.listen_start),
// Pair(ReservedPairHi+1, hashtext(group)) a lease group's gate
// (pgbaton.group_gate), Pair(ReservedPairHi+2, hashtext(name)) the lock
// of a wait queue (pgbaton.queue_lock) and Pair(ReservedPairHi+3, n) a
// lease session's (pgbaton.session_hold). Every Pair with one of these
// first halves is refused.
const ReservedPairHi int32 = 1885495924

// reservedPairs is how many first halves from ReservedPairHi on are
// reserved.
const reservedPairs = 4

// Key names an advisory lock. Make one with Name, Int64 or Pair; the zero
// Key is invalid. Postgres keeps the bigint key space (Name and Int64) apart
// from the (int4, int4) space (Pair): Int64(1) and Pair(0, 1) are different
// locks. The keys pgbaton keeps for itself (ReservedPairHi) are refused
// when a lock is taken.
type Key struct {
	kind kind
	id   int64
	hi   int32
	lo   int32
	name string
}

type kind uint8

const (
	kindInvalid kind = iota
	kindName
	kindInt64
	kindPair
)

// Name is the key of a lock name such as "job:daily-export". It maps to a
// bigint key by NameKey, with the Locker's Config.Namespace; from SQL the
// same key is pgbaton.advisory_key(name, namespace). Names used through a
// Locker are recorded in pgbaton.advisory_name. Names share the bigint
// space with Int64 keys: do not mix raw numbers and names in one
// application unless the numbers are registered elsewhere.
func Name(name string) Key { return Key{kind: kindName, name: name} }

// Int64 is a raw bigint key, as pg_advisory_lock(bigint) takes it.
func Int64(id int64) Key { return Key{kind: kindInt64, id: id} }

// Pair is a two-part key, as pg_advisory_lock(int4, int4) takes it.
func Pair(hi, lo int32) Key { return Key{kind: kindPair, hi: hi, lo: lo} }

// String describes the key: name:…, key:… or pair:…,….
func (k Key) String() string {
	switch k.kind {
	case kindName:
		return "name:" + k.name
	case kindInt64:
		return "key:" + strconv.FormatInt(k.id, 10)
	case kindPair:
		return fmt.Sprintf("pair:%d,%d", k.hi, k.lo)
	}
	return "invalid key"
}

// lockID is a resolved key: what Postgres sees.
type lockID = pgsession.Key

// resolve validates k and returns the key Postgres sees.
func (k Key) resolve(namespace string) (lockID, error) {
	switch k.kind {
	case kindName:
		id, err := NameKey(namespace, k.name)
		return lockID{ID: id}, err
	case kindInt64:
		return lockID{ID: k.id}, nil
	case kindPair:
		if last := ReservedPairHi + reservedPairs - 1; k.hi >= ReservedPairHi && k.hi <= last {
			return lockID{}, fmt.Errorf("%w: advisory key pair:%d,%d is reserved: pgbaton's lease protocol takes the pairs (%d..%d, n) for itself; use another first half",
				pgbaton.ErrInvalidArgument, k.hi, k.lo, ReservedPairHi, last)
		}
		return lockID{Pair: true, Hi: k.hi, Lo: k.lo}, nil
	}
	return lockID{}, fmt.Errorf("%w: zero advisory.Key; use advisory.Name, Int64 or Pair", pgbaton.ErrInvalidArgument)
}

// NameKey is the bigint key of name in namespace: the first 8 bytes of
// SHA-256 over the UTF-8 bytes of name, or of namespace + "/" + name when
// namespace is not empty, read as a big-endian signed integer. In SQL:
//
//	pgbaton.advisory_key(name, namespace)
//	-- which is
//	('x' || encode(substr(sha256(convert_to(namespace || '/' || name, 'UTF8')), 1, 8), 'hex'))::bit(64)::bigint
//
// The name must be 1 to MaxNameLen bytes of valid UTF-8 without NUL; the
// namespace at most MaxNamespaceLen bytes without NUL or "/".
func NameKey(namespace, name string) (int64, error) {
	if err := validateNamespace(namespace); err != nil {
		return 0, err
	}
	if err := validateName(name); err != nil {
		return 0, err
	}
	material := name
	if namespace != "" {
		material = namespace + "/" + name
	}
	sum := sha256.Sum256([]byte(material))
	return int64(binary.BigEndian.Uint64(sum[:8])), nil
}

func validateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty lock name", pgbaton.ErrInvalidArgument)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%w: lock name of %d bytes, at most %d allowed", pgbaton.ErrInvalidArgument, len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: lock name is not valid UTF-8", pgbaton.ErrInvalidArgument)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: lock name contains a NUL byte", pgbaton.ErrInvalidArgument)
	}
	return nil
}

func validateNamespace(ns string) error {
	switch {
	case len(ns) > MaxNamespaceLen:
		return fmt.Errorf("%w: namespace of %d bytes, at most %d allowed", pgbaton.ErrInvalidArgument, len(ns), MaxNamespaceLen)
	case !utf8.ValidString(ns):
		return fmt.Errorf("%w: namespace is not valid UTF-8", pgbaton.ErrInvalidArgument)
	case strings.IndexByte(ns, 0) >= 0:
		return fmt.Errorf("%w: namespace contains a NUL byte", pgbaton.ErrInvalidArgument)
	case strings.Contains(ns, "/"):
		// "/" separates namespace and name, so it must not be ambiguous.
		return fmt.Errorf("%w: namespace %q contains \"/\"", pgbaton.ErrInvalidArgument, ns)
	}
	return nil
}
