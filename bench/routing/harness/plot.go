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
var palette = []color.Color{
	color.RGBA{0xd6, 0x27, 0x28, 0xff}, color.RGBA{0xff, 0x7f, 0x0e, 0xff}, color.RGBA{0xbc, 0xbd, 0x22, 0xff},
	color.RGBA{0x8c, 0x56, 0x4b, 0xff}, color.RGBA{0xe3, 0x77, 0xc2, 0xff}, color.RGBA{0x1f, 0x77, 0xb4, 0xff},
	color.RGBA{0x17, 0xbe, 0xcf, 0xff}, color.RGBA{0x2c, 0xa0, 0x2c, 0xff}, color.RGBA{0x94, 0x67, 0xbd, 0xff},
	color.RGBA{0x7f, 0x7f, 0x7f, 0xff}, color.RGBA{0x00, 0x00, 0x00, 0xff},
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
	var wls []string
	for _, w := range Workloads {
		n := 0
		var seen []float64
		for _, a := range as {
			if a.workload == w && a.load.Kind() == "qps" && !slices.Contains(seen, a.load.QPS) {
				seen = append(seen, a.load.QPS)
				n++
			}
		}
		if n >= 2 {
			wls = append(wls, w)
		}
	}
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
		for k, pol := range Policies {
			var pts plotter.XYs
			for _, a := range as {
				if a.workload == w && a.policy == pol && a.load.Kind() == "qps" && (!logY || y(a.m) > 0) {
					pts = append(pts, plotter.XY{X: a.load.QPS, Y: y(a.m)})
				}
			}
			if len(pts) < 2 {
				continue
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
			l, err := plotter.NewLine(pts)
			if err != nil {
				return fmt.Errorf("plot %s: %w", w, err)
			}
			l.Color = palette[k%len(palette)]
			l.Width = vg.Points(1.2)
			if k >= 5 {
				l.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			p.Add(l)
			if i == 0 {
				p.Legend.Add(pol, l)
			}
		}
		plots[i/cols][i%cols] = p
	}
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
