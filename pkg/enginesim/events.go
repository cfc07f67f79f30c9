package enginesim

import "time"

// publishStep encodes one engine step's events as one batch and publishes it.
// TEMPORARY: waits for the pkg/kvevents codec.
func (e *Engine) publishStep(evs []poolEvent, now time.Time) {
	if e.pub == nil || len(evs) == 0 {
		return
	}
	_ = now
}
