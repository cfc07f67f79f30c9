package controller

import "math"

// Law is the weight law's damping (docs/controller.md, "Weights").
type Law struct {
	Alpha    float64 // EWMA weight of the new raw value, (0,1]
	DeadBand float64 // changes smaller than this (weight points) are not emitted
	MaxStep  float64 // largest change per epoch, weight points
}

// DefaultLaw is the reference's --ewma-alpha 0.3, --dead-band 5,
// --max-step-pct 20.
var DefaultLaw = Law{Alpha: 0.3, DeadBand: 5, MaxStep: 20}

// source is what the law needs to know about one host in one epoch.
type source struct {
	role  string
	prior float64
	stale bool
}

// damped is one host's law state across epochs.
type damped struct {
	ewma    float64
	emitted float64
	primed  bool
}

// raw is 100 × prior / the largest prior of the same role over fresh
// sources; a stale source's target is 100, so its weight drifts back to
// neutral through the same damping rather than jumping.
func raw(srcs []source) []float64 {
	best := map[string]float64{}
	for _, s := range srcs {
		if !s.stale && s.prior > best[s.role] {
			best[s.role] = s.prior
		}
	}
	out := make([]float64, len(srcs))
	for i, s := range srcs {
		m := best[s.role]
		if s.stale || m <= 0 {
			out[i] = 100
			continue
		}
		out[i] = math.Min(100, 100*s.prior/m)
	}
	return out
}

// step advances one host's state by one epoch toward r and returns the
// weight to emit, 0..100: EWMA, then the dead-band against the last emitted
// weight, then the step clamp.
func (l Law) step(d *damped, r float64) uint32 {
	if !d.primed {
		d.ewma, d.emitted, d.primed = r, r, true
		return clampWeight(r)
	}
	d.ewma = l.Alpha*r + (1-l.Alpha)*d.ewma
	delta := d.ewma - d.emitted
	if math.Abs(delta) < l.DeadBand {
		return clampWeight(d.emitted)
	}
	if l.MaxStep > 0 {
		delta = math.Max(-l.MaxStep, math.Min(l.MaxStep, delta))
	}
	d.emitted += delta
	return clampWeight(d.emitted)
}

func clampWeight(w float64) uint32 {
	if math.IsNaN(w) || w < 0 {
		return 0
	}
	if w > 100 {
		return 100
	}
	return uint32(math.Round(w))
}
