package gateway

import (
	"testing"

	"github.com/kvgate/kvgate/pkg/epset"
	"github.com/kvgate/kvgate/pkg/inventory"
	"github.com/kvgate/kvgate/pkg/models"
)

// TestModelViewResolve: a request routes only among the endpoints that
// list its model; endpoints not read yet stay candidates for every model;
// a model nobody lists is not found once every endpoint is known; an
// adapter routes to its endpoints, tokenizes with its parent and keys its
// blocks under the parent's salt.
func TestModelViewResolve(t *testing.T) {
	a := models.Served{Bases: []string{"model-a", "alias-a"}, Adapters: map[string]string{"sql-lora": "model-a"}}
	b := models.Served{Bases: []string{"model-b"}}
	all := epset.Of(0, 1, 2, 3)
	cases := []struct {
		name     string
		served   map[int]models.Served
		model    string
		eligible epset.Set
		notFound bool
		salt     inventory.ModelSalt
		parent   string
		label    string
	}{
		{"nothing discovered: every endpoint", nil, "model-a", all, false, 0, "", labelUnlisted},
		{"base model", map[int]models.Served{0: a, 1: a, 2: b, 3: b}, "model-a", epset.Of(0, 1), false, inventory.SaltFor("model-a"), "", "model-a"},
		{"alias keys as the first name", map[int]models.Served{0: a, 1: a, 2: b, 3: b}, "alias-a", epset.Of(0, 1), false, inventory.SaltFor("model-a"), "", "alias-a"},
		{"other base model", map[int]models.Served{0: a, 1: a, 2: b, 3: b}, "model-b", epset.Of(2, 3), false, inventory.SaltFor("model-b"), "", "model-b"},
		{"adapter", map[int]models.Served{0: a, 1: b, 2: b, 3: b}, "sql-lora", epset.Of(0), false, inventory.SaltFor("model-a"), "model-a", "sql-lora"},
		{"unknown model, all known", map[int]models.Served{0: a, 1: a, 2: b, 3: b}, "gpt-x", epset.Set{}, true, 0, "", labelUnlisted},
		{"unknown model, one endpoint unread", map[int]models.Served{0: a, 1: a, 2: b}, "gpt-x", epset.Of(3), false, 0, "", labelUnlisted},
		{"known model plus an unread endpoint", map[int]models.Served{0: a, 1: a, 2: b}, "model-b", epset.Of(2, 3), false, inventory.SaltFor("model-b"), "", "model-b"},
		{"endpoints outside the rule do not count", map[int]models.Served{0: a, 1: a, 2: b, 3: b, 9: {Bases: []string{"gone"}}}, "gone", epset.Set{}, true, inventory.SaltFor("gone"), "", "gone"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var v *modelView
			if c.served != nil {
				v = buildView(c.served)
			}
			r := v.resolve(c.model, all)
			if r.eligible != c.eligible || r.notFound != c.notFound || r.salt != c.salt || r.parent != c.parent || r.label != c.label {
				t.Fatalf("resolve(%q) = %+v; want eligible %v notFound %v salt %x parent %q label %q",
					c.model, r, c.eligible, c.notFound, c.salt, c.parent, c.label)
			}
			if r.restrict != (r.eligible != all) {
				t.Fatalf("restrict %v with eligible %v of %v", r.restrict, r.eligible, all)
			}
		})
	}
}

// TestModelViewBounds: endpoint keys follow their base model, and the
// model label takes at most maxModelLabels values per rule.
func TestModelViewBounds(t *testing.T) {
	served := map[int]models.Served{}
	for ep := range 100 {
		served[ep] = models.Served{Bases: []string{"m" + string(rune('A'+ep/26)) + string(rune('a'+ep%26))}}
	}
	v := buildView(served)
	labels := map[string]bool{}
	for _, e := range v.byModel {
		labels[e.label] = true
	}
	if len(labels) != maxModelLabels+1 || !labels[labelOther] {
		t.Fatalf("%d distinct labels (other: %v), want %d plus %q", len(labels), labels[labelOther], maxModelLabels, labelOther)
	}
	if v.endpointSalt(5) != inventory.SaltFor(served[5].Base()) || v.endpointSalt(200) != 0 || (*modelView)(nil).endpointSalt(1) != 0 {
		t.Fatal("endpoint salts must be their base model's, 0 for unknown endpoints")
	}
	if got := metricLabel("a b\"c}" + string(make([]byte, 200))); len(got) != 128 || got[:6] != "a_b_c_" {
		t.Fatalf("metricLabel kept %q", got[:8])
	}
}
