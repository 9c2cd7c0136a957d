package main

// The charts of a run: SVG files drawn with gonum/plot from the same
// medians (and min–max over the runs) as the report's tables, for the
// figures people would rather look at than read. Each chart is drawn from
// whichever of its scenarios ran; one whose scenarios are all absent is
// not written, and lacking data never fails the run.

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"

	xfont "golang.org/x/image/font"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/font"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// The chart files, in the order the report shows them, with their alt
// text.
var charts = []struct {
	file, alt string
	draw      func(figures) (*figure, error)
}{
	{"claim-throughput.svg", "Claim throughput against backlog", claimChart},
	{"keepalive-cost.svg", "Keep-alive cost against leases held", keepaliveChart},
	{"handover-latency.svg", "Handover latency", handoverChart},
}

// writeCharts draws the charts that all has data for into dir and returns
// the paths of the files written; a chart that fails is left out and its
// error returned, the others are still drawn.
func writeCharts(dir string, all figures) ([]string, error) {
	// Liberation Sans has Arial's metrics, so that the text the SVG
	// names Arial (see save) is as wide as plot measured it.
	plot.DefaultFont = font.Font{Typeface: "Liberation", Variant: "Sans"}
	var written []string
	var errs []error
	for _, c := range charts {
		path, err := writeChart(dir, c.file, c.draw, all)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", c.file, err))
		}
		if path != "" && err == nil {
			written = append(written, path)
		}
	}
	return written, errors.Join(errs...)
}

