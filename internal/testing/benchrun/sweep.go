package benchrun

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/segment"
)

// DefaultSweepBlocks are the block sizes (linear units, 4,096 per ms of
// span) a sweep tries: 100 ms, 250 ms, 1 s (the client's default refill
// interval), 4 s and 10 s (the service's maximum). With the
// time-following cursor a block lasts its span whatever the rate, so each
// client refills 1/span times a second and the fleet writes clients/span
// times a second to etcd: at 800 clients, spans below 100 ms ask for tens
// of thousands of writes per second and the fleet cannot even start on a
// small machine (pass smaller ones with --sweep-blocks to see it).
var DefaultSweepBlocks = []int{100 * segment.PerMs, 250 * segment.PerMs, 1000 * segment.PerMs, 4000 * segment.PerMs, 10_000 * segment.PerMs}

// SweepPoint is one block size's run.
type SweepPoint struct {
	Block  int     `json:"block"`   // FixedBlock, linear units
	SpanMs float64 `json:"span_ms"` // Block / 4,096: how long one block lasts
	Report *Report `json:"report,omitempty"`
	// Error is set when the point could not run (typically: the fleet
	// could not start because the store was overloaded).
	Error string `json:"error,omitempty"`
}

// SweepReport is the outcome of a Sweep.
type SweepReport struct {
	Machine measure.Machine `json:"machine"`
	Started time.Time       `json:"started"`
	Points  []SweepPoint    `json:"points"`
}

// Err is the first point's failure, if any.
func (s *SweepReport) Err() error {
	for _, p := range s.Points {
		if p.Report == nil {
			continue
		}
		if err := p.Report.VerifyErr(); err != nil {
			return errors.Wrapf(err, "sweep block %d", p.Block)
		}
	}
	return nil
}

