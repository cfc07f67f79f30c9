package api

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvgate/kvgate/pkg/config"
)

const fileSource = "/etc/kvgate/rules.yaml"

// fileRule builds a file rule on 10.0.0.1:port with endpoints 10.0.0.1x:8000
// at the given ep_idx values (index i of idx is endpoint 10.0.0.(11+i)).
func fileRule(port, serviceID int, idx ...int) FileRule {
	r := &config.Rule{ServiceID: serviceID, Args: config.ServiceArguments{ExternalIP: "10.0.0.1", Port: port, Protocol: "tcp", Mode: 4}}
	for i, x := range idx {
		r.Endpoints = append(r.Endpoints, config.Endpoint{Idx: x, IP: "10.0.0." + itoa(11+i), TargetPort: 8000})
	}
	return FileRule{Rule: r, Where: "rules[?]", ServiceIDGiven: serviceID != 0}
}

func itoa(i int) string { b, _ := json.Marshal(i); return string(b) }

func restRule(port int) string {
	return `{"serviceArguments":{"externalIP":"10.0.0.1","port":` + itoa(port) + `,"protocol":"tcp","mode":4},"endpoints":[{"endpointIP":"10.0.0.21","targetPort":8000}]}`
}

func rulePath(port int) string {
	return lbPath + "/externalipaddress/10.0.0.1/port/" + itoa(port) + "/protocol/tcp"
}

// TestFileRulesAnswerRESTWith409: every REST change to a file rule is
// refused with 409 in the API's error shape, naming the file; REST rules the
// file does not name stay changeable.
func TestFileRulesAnswerRESTWith409(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	if code, body := f.do(t, "POST", lbPath, restRule(9000)); code != 200 {
		t.Fatalf("REST create: %d %s", code, body)
	}
	res, err := f.srv.ReconcileFile(fileSource, []FileRule{fileRule(8000, 7, 3, 0)})
	if err != nil || res.Created != 1 {
		t.Fatalf("reconcile: %+v %v", res, err)
	}
	cases := []struct{ method, path, body string }{
		{"POST", lbPath, `{"serviceArguments":{"externalIP":"10.0.0.1","port":8000,"protocol":"tcp","mode":4},"endpoints":[]}`},
		{"PATCH", rulePath(8000), `{"serviceArguments":{"name":"x"}}`},
		{"DELETE", rulePath(8000), ""},
		{"PUT", rulePath(8000) + "/endpoint", `{"endpointIP":"10.0.0.11","targetPort":8000,"admin":"down"}`},
		{"DELETE", lbPath + "/all", ""},
	}
	for _, c := range cases {
		code, body := f.do(t, c.method, c.path, c.body)
		var e errorBody
		if code != http.StatusConflict || json.Unmarshal([]byte(body), &e) != nil || e.Code != 409 || !strings.Contains(e.Message, fileSource) {
			t.Errorf("%s %s: %d %s, want 409 naming %s", c.method, c.path, code, body, fileSource)
		}
	}
	// DELETE all refused before anything went: the REST rule is still there.
	if _, ok := f.srv.ruleByKey(config.RuleKey{ExternalIP: "10.0.0.1", Port: 9000, Protocol: "tcp"}); !ok {
		t.Fatal("DELETE all removed a REST rule before refusing")
	}
	if code, body := f.do(t, "DELETE", rulePath(9000), ""); code != 200 {
		t.Fatalf("REST delete of a REST rule: %d %s", code, body)
	}
	r, _ := f.srv.RuleByID(7)
	if r == nil || r.Owner != fileSource || r.Endpoints[0].Idx != 3 || r.Endpoints[1].Idx != 0 || r.NextIdx != 4 {
		t.Fatalf("file rule after REST attempts: %+v", r)
	}
}

