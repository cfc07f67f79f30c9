package gateway

import (
	"fmt"

	"github.com/kvgate/kvgate/pkg/rulesfile"
)

// openRulesFile reconciles the table with --rules-file once, before the
// daemon serves (a file kvgate cannot take is a start-up error naming the
// rule and field; the persisted table is untouched), and keeps the watcher
// for Run. Without a rules file, rules a file owned in an earlier run become
// REST rules again: nothing would reconcile them (docs/replicas.md).
func (g *Gateway) openRulesFile() error {
	if g.opts.RulesFile == "" {
		n, err := g.API.ReleaseOwned()
		if n > 0 {
			g.log.Warn("rules owned by a rules file in an earlier run are REST rules now (no --rules-file)", "rules", n)
		}
		return err
	}
	w, err := rulesfile.New(rulesfile.Options{
		Path: g.opts.RulesFile, Interval: g.opts.RulesFileInterval, Settings: g.opts.Settings,
		Apply: g.API, Observer: g.Metrics, Log: g.log,
	})
	if err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	if err := w.Reload(); err != nil {
		return fmt.Errorf("gateway: %w", err)
	}
	g.rulesFile = w
	return nil
}