// Sweep runs the fleet of cfg once per block size (cfg.FixedBlock
// set to each), on one environment, each for cfg.Duration. Every point's
// IDs are verified. Errors of Next calls are reported per point, not
// fatal: tiny blocks are expected to overload the store.
func Sweep(ctx context.Context, cfg Config, blocks []int) (*SweepReport, error) {
	if len(blocks) == 0 {
		blocks = DefaultSweepBlocks
	}
	maxBlock := segment.DefaultMaxBlock // the regions run the default policy
	for _, b := range blocks {
		if b < 1 || int64(b) > maxBlock {
			return nil, errors.Newf("bench: sweep block %d not in 1..%d", b, maxBlock)
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	fmt.Fprintf(cfg.Progress, "bench: sweep over %d block sizes; starting %d region(s) (%s)\n", len(blocks), cfg.Regions, etcdLayout(cfg))
	env, err := StartEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	sr := &SweepReport{Machine: measure.CurrentMachine(), Started: time.Now().UTC()}
	for _, b := range blocks {
		pc := cfg
		pc.FixedBlock = b
		fmt.Fprintf(cfg.Progress, "bench: sweep point block=%d (%s of span)\n", b, spanString(b))
		pt := SweepPoint{Block: b, SpanMs: float64(b) / segment.PerMs}
		rep, err := RunOn(ctx, env, pc)
		if err != nil {
			if ctx.Err() != nil {
				return sr, err
			}
			pt.Error = err.Error()
			fmt.Fprintf(cfg.Progress, "bench: sweep point block=%d failed: %v\n", b, err)
		} else {
			pt.Report = rep
		}
		sr.Points = append(sr.Points, pt)
	}
	return sr, nil
}

func spanString(block int) string {
	return (time.Duration(block) * time.Millisecond / segment.PerMs).String()
}

func (s *SweepReport) first() *Report {
	for _, p := range s.Points {
		if p.Report != nil {
			return p.Report
		}
	}
	return nil
}

// WriteMarkdown writes the sweep as a table, one row per block size.
func (s *SweepReport) WriteMarkdown(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Machine: %s. Sweep started %s.\n\n", s.Machine, s.Started.Format(time.RFC3339))
	if r := s.first(); r != nil {
		f := r.Fleet
		fmt.Fprintf(&b, "Fleet per point: %d region(s) × %d workers, target %s IDs/s, %v each, %s",
			f.Regions, f.Workers, measure.SI(f.TargetRate), time.Duration(f.Duration), f.Etcd)
		if f.CPUHog > 0 {
			fmt.Fprintf(&b, ", CPU hog: %d busy core(s) in a child process", f.CPUHog)
		}
		b.WriteString(".\n\n")
	}
	b.WriteString("| block (units) | span | achieved IDs/s | % of target | p50 / ID | p99 / ID | p99.9 / ID | max / ID | refills | stalls | calls > 1 ms | etcd writes/s | errors | IDs checked | duplicates |\n")
	b.WriteString("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, p := range s.Points {
		r := p.Report
		if r == nil {
			fmt.Fprintf(&b, "| %d | %s | did not run: %s |||||||||||||\n", p.Block, spanString(p.Block), oneLine(p.Error))
			continue
		}
		fmt.Fprintf(&b, "| %d | %s | %s | %.1f%% | %s | %s | %s | %s | %d | %d | %d | %.0f | %d | %s | %d |\n",
			p.Block, spanString(p.Block), measure.SI(r.AchievedRate), 100*r.AchievedRate/r.Fleet.TargetRate,
			measure.Latency(r.Latency.P50), measure.Latency(r.Latency.P99), measure.Latency(r.Latency.P999), measure.Latency(r.Latency.Max),
			r.Refills, r.Stalls, r.SlowCalls, r.EtcdWritesPerSec, r.Errors, measure.SI(float64(r.Verify.Checked)), r.Verify.Duplicates)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSVG draws three stacked panels against block size (log scale):
// achieved throughput, p99.9 latency per ID, and etcd writes per second.
func (s *SweepReport) WriteSVG(w io.Writer) error {
	return s.draw(w, func(width, height vg.Length) vg.CanvasWriterTo { return vgsvg.New(width, height) })
}

// WritePNG draws the same chart as WriteSVG as a PNG.
func (s *SweepReport) WritePNG(w io.Writer) error {
	return s.draw(w, func(width, height vg.Length) vg.CanvasWriterTo {
		return vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(width, height), vgimg.UseDPI(110))}
	})
}

func (s *SweepReport) draw(w io.Writer, newCanvas func(width, height vg.Length) vg.CanvasWriterTo) error {
	var ran []SweepPoint
	for _, p := range s.Points {
		if p.Report != nil {
			ran = append(ran, p)
		}
	}
	if len(ran) == 0 {
		return errors.New("bench: no sweep point ran, nothing to chart")
	}
	type series struct {
		title, ylabel string
		y             func(*Report) float64
	}
	panels := []series{
		{"Achieved throughput", "IDs/s", func(r *Report) float64 { return r.AchievedRate }},
		{"p99.9 latency per ID", "µs", func(r *Report) float64 { return float64(r.Latency.P999) / 1e3 }},
		{"etcd writes", "writes/s", func(r *Report) float64 { return r.EtcdWritesPerSec }},
	}
	var ticks plot.ConstantTicks
	for _, pt := range ran {
		ticks = append(ticks, plot.Tick{Value: float64(pt.Block), Label: spanString(pt.Block)})
	}
	var failed []string
	for _, pt := range s.Points {
		if pt.Report == nil {
			failed = append(failed, spanString(pt.Block))
		}
	}
	plots := make([][]*plot.Plot, len(panels))
	for i, ps := range panels {
		p := plot.New()
		p.Title.Text = ps.title
		p.X.Label.Text = "block span (block size / 4,096 units per ms)"
		if i == 0 && len(failed) > 0 {
			p.Title.Text += " (fleet could not start with spans " + strings.Join(failed, ", ") + ")"
		}
		p.Y.Label.Text = ps.ylabel
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = ticks
		logY := i == 1 // latencies span orders of magnitude
		pts := make(plotter.XYs, len(ran))
		for j, pt := range ran {
			pts[j].X, pts[j].Y = float64(pt.Block), max(ps.y(pt.Report), 0)
			if logY {
				pts[j].Y = max(pts[j].Y, 0.01) // a log axis cannot show 0
			}
		}
		line, scatter, err := plotter.NewLinePoints(pts)
		if err != nil {
			return errors.Wrap(err, "bench: chart")
		}
		p.Add(line, scatter, plotter.NewGrid())
		if logY {
			p.Y.Scale = plot.LogScale{}
			p.Y.Tick.Marker = plot.LogTicks{Prec: -1}
			p.Y.Min /= 2
			p.Y.Max *= 2
		} else {
			p.Y.Min = 0
		}
		if i == 0 {
			target := ran[0].Report.Fleet.TargetRate
			tl, err := plotter.NewLine(plotter.XYs{{X: pts[0].X, Y: target}, {X: pts[len(pts)-1].X, Y: target}})
			if err == nil {
				tl.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
				p.Add(tl)
				p.Legend.Add("target", tl)
				p.Legend.Add("achieved", line)
				p.Legend.Top = false
				p.Legend.Left = true
				p.Y.Max = max(p.Y.Max, target*1.1)
			}
		}
		plots[i] = []*plot.Plot{p}
	}
	c := newCanvas(7*vg.Inch, 9*vg.Inch)
	dc := draw.New(c)
	t := draw.Tiles{Rows: len(panels), Cols: 1, PadX: vg.Millimeter, PadY: 4 * vg.Millimeter,
		PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8)}
	canvases := plot.Align(plots, t, dc)
	for i := range plots {
		plots[i][0].Draw(canvases[i][0])
	}
	_, err := c.WriteTo(w)
	return err
}

// WriteFiles writes sweep.svg, sweep.png, sweep.md and sweep.json into dir (created
// if missing) and returns their paths.
func (s *SweepReport) WriteFiles(dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, errors.Wrapf(err, "bench: output dir %s", dir)
	}
	var paths []string
	for _, f := range []struct {
		name  string
		write func(io.Writer) error
	}{{"sweep.svg", s.WriteSVG}, {"sweep.png", s.WritePNG}, {"sweep.md", s.WriteMarkdown}, {"sweep.json", s.WriteJSON}} {
		p := filepath.Join(dir, f.name)
		fh, err := os.Create(p)
		if err != nil {
			return paths, errors.Wrapf(err, "bench: create %s", p)
		}
		err = f.write(fh)
		if cerr := fh.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return paths, errors.Wrapf(err, "bench: write %s", p)
		}
		paths = append(paths, p)
	}
	return paths, nil
}

// oneLine makes an error message fit a Markdown table cell.
func oneLine(s string) string {
	s = strings.ReplaceAll(s, "|", "/")
	return strings.Join(strings.Fields(s), " ")
}