// writeChart draws one chart into dir/file and returns its path, or ""
// when there is nothing to draw. A panic of the plotting library is
// returned as an error.
func writeChart(dir, file string, drawFn func(figures) (*figure, error), all figures) (path string, err error) {
	defer func() {
		if p := recover(); p != nil {
			path, err = "", fmt.Errorf("panic: %v", p)
		}
	}()
	fig, err := drawFn(all)
	if err != nil || fig == nil {
		return "", err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path = filepath.Join(dir, file)
	return path, fig.save(path)
}

// chartsSection writes the charts into dir and returns the report's
// section linking them, relative to the report file out (or to the
// working directory without one). A chart that cannot be written is
// logged, never fatal: the run's figures matter more.
func chartsSection(dir, out string, all figures, logf func(string, ...any)) string {
	paths, err := writeCharts(dir, all)
	if err != nil {
		logf("charts: %v", err)
	}
	if len(paths) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("## Charts\n\nDrawn from the figures below: medians of the runs, with min–max whiskers.\n\n")
	for _, p := range paths {
		alt := filepath.Base(p)
		for _, c := range charts {
			if c.file == alt {
				alt = c.alt
			}
		}
		link := p
		if rel, err := filepath.Rel(filepath.Dir(out), p); err == nil {
			link = rel
		}
		fmt.Fprintf(&b, "![%s](%s)\n\n", alt, filepath.ToSlash(link))
	}
	return b.String()
}

// figure is one chart: panels in a grid, a title above and a legend to
// the right.
type figure struct {
	title  string
	cols   int
	panels []*plot.Plot
	legend plot.Legend
	// legendLabels are the series already in the legend.
	legendLabels []string
	w, h         vg.Length
}

const legendWidth = 175

func newFigure(title string, cols int, w, h vg.Length) *figure {
	l := plot.NewLegend()
	l.Top, l.Left = true, true
	l.TextStyle.Font.Size = 9
	l.Padding = 2
	return &figure{title: title, cols: cols, legend: l, w: w, h: h}
}

func (f *figure) save(path string) error {
	c := vgsvg.New(f.w, f.h)
	dc := draw.New(c)
	// An opaque background: a transparent one turns the black text
	// invisible on a dark page.
	dc.FillPolygon(color.White, []vg.Point{{X: 0, Y: 0}, {X: f.w, Y: 0}, {X: f.w, Y: f.h}, {X: 0, Y: f.h}})
	title := text.Style{Color: color.Black, Font: font.From(plot.DefaultFont, 13), XAlign: draw.XLeft, YAlign: draw.YTop,
		Handler: plot.DefaultTextHandler}
	title.Font.Weight = xfont.WeightBold
	dc.FillText(title, vg.Point{X: 10, Y: f.h - 8}, f.title)
	body := draw.Crop(dc, 0, 0, 0, -(title.Height(f.title) + 14))
	f.legend.Draw(draw.Crop(body, f.w-legendWidth, 0, 0, -16))
	grid := draw.Crop(body, 0, -legendWidth, 0, 0)

	rows := (len(f.panels) + f.cols - 1) / f.cols
	plots := make([][]*plot.Plot, rows)
	for i := range plots {
		plots[i] = make([]*plot.Plot, f.cols)
	}
	for i, p := range f.panels {
		plots[i/f.cols][i%f.cols] = p
	}
	tiles := draw.Tiles{Rows: rows, Cols: f.cols, PadX: 24, PadY: 20, PadLeft: 6, PadRight: 6, PadBottom: 4}
	canvases := plot.Align(plots, tiles, grid)
	for i, p := range f.panels {
		p.Draw(canvases[i/f.cols][i%f.cols])
	}
	var buf bytes.Buffer
	if _, err := c.WriteTo(&buf); err != nil {
		return err
	}
	// vgsvg names the font alone; with fonts not embedded (they would
	// weigh hundreds of kB) a viewer without Liberation Sans would fall
	// back to its default, often a serif. Name metric-compatible ones.
	svg := strings.ReplaceAll(buf.String(), "font-family:Liberation Sans;", "font-family:'Liberation Sans',Arial,Helvetica,sans-serif;")
	return os.WriteFile(path, []byte(svg), 0o644)
}

// style is how one implementation is drawn in every chart.
type style struct {
	short string
	color color.Color
	glyph draw.GlyphDrawer
}

var implStyles = []struct {
	prefix string
	style
}{
	{"pgbaton", style{"pgbaton", rgb(0x1f, 0x77, 0xb4), draw.CircleGlyph{}}},
	{"raw pgx", style{"raw pgx", rgb(0x7f, 0x7f, 0x7f), draw.SquareGlyph{}}},
	{"go-pglock", style{"go-pglock", rgb(0x2c, 0xa0, 0x2c), draw.TriangleGlyph{}}},
	{"River", style{"River", rgb(0xd6, 0x27, 0x28), draw.PyramidGlyph{}}},
	{"gue", style{"gue", rgb(0x94, 0x67, 0xbd), draw.BoxGlyph{}}},
	{"redislock", style{"redislock", rgb(0xff, 0x7f, 0x0e), draw.CrossGlyph{}}},
}

var otherColors = []color.Color{rgb(0x8c, 0x56, 0x4b), rgb(0xe3, 0x77, 0xc2), rgb(0xbc, 0xbd, 0x22), rgb(0x17, 0xbe, 0xcf)}

func rgb(r, g, b uint8) color.Color { return color.RGBA{R: r, G: g, B: b, A: 255} }

// implStyle is the style of the implementation named name: by its name's
// first word(s), else a colour of its own by its place among others.
func implStyle(name string, others *[]string) style {
	for _, s := range implStyles {
		if strings.HasPrefix(strings.ToLower(name), strings.ToLower(s.prefix)) {
			return s.style
		}
	}
	i := slices.Index(*others, name)
	if i < 0 {
		i = len(*others)
		*others = append(*others, name)
	}
	short, _, _ := strings.Cut(name, " (")
	return style{short, otherColors[i%len(otherColors)], draw.RingGlyph{}}
}

// measured reports whether r has figures for metric m.
func measured(r *result, m string) bool {
	if r.impl.skip != "" || len(r.values[m]) == 0 {
		return false
	}
	for _, v := range r.values[m] {
		if math.IsNaN(v) || math.IsInf(v, 0) {
			return false
		}
	}
	return true
}

// metricLike returns the first metric of r whose name contains want
// (case-insensitively), sorted by name for a stable choice.
func metricLike(r *result, want string) string {
	keys := make([]string, 0, len(r.values))
	for k := range r.values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if strings.Contains(strings.ToLower(k), strings.ToLower(want)) {
			return k
		}
	}
	return ""
}

