package db

// The text of the statements an advisory session prepares by name and
// pipelines on its socket itself (advisory/internal/pgsession/wire.go), where the generated
// methods, which go through pgx one round trip at a time, cannot be used.
// sqlc keeps query text unexported; these hand it out without a copy that
// could drift from queries/advisory.sql.
const (
	AdvisoryOpSQL        = advisoryOp
	AdvisoryTryOneSQL    = advisoryTryOne
	AdvisoryUnlockOneSQL = advisoryUnlockOne
	// Sent with the Parse of the three above, in the same round trip.
	AdvisorySessionReadySQL = advisorySessionReady
	// Pipelined after it on a direct connection.
	AdvisoryFastPathFunctionsSQL = advisoryFastPathFunctions
)
