package main

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// docsHelp are the commands whose help docs/operating.md quotes.
var docsHelp = [][]string{
	{"--help"},
	{"help", "environment"},
	{"status", "--help"},
	{"locks", "--help"},
	{"leases", "--help"},
	{"runs", "--help"},
	{"events", "--help"},
	{"watch", "--help"},
	{"release", "--help"},
	{"resign", "--help"},
	{"exec", "--help"},
	{"migrate", "--help"},
	{"migrate", "up", "--help"},
	{"migrate", "down", "--help"},
	{"migrate", "version", "--help"},
	{"version", "--help"},
	{"serve", "--help"},
}

// The operator's page quotes every command's help as the CLI prints it
// (without the Global Flags every command repeats): a flag or example
// changed here must change there too.
func TestDocsOperatingQuotesEveryHelp(t *testing.T) {
	page, err := os.ReadFile("../../docs/operating.md")
	require.NoError(t, err)
	for _, args := range docsHelp {
		code, out, errOut := cli(t, args...)
		require.Equal(t, exitOK, code, errOut)
		block := "```text\n$ pgbaton " + strings.Join(args, " ") + "\n" + withoutGlobalFlags(out) + "\n```"
		require.Contains(t, string(page), block, "docs/operating.md does not quote `pgbaton %s` as it is now; put this in its place:\n%s",
			strings.Join(args, " "), block)
	}
}

// withoutGlobalFlags drops the "Global Flags:" section of a help text.
func withoutGlobalFlags(help string) string {
	const head = "\nGlobal Flags:\n"
	i := strings.Index(help, head)
	if i < 0 {
		return strings.TrimRight(help, "\n")
	}
	rest := help[i+len(head):]
	if j := strings.Index(rest, "\n\n"); j >= 0 {
		return strings.TrimRight(help[:i]+rest[j+1:], "\n")
	}
	return strings.TrimRight(help[:i], "\n")
}
