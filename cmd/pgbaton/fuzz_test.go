package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// parseCLI runs the CLI's parsing only: the real command tree, flags,
// argument checks and hooks, with every command's body replaced by a
// recorder, so that arbitrary arguments never touch a database, a file or
// a port. It returns the command whose body would have run, the output and
// the error.
func parseCLI(args []string) (ran *cobra.Command, out string, err error) {
	var buf bytes.Buffer
	root := newRootCmd(streams{stdin: strings.NewReader(""), stdout: &buf, stderr: &buf, getenv: func(string) string { return "" }})
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			if sub.RunE != nil || sub.Run != nil {
				sub.Run = nil
				sub.RunE = func(cmd *cobra.Command, _ []string) error { ran = cmd; return nil }
			}
			walk(sub)
		}
	}
	walk(root)
	root.SetArgs(args)
	err = root.ExecuteContext(context.Background())
	return ran, buf.String(), err
}

// FuzzCLIArgs feeds arbitrary argument lists (NUL-separated) to the CLI's
// parser. Properties: it never panics; every error it reports before a
// command's body runs is a usage error (exit code 2), as the CLI
// documents; and parsing is deterministic.
func FuzzCLIArgs(f *testing.F) {
	for _, s := range []string{
		"", "--help", "status", "status\x00--dsn\x00postgres://u@h/db\x00-o\x00json",
		"locks\x00--wide", "leases\x00-o\x00wide", "runs", "events", "watch",
		"release\x00job:x\x00--yes", "release", "release\x00a\x00b",
		"migrate\x00up", "migrate\x00down\x00--yes", "migrate\x00version", "migrate\x00sideways",
		"-o\x00yaml\x00status",
		"--bogus", "status\x00extra", "serve\x00--listen", "nosuchcommand", "--dsn=",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, joined string) {
		args := strings.Split(joined, "\x00")
		if joined == "" {
			args = nil
		}
		ran, out, err := parseCLI(args)
		if err != nil {
			if ran != nil {
				t.Fatalf("%q: command %s ran and an error came back: %v", args, ran.Name(), err)
			}
			var ue usageError
			if !errors.As(err, &ue) {
				t.Fatalf("%q: parse error is not a usage error (exit %d instead of %d): %v", args, exitError, exitUsage, err)
			}
		}
		ran2, out2, err2 := parseCLI(args)
		if (ran == nil) != (ran2 == nil) || (ran != nil && ran.CommandPath() != ran2.CommandPath()) ||
			(err == nil) != (err2 == nil) || (err != nil && err.Error() != err2.Error()) || out != out2 {
			t.Fatalf("%q: parsing is not deterministic", args)
		}
	})
}
