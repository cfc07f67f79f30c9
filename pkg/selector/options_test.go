package selector

import (
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"strings"
	"testing"
)

// TestParseKnobs: every spelling pkg/config accepts for the selector's knobs
// (docs/configuration.md), and the errors for the ones it does not.
func TestParseKnobs(t *testing.T) {
	tests := []struct {
		name    string
		parse   func(string) (fmt.Stringer, error)
		in      string
		want    string // String() of the parsed value
		wantErr string // substring of the error
	}{
		{"lb empty is hard", lbMode, "", "hard", ""},
		{"lb hard", lbMode, "hard", "hard", ""},
		{"lb case", lbMode, " Adaptive-Soft ", "adaptive-soft", ""},
		{"lb off", lbMode, "off", "off", ""},
		{"lb soft", lbMode, "soft", "soft", ""},
		{"lb adaptive", lbMode, "adaptive", "adaptive", ""},
		{"lb bounded is not a mode", lbMode, "bounded", "", `load-blend mode "bounded": allowed values: off, hard, soft, adaptive, adaptive-soft, cost`},
		{"relief empty is auto", relief, "", "auto", ""},
		{"relief auto", relief, "AUTO", "auto", ""},
		{"relief yes", relief, "Yes", "on", ""},
		{"relief 1", relief, "1", "on", ""},
		{"relief false", relief, "FALSE", "off", ""},
		{"relief no", relief, "no", "off", ""},
		{"relief sometimes", relief, "sometimes", "", "allowed values: auto, on (1, true, yes), off (0, false, no)"},
		{"score empty is leading", score, "", "leading", ""},
		{"score leading", score, "LEADING", "leading", ""},
		{"score prefix alias", score, " Prefix ", "leading", ""},
		{"score overlap", score, "overlap", "overlap", ""},
		{"score leading-run", score, "leading-run", "", "allowed values: leading (the default; alias prefix), overlap"},
		{"sel rr", sel, "rr", "rr", ""},
		{"sel number", sel, "3", "persist", ""},
		{"sel case", sel, " LC ", "lc", ""},
		{"sel chwbl-wrr alias", sel, "chwbl-wrr", "wrr-hash", ""},
		{"sel wrr-hash", sel, "wrr-hash", "wrr-hash", ""},
		{"sel 10", sel, "10", "wrr-hash", ""},
		{"sel reserved number", sel, "7", "", "allowed values: " + SelAllowed},
		{"sel reserved name", sel, "reserved", "", "allowed values: " + SelAllowed},
		{"sel 11", sel, "11", "", `selector "11"`},
		{"sel negative", sel, "-1", "", `selector "-1"`},
		{"sel unknown", sel, "random", "", `selector "random"`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, err := tc.parse(tc.in)
			if tc.wantErr != "" {
				var pe *ParseError
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !errors.As(err, &pe) {
					t.Fatalf("err = %v, want a *ParseError containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || v.String() != tc.want {
				t.Fatalf("got %v, %v; want %s", v, err, tc.want)
			}
			// String is a spelling Parse accepts, naming the same value.
			back, err := tc.parse(v.String())
			if err != nil || back != v {
				t.Fatalf("round trip of %s: %v, %v", v, back, err)
			}
		})
	}
}

func lbMode(s string) (fmt.Stringer, error) { return ParseLBMode(s) }
func relief(s string) (fmt.Stringer, error) { return ParseRelief(s) }
func score(s string) (fmt.Stringer, error)  { return ParseScoreMode(s) }
func sel(s string) (fmt.Stringer, error)    { return ParseSel(s) }

// TestSelValues: the wire numbers are LoxiLB's, and only fullproxy runs the
// capacity and n2/wrr-hash selectors.
func TestSelValues(t *testing.T) {
	for _, tc := range []struct {
		s         Sel
		wire      int
		valid     bool
		fullProxy bool
	}{
		{SelRR, 0, true, false}, {SelHash, 1, true, false}, {SelPriority, 2, true, false}, {SelPersist, 3, true, false},
		{SelLeastConn, 4, true, false}, {SelN2, 5, true, true}, {SelN3, 6, true, false}, {SelReserved, 7, false, false},
		{SelCHWBL, 8, true, true}, {SelGPUAware, 9, true, true}, {SelWRRHash, 10, true, true},
		{Sel(11), 11, false, false}, {Sel(-1), -1, false, false},
	} {
		if int(tc.s) != tc.wire || tc.s.Valid() != tc.valid || tc.s.NeedsFullProxy() != tc.fullProxy {
			t.Errorf("sel %v: wire %d valid %v fullproxy %v", tc.s, int(tc.s), tc.s.Valid(), tc.s.NeedsFullProxy())
		}
	}
	if got := Sel(42).String(); got != "42" {
		t.Errorf("unnamed sel prints %q", got)
	}
}

// TestNoEnvironmentReader: the selector's variables are parsed once, by
// pkg/config, into the selector's own types. A second reader here drifted
// before (it lacked the LOXILB_KV_UNIFIED_MODE fallback), so the package must
// not read the environment or export a reader of it.
func TestNoEnvironmentReader(t *testing.T) {
	fset := token.NewFileSet()
	entries, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".go") || strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			switch x := n.(type) {
			case *ast.SelectorExpr:
				if id, ok := x.X.(*ast.Ident); ok && id.Name == "os" && (x.Sel.Name == "Getenv" || x.Sel.Name == "LookupEnv" || x.Sel.Name == "Environ") {
					t.Errorf("%s: %s reads the environment: parse it in pkg/config", fset.Position(x.Pos()), name)
				}
			case *ast.FuncDecl:
				if x.Name.IsExported() && strings.Contains(x.Name.Name, "Env") {
					t.Errorf("%s: %s: environment readers belong to pkg/config", fset.Position(x.Pos()), x.Name.Name)
				}
			}
			return true
		})
	}
}

func TestNewRejects(t *testing.T) {
	bad := DefaultOptions()
	bad.MeanLoadFactor = 50
	if _, err := New(poolRule(2, 0), bad, Deps{}); err == nil {
		t.Fatal("bad options accepted")
	}
	for _, r := range []Rule{
		{KVExactMode: 4},
		{KVExactMode: 1},
		{KVExactMode: 3, PD: true},
		{Sel: 11},
		{Endpoints: []Endpoint{{Idx: 256}}},
		{Endpoints: []Endpoint{{Idx: 1}, {Idx: 1}}},
		{Endpoints: []Endpoint{{Idx: 1, Role: 3}}},
		{CacheThreshold: 101},
	} {
		if _, err := New(r, DefaultOptions(), Deps{}); err == nil {
			t.Errorf("rule %+v accepted", r)
		}
	}
	// Nil deps are usable.
	s, err := New(poolRule(2, 0), DefaultOptions(), Deps{})
	if err != nil {
		t.Fatal(err)
	}
	a := s.Begin(kvReq(seq(0, 2)))
	if d := a.Decide(); d.Endpoint != 0 || d.Reason != ReasonNoWorker {
		t.Fatalf("%+v", d)
	}
}

// FuzzParse: whatever a parser accepts prints as a spelling it accepts again.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"hard", "adaptive-soft", "auto", "yes", "prefix", "overlap", "chwbl-wrr", "7", "10", " x "} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		for _, parse := range []func(string) (fmt.Stringer, error){lbMode, relief, score, sel} {
			v, err := parse(in)
			if err != nil {
				continue
			}
			if back, err := parse(v.String()); err != nil || back != v {
				t.Fatalf("%q parsed to %v, which parses back to %v, %v", in, v, back, err)
			}
		}
	})
}
