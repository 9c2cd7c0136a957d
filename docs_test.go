package pgbaton_test

import (
	"bufio"
	"go/build/constraint"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestDocsCodeBlocksAreCompiled keeps the Go code of README.md and
// docs/*.md from drifting away from the API: every ```go block must appear,
// line for line, in a .go file of this repository that the Go tool
// compiles — as the body (or a whole top-level part) of an example
// function, which `make test` also runs. Lines are compared with their
// indentation and runs of blanks collapsed, and blank lines are skipped;
// comments count. Blocks of other languages (sh, sql, text) are not
// checked.
//
// A block found nowhere fails with the Markdown file and line of the block
// and the first of its lines that no .go file continues with.
func TestDocsCodeBlocksAreCompiled(t *testing.T) {
	docs, err := filepath.Glob(filepath.Join("docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append([]string{"README.md"}, docs...)
	code := compiledGoLines(t, ".")

	total := 0
	for _, doc := range docs {
		blocks := goBlocks(t, doc)
		if doc == "README.md" && len(blocks) == 0 {
			t.Errorf("README.md: no ```go block found; the check would check nothing")
		}
		for _, b := range blocks {
			total++
			if len(b.lines) == 0 {
				t.Errorf("%s:%d: empty go block", doc, b.start)
				continue
			}
			matched, where := code.longestRun(b.lines)
			if matched == len(b.lines) {
				continue
			}
			hint := "no .go file has its first line"
			switch {
			case matched == 1:
				hint = "its first line is in " + where + ", the next is not"
			case matched > 1:
				hint = "its first " + strconv.Itoa(matched) + " lines are in " + where + ", the next is not"
			}
			t.Errorf("%s:%d: go block drifted from the code: %s: line %d %q\n"+
				"\tevery ```go block must be the body (or a whole top-level part) of an example function, "+
				"line for line; edit the example and the block together",
				doc, b.start, hint, b.lineNo[matched], b.lines[matched])
		}
	}
	t.Logf("%d go blocks in %d Markdown files checked against %d .go files", total, len(docs), len(code.files))
}

// block is one ```go block: its normalised non-blank lines and, for each,
// its line number in the Markdown file.
type block struct {
	start  int // line of the opening fence
	lines  []string
	lineNo []int
}

// goBlocks returns the ```go blocks of a Markdown file. Fences may be
// indented (blocks inside list items).
func goBlocks(t *testing.T, path string) []block {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var (
		blocks []block
		cur    *block
		fence  string // the opening fence's backticks while inside any block
		isGo   bool
	)
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		trimmed := strings.TrimSpace(line)
		if fence == "" {
			if !strings.HasPrefix(trimmed, "```") {
				continue
			}
			fence = trimmed[:len(trimmed)-len(strings.TrimLeft(trimmed, "`"))]
			info := strings.Fields(strings.ToLower(strings.TrimPrefix(trimmed, fence)))
			isGo = len(info) > 0 && (info[0] == "go" || info[0] == "golang")
			if isGo {
				cur = &block{start: n}
			}
			continue
		}
		if strings.HasPrefix(trimmed, fence) && strings.Trim(trimmed, "`") == "" {
			if isGo {
				blocks = append(blocks, *cur)
			}
			fence, isGo, cur = "", false, nil
			continue
		}
		if isGo {
			if l := normLine(line); l != "" {
				cur.lines = append(cur.lines, l)
				cur.lineNo = append(cur.lineNo, n)
			}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if fence != "" {
		t.Errorf("%s: a code block is never closed", path)
	}
	return blocks
}

// goLines are the normalised non-blank lines of the compiled .go files,
// indexed by line for the search.
type goLines struct {
	files []string
	lines [][]string
	at    map[string][][2]int // line -> (file, index) where it occurs
}

// compiledGoLines reads every .go file under root that the Go tool
// compiles in some build: not under testdata, a directory or file whose
// name starts with "." or "_", nor behind a //go:build ignore constraint.
func compiledGoLines(t *testing.T, root string) *goLines {
	t.Helper()
	g := &goLines{at: map[string][][2]int{}}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || name == "node_modules" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(name, ".go") || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if ignored(string(src)) {
			return nil
		}
		var lines []string
		for l := range strings.SplitSeq(string(src), "\n") {
			if l = normLine(l); l != "" {
				lines = append(lines, l)
			}
		}
		fi := len(g.files)
		g.files = append(g.files, path)
		g.lines = append(g.lines, lines)
		for i, l := range lines {
			g.at[l] = append(g.at[l], [2]int{fi, i})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(g.files) == 0 {
		t.Fatal("no .go files found")
	}
	return g
}

// ignored reports whether a file's //go:build constraint keeps it out of
// every build (the "ignore" convention).
func ignored(src string) bool {
	for l := range strings.SplitSeq(src, "\n") {
		l = strings.TrimSpace(l)
		if strings.HasPrefix(l, "package ") {
			return false
		}
		if !constraint.IsGoBuild(l) {
			continue
		}
		expr, err := constraint.Parse(l)
		if err != nil {
			return false
		}
		return !expr.Eval(func(tag string) bool { return tag != "ignore" })
	}
	return false
}

// longestRun returns how many of want's first lines occur, one after
// another, in some file, and where the longest such run starts.
func (g *goLines) longestRun(want []string) (int, string) {
	best, where := 0, ""
	for _, pos := range g.at[want[0]] {
		lines := g.lines[pos[0]]
		n := 0
		for n < len(want) && pos[1]+n < len(lines) && lines[pos[1]+n] == want[n] {
			n++
		}
		if n > best {
			best, where = n, g.files[pos[0]]
		}
		if best == len(want) {
			break
		}
	}
	return best, where
}

// normLine trims a line and collapses its runs of blanks, so that
// indentation and gofmt's alignment of comments do not count.
func normLine(l string) string { return strings.Join(strings.Fields(l), " ") }