// point is one median with its min–max over the runs.
type point struct{ x, y, lo, hi float64 }

type points []point

func (ps points) Len() int                    { return len(ps) }
func (ps points) XY(i int) (float64, float64) { return ps[i].x, ps[i].y }
func (ps points) YError(i int) (float64, float64) {
	return ps[i].y - ps[i].lo, ps[i].hi - ps[i].y
}

func pointOf(x float64, r *result, m string) point {
	lo, hi := r.minmax(m)
	return point{x: x, y: r.median(m), lo: lo, hi: hi}
}

// series is one implementation's line in a panel.
type series struct {
	label string
	style style
	pts   points
}

// addLines draws each series as a line with points and, where the runs
// differ, min–max whiskers.
func addLines(p *plot.Plot, ss []*series) error {
	for _, s := range ss {
		slices.SortFunc(s.pts, func(a, b point) int { return cmp.Compare(a.x, b.x) })
		l, sc, err := plotter.NewLinePoints(s.pts)
		if err != nil {
			return err
		}
		l.Color, l.Width = s.style.color, vg.Points(1.5)
		sc.Color, sc.Shape, sc.Radius = s.style.color, s.style.glyph, vg.Points(3)
		p.Add(l, sc)
		if spread(s.pts) {
			eb, err := plotter.NewYErrorBars(s.pts)
			if err != nil {
				return err
			}
			eb.Color, eb.CapWidth = s.style.color, vg.Points(6)
			p.Add(eb)
		}
	}
	return nil
}

func spread(ps points) bool {
	for _, p := range ps {
		if p.hi > p.lo {
			return true
		}
	}
	return false
}

// yRange is the range of the points' whiskers.
func yRange(sss ...[]*series) (lo, hi float64) {
	lo, hi = math.Inf(1), math.Inf(-1)
	for _, ss := range sss {
		for _, s := range ss {
			for _, p := range s.pts {
				lo, hi = min(lo, p.lo, p.y), max(hi, p.hi, p.y)
			}
		}
	}
	return lo, hi
}

// setY gives every panel the same Y range: logarithmic when the figures
// span more than a factor of 30 (and are all positive), else linear from 0.
func setY(ps []*plot.Plot, lo, hi float64) {
	logY := lo > 0 && hi/lo > 30
	for _, p := range ps {
		if logY {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = commaTicks{plot.LogTicks{Prec: -1}}
			// From a power of ten, so that the bottom has a label.
			p.Y.Min, p.Y.Max = math.Pow(10, math.Floor(math.Log10(lo/1.2))), hi*1.5
		} else {
			p.Y.Tick.Marker = commaTicks{plot.DefaultTicks{}}
			p.Y.Min, p.Y.Max = 0, max(hi*1.1, 1)
		}
	}
}

// setX puts the x values xs (all positive) on a logarithmic axis when they
// span a factor of 10 or more, with a tick at each.
func setX(p *plot.Plot, xs []float64) {
	slices.Sort(xs)
	xs = slices.Compact(xs)
	if len(xs) == 0 {
		return
	}
	lo, hi := xs[0], xs[len(xs)-1]
	var ticks []plot.Tick
	for _, x := range xs {
		ticks = append(ticks, plot.Tick{Value: x, Label: commas(x)})
	}
	if lo > 0 && hi/lo >= 10 {
		p.X.Scale = plot.LogScale{}
		p.X.Min, p.X.Max = lo/1.5, hi*1.5
	} else {
		pad := max((hi-lo)*0.08, math.Abs(lo)*0.1, 0.5)
		p.X.Min, p.X.Max = lo-pad, hi+pad
	}
	if len(xs) <= 8 {
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
	} else if lo > 0 && hi/lo >= 10 {
		p.X.Tick.Marker = commaTicks{plot.LogTicks{Prec: -1}}
	} else {
		p.X.Tick.Marker = commaTicks{plot.DefaultTicks{}}
	}
}

// commaTicks writes the labels of its Ticker with thousands separators.
type commaTicks struct{ plot.Ticker }

