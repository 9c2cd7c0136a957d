package main

import (
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
)

// writeKeepAliveChart writes the keep-alive chart to path, when the
// keep-alive scenarios ran, and links it from the report.
func writeKeepAliveChart(w io.Writer, e *env, f figures, path string) error {
	var points []keepChartPoint
	for _, n := range e.keepAlive {
		res, ok := f[keepAliveTitle(n)]
		if !ok {
			continue
		}
		p := keepChartPoint{leases: n, pgbaton: math.NaN(), naive: math.NaN()}
		for _, r := range res {
			switch {
			case strings.HasPrefix(r.impl.name, "pgbaton"):
				p.pgbaton = r.median("commits/s")
			case r.impl.skip != "":
				p.naive, p.computed = float64(n)/(keepTTL/3).Seconds(), true
			default:
				p.naive = r.median("commits/s")
			}
		}
		points = append(points, p)
	}
	if len(points) == 0 {
		return nil
	}
	if err := os.WriteFile(path, []byte(keepAliveChart(points)), 0o644); err != nil {
		return err
	}
	_, err := fmt.Fprintf(w, "### Keep-alive: commits/s by leases held\n\n![server commits/s against leases held, pgbaton and naive renewal](%s)\n\n",
		filepath.Base(path))
	return err
}

// keepChartPoint is one lease count of the keep-alive chart: pgbaton's
// measured commits/s and the naive per-lease renewal's, measured or
// computed.
type keepChartPoint struct {
	leases   int
	pgbaton  float64 // NaN when not measured
	naive    float64
	computed bool // naive is N ÷ interval, not measured
}

// keepAliveChart draws commits/s against leases held, both on log scales,
// as a small SVG.
func keepAliveChart(points []keepChartPoint) string {
	const w, h, left, right, top, bottom = 560, 320, 70, 20, 30, 50
	minX, maxX := math.Inf(1), math.Inf(-1)
	maxY := 10.0
	for _, p := range points {
		minX, maxX = math.Min(minX, float64(p.leases)), math.Max(maxX, float64(p.leases))
		if !math.IsNaN(p.naive) {
			maxY = math.Max(maxY, p.naive)
		}
	}
	lx0, lx1 := math.Floor(math.Log10(minX)), math.Ceil(math.Log10(maxX))
	if lx1 == lx0 {
		lx1++
	}
	ly0, ly1 := -1.0, math.Ceil(math.Log10(maxY))
	x := func(v float64) float64 {
		return left + (math.Log10(v)-lx0)/(lx1-lx0)*(w-left-right)
	}
	y := func(v float64) float64 {
		v = math.Max(v, math.Pow(10, ly0))
		return h - bottom - (math.Log10(v)-ly0)/(ly1-ly0)*(h-top-bottom)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", w, h, w, h)
	fmt.Fprintf(&b, `<rect width="%d" height="%d" fill="white"/>`+"\n", w, h)
	fmt.Fprintf(&b, `<text x="%d" y="18" font-weight="bold">Keeping N leases alive (TTL 3s): server commits/s</text>`+"\n", left)
	for e := lx0; e <= lx1; e++ {
		px := x(math.Pow(10, e))
		fmt.Fprintf(&b, `<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>`+"\n", px, top, px, h-bottom)
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" text-anchor="middle">%s</text>`+"\n", px, h-bottom+16, thousands(int(math.Pow(10, e))))
	}
	for e := ly0; e <= ly1; e++ {
		py := y(math.Pow(10, e))
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>`+"\n", left, py, w-right, py)
		label := thousands(int(math.Pow(10, e)))
		if e < 0 {
			label = fmt.Sprintf("%g", math.Pow(10, e))
		}
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, py+4, label)
	}
	fmt.Fprintf(&b, `<text x="%d" y="%d" text-anchor="middle">leases held by one client</text>`+"\n", (left+w-right)/2, h-12)
	series := func(color string, val func(keepChartPoint) (float64, bool)) {
		var path []string
		for _, p := range points {
			v, measured := val(p)
			if math.IsNaN(v) {
				continue
			}
			px, py := x(float64(p.leases)), y(v)
			path = append(path, fmt.Sprintf("%.1f,%.1f", px, py))
			fill := color
			if !measured {
				fill = "white"
			}
			fmt.Fprintf(&b, `<circle cx="%.1f" cy="%.1f" r="4" fill="%s" stroke="%s"/>`+"\n", px, py, fill, color)
		}
		if len(path) > 1 {
			fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s"/>`+"\n", strings.Join(path, " "), color)
		}
	}
	series("#c0392b", func(p keepChartPoint) (float64, bool) { return p.naive, !p.computed })
	series("#2471a3", func(p keepChartPoint) (float64, bool) { return p.pgbaton, true })
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#c0392b">naive: one renewal per lease per second (hollow: computed)</text>`+"\n", left+10, top+14)
	fmt.Fprintf(&b, `<text x="%d" y="%d" fill="#2471a3">pgbaton: one keep-alive per client</text>`+"\n", left+10, top+30)
	b.WriteString("</svg>\n")
	return b.String()
}