// TestReconcileFileTable: the table follows the file rule by rule; the file
// wins over a REST rule with the same key; REST rules it does not name stay.
func TestReconcileFileTable(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	if code, body := f.do(t, "POST", lbPath, restRule(9000)); code != 200 { // service_id 1
		t.Fatalf("REST create: %d %s", code, body)
	}
	if code, body := f.do(t, "POST", lbPath, restRule(8001)); code != 200 { // service_id 2, taken over below
		t.Fatalf("REST create: %d %s", code, body)
	}
	steps := []struct {
		name  string
		rules []FileRule
		want  ReconcileResult
		check func(t *testing.T)
	}{
		{"create and take over", []FileRule{fileRule(8000, 7, 0, 1), fileRule(8001, 0, 4)}, ReconcileResult{Checked: true, Created: 1, Updated: 1},
			func(t *testing.T) {
				r, _ := f.srv.RuleByID(2)
				if r == nil || r.Owner != fileSource || r.Args.Port != 8001 || r.Endpoints[0].Idx != 4 {
					t.Fatalf("taken-over rule: %+v", r)
				}
			}},
		{"same file", []FileRule{fileRule(8000, 7, 0, 1), fileRule(8001, 0, 4)}, ReconcileResult{Checked: true, Unchanged: 2}, nil},
		{"endpoint added", []FileRule{fileRule(8000, 7, 0, 1, 2), fileRule(8001, 0, 4)}, ReconcileResult{Checked: true, Updated: 1, Unchanged: 1},
			func(t *testing.T) {
				if ch := f.sink.last(); ch[0] == nil || ch[1] == nil || len(ch[1].Endpoints) != 3 {
					t.Fatalf("sink not told an update: %+v", ch)
				}
			}},
		{"renumbered is recreated", []FileRule{fileRule(8000, 7, 1, 0, 2), fileRule(8001, 0, 4)}, ReconcileResult{Checked: true, Updated: 1, Unchanged: 1},
			func(t *testing.T) {
				r, _ := f.srv.RuleByID(7)
				if r.Endpoints[0].Idx != 1 || r.NextIdx != 3 {
					t.Fatalf("renumbered rule: %+v", r)
				}
			}},
		{"rule dropped from the file", []FileRule{fileRule(8000, 7, 1, 0, 2)}, ReconcileResult{Checked: true, Deleted: 1, Unchanged: 1},
			func(t *testing.T) {
				if _, ok := f.srv.RuleByID(2); ok {
					t.Fatal("a rule the file dropped is still there")
				}
				if r, ok := f.srv.RuleByID(1); !ok || r.Owner != "" {
					t.Fatalf("the REST rule the file never named: %+v", r)
				}
			}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			res, err := f.srv.ReconcileFile(fileSource, s.rules)
			if err != nil || res != s.want {
				t.Fatalf("got %+v %v, want %+v", res, err, s.want)
			}
			if s.check != nil {
				s.check(t)
			}
		})
	}
}

// TestReconcileFileRefusedKeepsState: a file that clashes with the table
// changes nothing, and the error names the rule and field; a change the
// daemon refuses keeps the old rule.
func TestReconcileFileRefusedKeepsState(t *testing.T) {
	f := newFixture(t, t.TempDir(), nil)
	if code, body := f.do(t, "POST", lbPath, restRule(9000)); code != 200 { // service_id 1
		t.Fatalf("REST create: %d %s", code, body)
	}
	if _, err := f.srv.ReconcileFile(fileSource, []FileRule{fileRule(8000, 7, 0)}); err != nil {
		t.Fatal(err)
	}
	before := f.srv.Rules()
	res, err := f.srv.ReconcileFile(fileSource, []FileRule{fileRule(8002, 0, 0), fileRule(8003, 1, 0)})
	if err == nil || res.Checked || !strings.Contains(err.Error(), "serviceArguments.service_id: 1 is used by a rule the file does not name") {
		t.Fatalf("service_id clash: %+v %v", res, err)
	}
	if after := f.srv.Rules(); len(after) != len(before) || after[1].Args.Port != 8000 {
		t.Fatalf("a refused file changed the table: %+v", after)
	}
	f.sink.mu.Lock()
	f.sink.fail = &config.ConflictError{Msg: "port in use"}
	f.sink.mu.Unlock()
	res, err = f.srv.ReconcileFile(fileSource, []FileRule{fileRule(8000, 8, 0)}) // a new service_id: delete + create
	if err == nil || !res.Checked || !strings.Contains(err.Error(), "port in use") {
		t.Fatalf("refused recreate: %+v %v", res, err)
	}
	if r, ok := f.srv.RuleByID(7); !ok || r.Owner != fileSource {
		t.Fatalf("the old rule was lost when its recreate failed: %+v", r)
	}
}

// TestReleaseOwned: without a rules file, owned rules become REST rules.
func TestReleaseOwned(t *testing.T) {
	dir := t.TempDir()
	f := newFixture(t, dir, nil)
	if _, err := f.srv.ReconcileFile(fileSource, []FileRule{fileRule(8000, 7, 0)}); err != nil {
		t.Fatal(err)
	}
	g := newFixture(t, dir, nil) // a restart: ownership persisted
	if code, _ := g.do(t, "DELETE", rulePath(8000), ""); code != http.StatusConflict {
		t.Fatalf("restored file rule: DELETE %d, want 409", code)
	}
	if n, err := g.srv.ReleaseOwned(); n != 1 || err != nil {
		t.Fatalf("released %d %v", n, err)
	}
	if code, body := g.do(t, "DELETE", rulePath(8000), ""); code != 200 {
		t.Fatalf("released rule: DELETE %d %s", code, body)
	}
}
