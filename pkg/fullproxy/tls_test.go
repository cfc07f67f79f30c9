package fullproxy

import (
	"reflect"
	"testing"
)

// TestForwardedProto: a TLS client's request carries exactly one
// X-Forwarded-Proto: https, replacing the client's own and any value a
// handler set (the P/D legs pass set), and the caller's map and slice are
// left as they were.
func TestForwardedProto(t *testing.T) {
	cases := []struct {
		name     string
		drop     map[string]bool
		set      []HeaderField
		wantDrop map[string]bool
		wantSet  []HeaderField
	}{
		{"nothing set", nil, nil, map[string]bool{"x-forwarded-proto": true}, []HeaderField{{Name: "X-Forwarded-Proto", Value: "https"}}},
		{"handler headers kept", map[string]bool{"accept-encoding": true}, []HeaderField{{Name: "X-Request-Id", Value: "r1"}},
			map[string]bool{"accept-encoding": true, "x-forwarded-proto": true},
			[]HeaderField{{Name: "X-Request-Id", Value: "r1"}, {Name: "X-Forwarded-Proto", Value: "https"}}},
		{"an earlier value replaced", nil, []HeaderField{{Name: "x-forwarded-proto", Value: "http"}},
			map[string]bool{"x-forwarded-proto": true}, []HeaderField{{Name: "X-Forwarded-Proto", Value: "https"}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var before []HeaderField
			before = append(before, c.set...)
			drop, set := forwardedProto(c.drop, c.set)
			if !reflect.DeepEqual(drop, c.wantDrop) || !reflect.DeepEqual(set, c.wantSet) {
				t.Fatalf("got %v %v, want %v %v", drop, set, c.wantDrop, c.wantSet)
			}
			if c.drop != nil && c.drop["x-forwarded-proto"] {
				t.Fatal("the caller's drop map was changed")
			}
			if !reflect.DeepEqual(c.set, before) {
				t.Fatal("the caller's set slice was changed")
			}
		})
	}
}
