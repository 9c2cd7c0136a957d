// Package appname makes the application_name of the connections pgbaton
// opens itself, so that pg_stat_activity and the CLI show who they are.
package appname

import "strings"

// maxLen is what the server keeps of application_name (NAMEDATALEN - 1
// bytes).
const maxLen = 63

// Of returns "pgbaton <role> <owner>", cut to the bytes the server keeps,
// on a character boundary.
func Of(role, owner string) string {
	name := "pgbaton " + role + " " + owner
	if len(name) > maxLen {
		name = strings.ToValidUTF8(name[:maxLen], "")
	}
	return name
}
