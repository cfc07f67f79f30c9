package config

import (
	"slices"
	"testing"
)

func keys(eps []Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Key())
	}
	return out
}

func TestDiffSubscribers(t *testing.T) {
	ep := func(ip string, role Role) Endpoint { return Endpoint{IP: ip, TargetPort: 8000, Role: role} }
	pd := func(eps ...Endpoint) *Rule {
		r := &Rule{Args: ServiceArguments{KVExactMode: 1}, Endpoints: eps}
		return r
	}
	old := pd(ep("10.0.0.1", RolePrefill), ep("10.0.0.2", RolePrefill), ep("10.0.0.3", RoleDecode))
	cases := []struct {
		name              string
		old, updated      *Rule
		start, stop, keep []string
	}{
		{"create", nil, old, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, nil, nil},
		{"delete", old, nil, nil, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, nil},
		{"one goes, one comes, a decode turns prefill",
			old, pd(ep("10.0.0.1", RolePrefill), ep("10.0.0.4", RolePrefill), ep("10.0.0.3", RolePrefill)),
			[]string{"10.0.0.4:8000", "10.0.0.3:8000"}, []string{"10.0.0.2:8000"}, []string{"10.0.0.1:8000"}},
		{"admin down keeps", old, func() *Rule { r := old.Clone(); r.Endpoints[0].AdminDown = true; return r }(),
			nil, nil, []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"port change restarts all", old, func() *Rule { r := old.Clone(); r.Args.KVZmqPort = 6000; return r }(),
			[]string{"10.0.0.1:8000", "10.0.0.2:8000"}, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, nil},
		{"5557 spelled out is no change", old, func() *Rule { r := old.Clone(); r.Args.KVZmqPort = 5557; return r }(),
			nil, nil, []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{"kv off stops all", old, func() *Rule { r := old.Clone(); r.Args.KVExactMode = 0; r.Args.PDDisaggMode = true; return r }(),
			nil, []string{"10.0.0.1:8000", "10.0.0.2:8000"}, nil},
	}
	for _, c := range cases {
		d := DiffSubscribers(c.old, c.updated)
		if !slices.Equal(keys(d.Start), c.start) || !slices.Equal(keys(d.Stop), c.stop) || !slices.Equal(keys(d.Keep), c.keep) {
			t.Errorf("%s: start %v stop %v keep %v", c.name, keys(d.Start), keys(d.Stop), keys(d.Keep))
		}
	}
	e := DiffEndpoints(old, pd(ep("10.0.0.1", RolePrefill), ep("10.0.0.9", RoleDecode)))
	if !slices.Equal(keys(e.Added), []string{"10.0.0.9:8000"}) || !slices.Equal(keys(e.Removed), []string{"10.0.0.2:8000", "10.0.0.3:8000"}) || !slices.Equal(keys(e.Kept), []string{"10.0.0.1:8000"}) {
		t.Errorf("DiffEndpoints %+v", e)
	}
}
