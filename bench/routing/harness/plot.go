package harness

import (
	"fmt"
	"image/color"
	"os"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// palette gives each policy a fixed colour and dash across panels.
func palette() []color.Color {
	return []color.Color{
		color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0xbc, 0xbd, 0x22, 0xff},
		color.RGBA{0x8c, 0x56, 0x4b, 0xff}, color.RGBA{0xe3, 0x77, 0xc2, 0xff}, color.RGBA{0x1f, 0x77, 0xb4, 0xff},
		color.RGBA{0x17, 0xbe, 0xcf, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff},
		color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, color.RGBA{0x00, 0x00, 0x00, 0xff},
	}
}

// Plots writes ttft-p90.png and throughput.png into dir: one panel per
// workload, x = offered QPS, one line per policy. It needs at least two
// open-loop loads of a workload to draw its lines.
func Plots(as []agg, dir string) error {
	for _, spec := range []struct {
		file, ylabel string
		y            func(Result) float64
		log          bool
	}{
		// TTFT spans milliseconds to seconds across the knee: log scale.
		{"ttft-p90.png", "TTFT p90 (s, log)", func(r Result) float64 { return r.TTFTp90 }, true},
		{"throughput.png", "output tokens/s", func(r Result) float64 { return r.OutTokPerS }, false},
	} {
		if err := plotGrid(as, spec.ylabel, spec.y, spec.log, plotPath(dir, spec.file)); err != nil {
			return err
		}
	}
	return nil
}

func plotGrid(as []agg, ylabel string, y func(Result) float64, logY bool, path string) error {
	wls := plottedWorkloads(as)
	if len(wls) == 0 {
		return nil
	}
	cols := 3
	rows := (len(wls) + cols - 1) / cols
	plots := make([][]*plot.Plot, rows)
	for r := range plots {
		plots[r] = make([]*plot.Plot, cols)
	}
	for i, w := range wls {
		p, err := workloadPanel(as, w, ylabel, y, logY, i == 0)
		if err != nil {
			return err
		}
		plots[i/cols][i%cols] = p
	}
	return writeGrid(plots, rows, cols, path)
}

// plottedWorkloads lists, in report order, the workloads with at least two
// distinct open-loop loads: fewer cannot draw a line.
func plottedWorkloads(as []agg) []string {
	var wls []string
	for _, w := range Workloads() {
		var seen []float64
		for _, a := range as {
			if a.workload == w && a.load.Kind() == "qps" && !slices.Contains(seen, a.load.QPS) {
				seen = append(seen, a.load.QPS)
			}
		}
		if len(seen) >= 2 {
			wls = append(wls, w)
		}
	}
	return wls
}

// workloadPanel draws one workload's panel: a line per policy with at least
// two points. Only the first panel carries the legend.
func workloadPanel(as []agg, w, ylabel string, y func(Result) float64, logY, legend bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = w
	p.X.Label.Text = "offered QPS"
	p.Y.Label.Text = ylabel
	p.Legend.Top, p.Legend.Left = true, true
	if logY {
		p.Y.Scale = plot.LogScale{}
		p.Y.Tick.Marker = ticks125{}
	}
	p.Legend.TextStyle.Font.Size = vg.Points(7)
	colors := palette()
	for k, pol := range Policies() {
		pts := policyPoints(as, w, pol, y, logY)
		if len(pts) < 2 {
			continue
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", w, err)
		}
		l.Color = colors[k%len(colors)]
		l.Width = vg.Points(1.2)
		if k >= 5 {
			l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
		}
		p.Add(l)
		if legend {
			p.Legend.Add(pol, l)
		}
	}
	return p, nil
}

// policyPoints is pol's open-loop (QPS, y) points on workload w sorted by
// QPS; a log axis cannot show y ≤ 0, so those points are dropped.
func policyPoints(as []agg, w, pol string, y func(Result) float64, logY bool) plotter.XYs {
	var pts plotter.XYs
	for _, a := range as {
		if a.workload == w && a.policy == pol && a.load.Kind() == "qps" && (!logY || y(a.m) > 0) {
			pts = append(pts, plotter.XY{X: a.load.QPS, Y: y(a.m)})
		}
	}
	slices.SortFunc(pts, func(a, b plotter.XY) int {
		switch {
		case a.X < b.X:
			return -1
		case a.X > b.X:
			return 1
		}
		return 0
	})
	return pts
}

// writeGrid fills the empty cells with blank panels, aligns the grid and
// writes it to path as PNG.
func writeGrid(plots [][]*plot.Plot, rows, cols int, path string) error {
	for r := range plots {
		for c := range plots[r] {
			if plots[r][c] == nil {
				plots[r][c] = plot.New()
				plots[r][c].HideAxes()
			}
		}
	}
	img := vgimg.New(vg.Points(float64(cols)*260), vg.Points(float64(rows)*200))
	dc := draw.New(img)
	t := draw.Tiles{Rows: rows, Cols: cols, PadX: vg.Points(6), PadY: vg.Points(6)}
	canvases := plot.Align(plots, t, dc)
	for r := range plots {
		for c := range plots[r] {
			plots[r][c].Draw(canvases[r][c])
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("plot: %w", err)
	}
	defer f.Close()
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		return fmt.Errorf("plot %s: %w", path, err)
	}
	return nil
}

// ticks125 labels 1-2-5 steps per decade, so a log axis spanning less than
// a decade still has labels.
type ticks125 struct{}

func (ticks125) Ticks(lo, hi float64) []plot.Tick {
	var out []plot.Tick
	for d := 1e-3; d <= 1e3; d *= 10 {
		for _, m := range []float64{1, 2, 5} {
			if v := d * m; v >= lo && v <= hi {
				out = append(out, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return out
}
