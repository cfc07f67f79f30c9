package gateway

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/internal/testnet"
	"github.com/kvgate/kvgate/pkg/config"
)

// TestRulesFileAtStart: a rules file is reconciled before New returns; a bad
// one is a start-up error naming the rule and field and leaves the persisted
// table as it was; a restart without the flag makes the file's rules REST
// rules again.
func TestRulesFileAtStart(t *testing.T) {
	block := testnet.Block(t)
	vip := block + "1"
	port := testnet.Port(t, vip)
	good := fmt.Sprintf("rules:\n  - serviceArguments: {service_id: 4, externalIP: %s, port: %d, mode: 4}\n    endpoints:\n      - {endpointIP: %s11, targetPort: 8000, ep_idx: 6}\n", vip, port, block)
	bad := fmt.Sprintf("rules:\n  - serviceArguments: {externalIP: %s, port: %d, mode: 4}\n    endpoints:\n      - {endpointIP: %s11, targetPort: 8000}\n", vip, port+1, block)
	stateDir, dir := t.TempDir(), t.TempDir()
	file := filepath.Join(dir, "rules.yaml")
	open := func(rulesFile string) (*Gateway, error) {
		return New(Options{Settings: config.DefaultSettings(), Datapath: "userspace", StateDir: stateDir, RulesFile: rulesFile, Logger: quietLogger()})
	}
	for _, c := range []struct {
		name, body string
		flag       bool
		wantErr    string
		wantOwner  string
	}{
		{"good file", good, true, "", file},
		{"bad file", bad, true, "rules[0] (" + vip, ""},
		{"no flag", "", false, "", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := ""
			if c.flag {
				path = file
				if err := os.WriteFile(file, []byte(c.body), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			g, err := open(path)
			if c.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), c.wantErr) || !strings.Contains(err.Error(), "endpoints[0].ep_idx: required") {
					if g != nil {
						g.Shutdown()
					}
					t.Fatalf("got %v, want a start-up error naming %q and the field", err, c.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer g.Shutdown()
			r, ok := g.API.RuleByID(4)
			if !ok || r.Owner != c.wantOwner || r.Endpoints[0].Idx != 6 {
				t.Fatalf("rule 4: %+v %v, want owner %q and ep_idx 6", r, ok, c.wantOwner)
			}
		})
	}
}
