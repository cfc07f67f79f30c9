//go:build extracorpus

package chattemplate

import (
	"os"
	"testing"
	"time"
)

// TestExtraCorpus runs a locally generated corpus (other templates rendered
// by Jinja2 the same way as chat_cases.json) when CHATTEMPLATE_EXTRA_CORPUS
// names it: a JSON list of {name, template_src, content_format, case,
// expected} (chat cases) or {name, template_src, vars, expected} (raw
// renders). It lets third-party templates be checked without committing them,
// so it is built only with -tags extracorpus:
//
//	CHATTEMPLATE_EXTRA_CORPUS=corpus.json go test -tags extracorpus -run TestExtraCorpus ./pkg/chattemplate
func TestExtraCorpus(t *testing.T) {
	path := os.Getenv("CHATTEMPLATE_EXTRA_CORPUS")
	if path == "" {
		t.Fatal("set CHATTEMPLATE_EXTRA_CORPUS to the corpus file (see docs/chat-templates.md)")
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := DecodeJSON(data)
	if err != nil {
		t.Fatal(err)
	}
	compiled := map[string]*Template{}
	for _, item := range v.([]any) {
		e := item.(*Dict)
		name := e.val("name").(string)
		t.Run(name, func(t *testing.T) {
			src := e.val("template_src").(string)
			tmpl, ok := compiled[src]
			if !ok {
				if tmpl, err = Compile(src, WithClock(func() time.Time { return fixedNow })); err != nil {
					if ed, _ := e.val("expected").(*Dict); ed != nil {
						if _, isErr := ed.Get("error"); isErr {
							return
						}
					}
					t.Fatalf("compile: %v", err)
				}
				compiled[src] = tmpl
			}
			var exp expectation
			ed := e.val("expected").(*Dict)
			if r, ok := ed.val("render").(string); ok {
				exp.Render = &r
			}
			if er, ok := ed.val("error").(string); ok {
				exp.Error = &er
			}
			if vars, raw := e.val("vars").(*Dict); raw {
				m := map[string]any{}
				for _, k := range vars.keys {
					m[k] = vars.val(k)
				}
				got, err := tmpl.Render(m)
				checkAgainst(t, got, err, exp)
				return
			}
			if got, want := tmpl.ContentFormat(), e.val("content_format").(string); got != want {
				t.Fatalf("content format %q, vLLM's detection says %q", got, want)
			}
			got, err := tmpl.RenderChat(chatInputFromCase(t, e.val("case").(*Dict)))
			checkAgainst(t, got, err, exp)
		})
	}
}
