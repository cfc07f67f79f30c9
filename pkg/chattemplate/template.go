// Package chattemplate renders HuggingFace chat templates (the Jinja
// chat_template of tokenizer_config.json) exactly as vLLM does through
// transformers' apply_chat_template: Jinja2's ImmutableSandboxedEnvironment
// with trim_blocks, lstrip_blocks and the loopcontrols extension, the globals
// raise_exception and strftime_now, and transformers' tojson filter.
//
// The package holds its own Jinja lexer, parser and evaluator for the subset
// of Jinja2 that chat templates use, so renders are byte-identical to
// Python's and no cgo, Python or network is needed. Every render is bounded
// in output size, evaluation steps and call depth.
package chattemplate

import (
	"errors"
	"fmt"
	"time"
)

// Default render bounds.
const (
	DefaultMaxOutputBytes = 8 << 20
	// DefaultMaxBuiltBytes bounds the bytes of all strings and lists that
	// expressions build during one render (a value built and dropped in a
	// loop still costs its allocation and copy time).
	DefaultMaxBuiltBytes = 256 << 20
	DefaultMaxSteps      = 2_000_000
	DefaultMaxCallDepth  = 64
	// MaxTemplateBytes bounds the template source accepted by Compile.
	MaxTemplateBytes = 1 << 20
)

// Template is a compiled chat template. It is immutable after Compile and
// safe for concurrent use.
type Template struct {
	body          []node
	cfg           config
	contentFormat string // "string" or "openai", detected as vLLM does
}

// Option configures Compile.
type Option func(*config)

// WithClock sets the clock strftime_now reads (default time.Now, local time
// as in Python's datetime.now()). Tests use it to make renders repeatable.
func WithClock(now func() time.Time) Option { return func(c *config) { c.now = now } }

// WithMaxOutputBytes bounds the rendered text and any intermediate string.
func WithMaxOutputBytes(n int) Option { return func(c *config) { c.maxOutput = n } }

// WithMaxBuiltBytes bounds the total bytes of the strings and lists that
// expressions build during one render.
func WithMaxBuiltBytes(n int) Option { return func(c *config) { c.maxBuilt = n } }

// WithMaxSteps bounds loop iterations, calls and filter applications per render.
func WithMaxSteps(n int) Option { return func(c *config) { c.maxSteps = n } }

// WithContentFormat forces vLLM's --chat-template-content-format ("string"
// or "openai") instead of detecting it from the template.
func WithContentFormat(format string) Option {
	return func(c *config) { c.contentFormat = format }
}

// Compile parses a template once. The result is safe for concurrent Render
// and RenderChat calls.
func Compile(src string, opts ...Option) (*Template, error) {
	cfg := config{
		now:          time.Now,
		maxOutput:    DefaultMaxOutputBytes,
		maxBuilt:     DefaultMaxBuiltBytes,
		maxSteps:     DefaultMaxSteps,
		maxCallDepth: DefaultMaxCallDepth,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if len(src) > MaxTemplateBytes {
		return nil, fmt.Errorf("chattemplate: template is %d bytes, limit %d", len(src), MaxTemplateBytes)
	}
	switch cfg.contentFormat {
	case "", "string", "openai":
	default:
		return nil, fmt.Errorf("chattemplate: unknown content format %q (want string or openai)", cfg.contentFormat)
	}
	toks, err := tokenize(src)
	if err != nil {
		return nil, err
	}
	body, err := parse(toks)
	if err != nil {
		return nil, err
	}
	t := &Template{body: body, cfg: cfg}
	t.cfg.globals = defaultGlobals(&t.cfg)
	t.contentFormat = cfg.contentFormat
	if t.contentFormat == "" {
		t.contentFormat = detectContentFormat(body)
	}
	return t, nil
}

// ContentFormat reports how RenderChat passes message content to the
// template: "string" (text parts joined with "\n") or "openai" (a list of
// {"type": "text", "text": ...} parts), detected from the template as vLLM's
// "auto" mode does.
func (t *Template) ContentFormat() string { return t.contentFormat }

// Render renders the template with the given variables (raw render, no chat
// preprocessing). Values may be Go scalars, slices, maps, *Dict,
// json.Number or json.RawMessage.
func (t *Template) Render(vars map[string]any) (string, error) {
	root := newScope(nil)
	for _, k := range sortedKeys(vars) {
		v, err := toValue(vars[k], 0)
		if err != nil {
			return "", fmt.Errorf("chattemplate: variable %q: %w", k, err)
		}
		root.set(k, v)
	}
	return t.render(root, 4096)
}

func (t *Template) render(root *scope, sizeHint int) (string, error) {
	return t.renderUntil(root, sizeHint, time.Time{})
}

func (t *Template) renderUntil(root *scope, sizeHint int, deadline time.Time) (string, error) {
	out, err := t.appendRender(nil, root, sizeHint, deadline)
	if err != nil {
		return "", err
	}
	o := output{buf: out} // a new array nobody else holds: the string may share it
	return o.String(), nil
}

// appendRender renders after dst's bytes, growing dst by sizeHint first when
// its spare capacity is smaller.
func (t *Template) appendRender(dst []byte, root *scope, sizeHint int, deadline time.Time) ([]byte, error) {
	r := &renderer{cfg: &t.cfg, deadline: deadline}
	out := output{buf: dst}
	out.grow(min(sizeHint, t.cfg.maxOutput))
	if _, err := r.execBody(t.body, root, &out); err != nil {
		var te *TemplateException
		if errors.As(err, &te) {
			return dst, te
		}
		return dst, fmt.Errorf("chattemplate: render: %w", err)
	}
	return out.buf, nil
}