func (t commaTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := t.Ticker.Ticks(lo, hi)
	for i := range ts {
		if v, err := strconv.ParseFloat(ts[i].Label, 64); err == nil {
			ts[i].Label = commas(v)
		}
	}
	return ts
}

// commas formats v, with thousands separators when it is a whole number.
func commas(v float64) string {
	if v != math.Trunc(v) || math.Abs(v) >= 1e15 {
		return strconv.FormatFloat(v, 'g', -1, 64)
	}
	s := strconv.FormatInt(int64(math.Abs(v)), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	if v < 0 {
		s = "-" + s
	}
	return s
}

// newPanel is a plot with a grid; vertical says whether the grid has
// vertical lines too.
func newPanel(title, xLabel, yLabel string, vertical bool) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.Title.TextStyle.Font.Size = 11
	p.X.Label.Text, p.Y.Label.Text = xLabel, yLabel
	p.X.Label.TextStyle.Font.Size, p.Y.Label.TextStyle.Font.Size = 9, 10
	p.X.Tick.Label.Font.Size, p.Y.Tick.Label.Font.Size = 9, 9
	g := plotter.NewGrid()
	if !vertical {
		g.Vertical.Color = nil
	}
	p.Add(g)
	return p
}

// --- claim throughput against backlog

var claimTitle = regexp.MustCompile(`^Work items: claim \+ complete, batch (\d+), (\d+) (?:of (\d+) queued )?rows$`)

// claimChart: items/s per implementation against batch size, a panel per
// queue depth (the drained rows alone, then the slice of a deep queue).
func claimChart(all figures) (*figure, error) {
	type depth struct {
		rows, queued int
		series       []*series
	}
	depths := map[[2]int]*depth{}
	var others []string
	for _, title := range sortedTitles(all) {
		m := claimTitle.FindStringSubmatch(title)
		if m == nil {
			continue
		}
		batch, _ := strconv.Atoi(m[1])
		rows, _ := strconv.Atoi(m[2])
		queued := rows
		if m[3] != "" {
			queued, _ = strconv.Atoi(m[3])
		}
		for _, r := range all[title] {
			if !measured(r, "items/s") {
				continue
			}
			key := [2]int{rows, queued}
			d := depths[key]
			if d == nil {
				d = &depth{rows: rows, queued: queued}
				depths[key] = d
			}
			i := slices.IndexFunc(d.series, func(s *series) bool { return s.label == r.impl.name })
			if i < 0 {
				i = len(d.series)
				d.series = append(d.series, &series{label: r.impl.name, style: implStyle(r.impl.name, &others)})
			}
			d.series[i].pts = append(d.series[i].pts, pointOf(float64(batch), r, "items/s"))
		}
	}
	if len(depths) == 0 {
		return nil, nil
	}
	ds := make([]*depth, 0, len(depths))
	for _, d := range depths {
		ds = append(ds, d)
	}
	slices.SortFunc(ds, func(a, b *depth) int { return cmp.Or(cmp.Compare(a.queued, b.queued), cmp.Compare(a.rows, b.rows)) })

	fig := newFigure(fmt.Sprintf("Work items: claim + complete throughput, %d workers (higher is better)", claimWorkers),
		len(ds), vg.Points(float64(270*len(ds)+legendWidth+20)), 340)
	var perPanel [][]*series
	for _, d := range ds {
		name := commas(float64(d.rows)) + " rows queued"
		if d.queued != d.rows {
			name = fmt.Sprintf("%s of %s queued rows", commas(float64(d.rows)), commas(float64(d.queued)))
		}
		p := newPanel(name, "batch size (items per claim)", "items/s", true)
		if len(fig.panels) > 0 {
			p.Y.Label.Text = ""
		}
		if err := addLines(p, d.series); err != nil {
			return nil, err
		}
		var xs []float64
		for _, s := range d.series {
			for _, pt := range s.pts {
				xs = append(xs, pt.x)
			}
		}
		setX(p, xs)
		fig.panels = append(fig.panels, p)
		perPanel = append(perPanel, d.series)
	}
	lo, hi := yRange(perPanel...)
	setY(fig.panels, lo, hi)
	fig.legendFor(perPanel...)
	fig.note("", "points: median of runs", "whiskers: min–max of runs")
	return fig, nil
}

