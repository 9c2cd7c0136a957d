package main

import "golang.org/x/term"

// isTerminal reports whether f (a stream of the CLI) is a terminal: only
// then does the CLI move the cursor, colour its output or ask a question.
func isTerminal(f any) bool {
	fd, ok := f.(interface{ Fd() uintptr })
	return ok && term.IsTerminal(int(fd.Fd()))
}

// cursor reports whether stdout takes cursor control (clearing the
// screen): a terminal that is not TERM=dumb.
func (g *globals) cursor() bool {
	return isTerminal(g.stdout) && g.getenv("TERM") != "dumb"
}

// color reports whether stdout takes colour: a terminal, and NO_COLOR
// unset or empty (no-color.org).
func (g *globals) color() bool {
	return g.cursor() && g.getenv("NO_COLOR") == ""
}

// ANSI SGR sequences, used only when color() says so.
const (
	sgrBold   = "\x1b[1m"
	sgrYellow = "\x1b[33m"
	sgrReset  = "\x1b[0m"
	// clearHome clears the screen and moves the cursor home, like watch(1).
	clearHome = "\x1b[H\x1b[2J"
)

// paint wraps s in sgr when colour is on.
func (g *globals) paint(sgr, s string) string {
	if !g.color() {
		return s
	}
	return sgr + s + sgrReset
}