// legendFor adds an entry per series label, once.
func (f *figure) legendFor(sss ...[]*series) {
	for _, ss := range sss {
		for _, s := range ss {
			if slices.Contains(f.legendLabels, s.label) {
				continue
			}
			f.legendLabels = append(f.legendLabels, s.label)
			l, _ := plotter.NewLine(points{})
			l.Color, l.Width = s.style.color, vg.Points(1.5)
			sc, _ := plotter.NewScatter(points{})
			sc.Color, sc.Shape, sc.Radius = s.style.color, s.style.glyph, vg.Points(3)
			f.legend.Add(s.label, l, sc)
		}
	}
}

// note adds lines of text to the legend.
func (f *figure) note(lines ...string) {
	for _, l := range lines {
		f.legend.Add(l)
	}
}

// sortedTitles are all's scenario titles in a stable order.
func sortedTitles(all figures) []string {
	ts := make([]string, 0, len(all))
	for t := range all {
		ts = append(ts, t)
	}
	slices.Sort(ts)
	return ts
}

// --- handover latency

// handoverChart: p50 and p99 handover latency per implementation, a panel
// per handover scenario (advisory and lease; on release and after SIGKILL
// of the holder). The scenarios record each run's p50 and p99, not every
// sample, so these are what it shows: medians of the runs' percentiles.
func handoverChart(all figures) (*figure, error) {
	var titles []string
	for _, t := range sortedTitles(all) {
		if strings.Contains(strings.ToLower(t), "handover latency") {
			titles = append(titles, t)
		}
	}
	rank := func(t string) int {
		r := 0
		if strings.HasPrefix(t, "Lease") {
			r += 2
		}
		if strings.Contains(t, "SIGKILL") {
			r++
		}
		return r
	}
	slices.SortStableFunc(titles, func(a, b string) int { return cmp.Compare(rank(a), rank(b)) })
	var panels []*plot.Plot
	var others []string
	for _, t := range titles {
		var rs []*result
		for _, r := range all[t] {
			if measured(r, "p50 ms") {
				rs = append(rs, r)
			}
		}
		if len(rs) == 0 {
			continue
		}
		p := newPanel(strings.Replace(t, " handover latency", "", 1), "", "ms", false)
		width := vg.Points(min(40, 200/float64(len(rs))))
		var names []string
		hi := 0.0
		for i, r := range rs {
			st := implStyle(r.impl.name, &others)
			names = append(names, st.short)
			p50 := pointOf(float64(i), r, "p50 ms")
			bar, err := plotter.NewBarChart(plotter.Values{p50.y}, width)
			if err != nil {
				return nil, err
			}
			bar.XMin, bar.Color, bar.LineStyle.Width = float64(i), st.color, 0
			p.Add(bar)
			pts := points{p50}
			if measured(r, "p99 ms") {
				pts = append(pts, pointOf(float64(i), r, "p99 ms"))
				sc, err := plotter.NewScatter(pts[1:])
				if err != nil {
					return nil, err
				}
				sc.Color, sc.Shape, sc.Radius = p99Color, draw.CircleGlyph{}, vg.Points(3.5)
				p.Add(sc)
			}
			if spread(pts) {
				eb, err := plotter.NewYErrorBars(pts)
				if err != nil {
					return nil, err
				}
				eb.CapWidth = width / 2
				eb.Color = p99Color
				p.Add(eb)
			}
			for _, pt := range pts {
				hi = max(hi, pt.hi, pt.y)
			}
		}
		p.NominalX(names...)
		p.Y.Min, p.Y.Max = 0, cmp.Or(hi*1.12, 1)
		p.Y.Tick.Marker = commaTicks{plot.DefaultTicks{}}
		panels = append(panels, p)
	}
	if len(panels) == 0 {
		return nil, nil
	}
	cols := min(2, len(panels))
	rows := (len(panels) + cols - 1) / cols
	fig := newFigure("Handover latency: p50 and p99 of each run, median of runs (lower is better)", cols,
		vg.Points(float64(300*cols+legendWidth+20)), vg.Points(float64(240*rows+40)))
	fig.panels = panels
	bar, _ := plotter.NewBarChart(plotter.Values{1}, 10)
	bar.Color, bar.LineStyle.Width = color.White, vg.Points(1)
	fig.legend.Add("p50 (bar)", bar)
	sc, _ := plotter.NewScatter(points{})
	sc.Color, sc.Shape, sc.Radius = p99Color, draw.CircleGlyph{}, vg.Points(3.5)
	fig.legend.Add("p99", sc)
	fig.note("", "whiskers: min–max of runs", "per-run percentiles,", "not every sample")
	return fig, nil
}

var p99Color = rgb(0x33, 0x33, 0x33)

// --- keep-alive cost against leases held

var firstInt = regexp.MustCompile(`\d{1,3}(?:,\d{3})+|\d+`)

// keepaliveChart: server commits/s, and leases lost, against the number
// of leases one client holds, from the scenarios titled "Keep-alive…"
// with that number in the title (commas allowed) and metrics whose names
// contain "commits/s" and "lost".
func keepaliveChart(all figures) (*figure, error) {
	type obs struct {
		n        float64
		template string
		r        *result
	}
	var seen []obs
	templates := map[string]bool{}
	for _, t := range sortedTitles(all) {
		if !strings.HasPrefix(strings.ToLower(t), "keep-alive") {
			continue
		}
		loc := firstInt.FindStringIndex(t)
		if loc == nil {
			continue
		}
		n, err := strconv.ParseFloat(strings.ReplaceAll(t[loc[0]:loc[1]], ",", ""), 64)
		if err != nil || n <= 0 {
			continue
		}
		tmpl := t[:loc[0]] + "N" + t[loc[1]:]
		for _, r := range all[t] {
			seen = append(seen, obs{n, tmpl, r})
			templates[tmpl] = true
		}
	}
	var commits, lost []*series
	var others []string
	add := func(ss *[]*series, label string, st style, pt point) {
		i := slices.IndexFunc(*ss, func(s *series) bool { return s.label == label })
		if i < 0 {
			i = len(*ss)
			*ss = append(*ss, &series{label: label, style: st})
		}
		(*ss)[i].pts = append((*ss)[i].pts, pt)
	}
	commitsName, lostName := "", ""
	var xs []float64
	for _, o := range seen {
		label := o.r.impl.name
		if len(templates) > 1 {
			label += " · " + o.template
		}
		st := implStyle(o.r.impl.name, &others)
		if m := metricLike(o.r, "commits/s"); m != "" && measured(o.r, m) {
			add(&commits, label, st, pointOf(o.n, o.r, m))
			commitsName = cmp.Or(commitsName, m)
			xs = append(xs, o.n)
		}
		if m := metricLike(o.r, "lost"); m != "" && measured(o.r, m) {
			add(&lost, label, st, pointOf(o.n, o.r, m))
			lostName = cmp.Or(lostName, m)
			xs = append(xs, o.n)
		}
	}
	if len(commits) == 0 && len(lost) == 0 {
		return nil, nil
	}
	fig := newFigure("Keep-alive cost: one client holding N leases (lower is better)", 1, 0, 0)
	for _, panel := range []struct {
		title, metric string
		ss            []*series
	}{
		{"Server commits per second", commitsName, commits},
		{"Leases lost", lostName, lost},
	} {
		if len(panel.ss) == 0 {
			continue
		}
		p := newPanel(panel.title, "leases held by one client", panel.metric, true)
		if err := addLines(p, panel.ss); err != nil {
			return nil, err
		}
		setX(p, slices.Clone(xs))
		lo, hi := yRange(panel.ss)
		setY([]*plot.Plot{p}, lo, hi)
		fig.panels = append(fig.panels, p)
		fig.legendFor(panel.ss)
	}
	fig.w, fig.h = vg.Points(float64(480+legendWidth+20)), vg.Points(float64(220*len(fig.panels)+40))
	fig.note("", "points: median of runs", "whiskers: min–max of runs")
	return fig, nil
}
