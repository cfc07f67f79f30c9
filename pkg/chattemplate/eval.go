package chattemplate

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// TemplateException is returned when a template calls raise_exception(msg),
// the way chat templates reject unsupported conversations (for example a
// system message in the wrong place). vLLM turns it into a 400 response.
type TemplateException struct{ Message string }

func (e *TemplateException) Error() string { return "chattemplate: template raised: " + e.Message }

// ErrLimit reports that a render exceeded a resource bound (output size,
// evaluation steps, call depth).
var ErrLimit = errors.New("chattemplate: render limit exceeded")

// scope is one level of Jinja variable bindings. Scopes hold few names, so
// a slice with linear search is cheaper than a map.
type scope struct {
	names  []string
	vals   []any
	parent *scope
	// inline storage for the first few names avoids two allocations per
	// scope (one scope per loop iteration).
	inlineNames [4]string
	inlineVals  [4]any
}

func newScope(parent *scope) *scope {
	s := &scope{parent: parent}
	s.names, s.vals = s.inlineNames[:0], s.inlineVals[:0]
	return s
}

func (s *scope) set(name string, v any) {
	for i, n := range s.names {
		if n == name {
			s.vals[i] = v
			return
		}
	}
	s.names = append(s.names, name)
	s.vals = append(s.vals, v)
}

func (s *scope) lookup(name string) (any, bool) {
	for c := s; c != nil; c = c.parent {
		for i, n := range c.names {
			if n == name {
				return c.vals[i], true
			}
		}
	}
	return nil, false
}

type flow int

const (
	flowNormal flow = iota
	flowBreak
	flowContinue
)

type renderer struct {
	cfg     *config
	folding bool // evaluating a constant {{ }} the way Jinja2's as_const does
	written int  // bytes written to all buffers, bounded by cfg.maxOutput
	steps   int  // loop iterations, calls and filter applications
	depth   int  // macro / recursive-loop call depth
	// built is the bytes of every string and list built by expressions so
	// far, bounded by cfg.maxBuilt: one value is bounded by maxOutput, and
	// this bounds the render's total allocation (a loop rebuilding a large
	// value each step), so its time too.
	built int
	// deadline, when set, is checked every deadlineEvery steps.
	deadline time.Time
}

const deadlineEvery = 1024

func (r *renderer) step() error {
	r.steps++
	if r.steps > r.cfg.maxSteps {
		return fmt.Errorf("%w: more than %d evaluation steps", ErrLimit, r.cfg.maxSteps)
	}
	if r.steps%deadlineEvery == 0 && !r.deadline.IsZero() && time.Now().After(r.deadline) {
		return fmt.Errorf("%w: render time budget spent", ErrLimit)
	}
	return nil
}

func (r *renderer) write(b *output, s string) error {
	r.written += len(s)
	if r.written > r.cfg.maxOutput {
		return fmt.Errorf("%w: output larger than %d bytes", ErrLimit, r.cfg.maxOutput)
	}
	b.WriteString(s)
	return nil
}

// checkSize bounds an intermediate string or list built by an expression:
// n is its size in bytes (for a list, valueBytes), at most maxOutput.
// Builders call it as they grow, so it does not charge maxBuilt (build does).
func (r *renderer) checkSize(n int) error {
	if n > r.cfg.maxOutput {
		return fmt.Errorf("%w: value larger than %d bytes", ErrLimit, r.cfg.maxOutput)
	}
	return nil
}

// writeValue writes v's Python str(). A container is sized first: one built
// from shared parts ([a, a] nested n deep) is small in memory but its text
// is exponential, and must fail before the text is built.
func (r *renderer) writeValue(b *output, v any) error {
	if err := r.checkValue(v); err != nil {
		return err
	}
	return r.write(b, pyStr(v))
}

// checkValue bounds a container about to be turned into text.
func (r *renderer) checkValue(v any) error {
	switch v.(type) {
	case []any, tuple, *Dict:
		return r.checkSize(valueBytes(v, r.cfg.maxOutput+1))
	}
	return nil
}

// build is checkSize for a value built in one go (a concatenation, a
// repetition, a replace), and charges its n bytes to the render's maxBuilt.
func (r *renderer) build(n int) error {
	if err := r.checkSize(n); err != nil {
		return err
	}
	r.built += n
	if r.built > r.cfg.maxBuilt {
		return fmt.Errorf("%w: expressions built more than %d bytes", ErrLimit, r.cfg.maxBuilt)
	}
	return nil
}

// itemBytes is what one list element or dict entry costs beyond its
// contents (an interface value, as Go holds it).
const itemBytes = 16

// valueBytes is the size of v in bytes as checkSize counts it: strings by
// length, containers by their items and contents (shared contents counted
// each time they appear, as rendering or serializing them would). It stops
// counting past limit, so its cost is bounded by limit/itemBytes visits.
func valueBytes(v any, limit int) int {
	n := 0
	var walk func(v any)
	walk = func(v any) {
		n += itemBytes
		if n > limit {
			return
		}
		switch x := v.(type) {
		case string:
			n += len(x)
		case []any:
			for _, e := range x {
				if walk(e); n > limit {
					return
				}
			}
		case tuple:
			for _, e := range x {
				if walk(e); n > limit {
					return
				}
			}
		case *Dict:
			for i, k := range x.keys {
				n += len(k)
				if walk(x.vals[i]); n > limit {
					return
				}
			}
		}
	}
	walk(v)
	return n
}

// seqBytes is valueBytes of a list's or tuple's items, without the
// container's own header.
func (r *renderer) seqBytes(items []any) int {
	return max(valueBytes(items, r.cfg.maxOutput+1)-itemBytes, 0)
}

func (r *renderer) execBody(nodes []node, sc *scope, out *output) (flow, error) {
	for _, n := range nodes {
		f, err := r.exec(n, sc, out)
		if err != nil || f != flowNormal {
			return f, err
		}
	}
	return flowNormal, nil
}

func (r *renderer) exec(n node, sc *scope, out *output) (flow, error) {
	switch n := n.(type) {
	case *textNode:
		return flowNormal, r.write(out, n.text)
	case *outputNode:
		return r.execOutput(n, sc, out)
	case *ifNode:
		return r.execIf(n, sc, out)
	case *forNode:
		iter, err := r.eval(n.iter, sc)
		if err != nil {
			return flowNormal, err
		}
		return flowNormal, r.runLoop(n, iter, sc, out, 0)
	case *setNode:
		v, err := r.eval(n.value, sc)
		if err != nil {
			return flowNormal, err
		}
		return flowNormal, r.assign(n.target, v, sc)
	case *setBlockNode:
		return r.execSetBlock(n, sc, out)
	case *macroNode:
		sc.set(n.name, &macroValue{node: n, closure: sc, name: n.name, params: n.params, defaults: n.defaults, body: n.body})
		return flowNormal, nil
	case *callBlockNode:
		caller := &macroValue{node: nil, closure: sc, name: "caller", params: n.params, defaults: n.defaults, body: n.body}
		v, err := r.evalCall(n.call, sc, caller)
		if err != nil {
			return flowNormal, err
		}
		return flowNormal, r.writeValue(out, v)
	case *filterBlockNode:
		return r.execFilterBlock(n, sc, out)
	case *withNode:
		return r.execWith(n, sc, out)
	case *breakNode:
		return flowBreak, nil
	case *continueNode:
		return flowContinue, nil
	}
	return flowNormal, fmt.Errorf("chattemplate: internal error: unknown node %T", n)
}

// execOutput writes the value of a {{ … }} tag.
func (r *renderer) execOutput(n *outputNode, sc *scope, out *output) (flow, error) {
	if n.constant {
		// Jinja2 folds a fully constant {{ }} at compile time through
		// as_const, where slicing a non-sequence yields Undefined.
		r.folding = true
		defer func() { r.folding = false }()
	}
	if e, ok := n.expr.(*binExpr); ok && !n.constant && e.op == "+" {
		if _, chain := e.l.(*binExpr); chain {
			return flowNormal, r.writePlusChain(e, sc, out)
		}
	}
	v, err := r.eval(n.expr, sc)
	if err != nil {
		return flowNormal, err
	}
	if u, ok := v.(undefined); ok && u.unsafe {
		return flowNormal, nil
	}
	return flowNormal, r.writeValue(out, v)
}

// execIf runs the body of the first true condition, else the else body.
func (r *renderer) execIf(n *ifNode, sc *scope, out *output) (flow, error) {
	for i, c := range n.conds {
		v, err := r.eval(c, sc)
		if err != nil {
			return flowNormal, err
		}
		if isTruthy(v) {
			return r.execBody(n.bodies[i], sc, out)
		}
	}
	return r.execBody(n.orElse, sc, out)
}

// execSetBlock assigns the rendered body, through its filter if any.
func (r *renderer) execSetBlock(n *setBlockNode, sc *scope, out *output) (flow, error) {
	var buf output
	if _, err := r.execBody(n.body, sc, &buf); err != nil {
		return flowNormal, err
	}
	var v any = buf.String()
	if n.filter != nil {
		var err error
		if v, err = r.applyFilterChain(n.filter, v, sc); err != nil {
			return flowNormal, err
		}
	}
	return flowNormal, r.assign(n.target, v, sc)
}

// execFilterBlock writes the rendered body through its filter chain.
func (r *renderer) execFilterBlock(n *filterBlockNode, sc *scope, out *output) (flow, error) {
	var buf output
	if _, err := r.execBody(n.body, sc, &buf); err != nil {
		return flowNormal, err
	}
	v, err := r.applyFilterChain(n.filter, buf.String(), sc)
	if err != nil {
		return flowNormal, err
	}
	return flowNormal, r.writeValue(out, v)
}

// execWith runs the body in a scope holding the with targets.
func (r *renderer) execWith(n *withNode, sc *scope, out *output) (flow, error) {
	inner := newScope(sc)
	for i, t := range n.targets {
		v, err := r.eval(n.values[i], sc)
		if err != nil {
			return flowNormal, err
		}
		if err := r.assign(t, v, inner); err != nil {
			return flowNormal, err
		}
	}
	return r.execBody(n.body, inner, out)
}

// applyFilterChain applies a filter chain whose innermost node is nil to v.
func (r *renderer) applyFilterChain(e expr, v any, sc *scope) (any, error) {
	f := e.(*filterExpr)
	if f.node != nil {
		inner, err := r.applyFilterChain(f.node, v, sc)
		if err != nil {
			return nil, err
		}
		v = inner
	}
	return r.applyFilter(f, v, sc)
}

func (r *renderer) assign(t target, v any, sc *scope) error {
	switch {
	case t.attr != "":
		obj, ok := sc.lookup(t.name)
		ns, isNS := obj.(*namespace)
		if !ok || !isNS {
			return errors.New("cannot assign attribute on non-namespace object")
		}
		ns.attrs.Set(t.attr, v)
		return nil
	case t.items != nil:
		items, err := iterate(v)
		if err != nil {
			return err
		}
		if len(items) != len(t.items) {
			return fmt.Errorf("cannot unpack %d values into %d names", len(items), len(t.items))
		}
		for i, it := range t.items {
			if err := r.assign(it, items[i], sc); err != nil {
				return err
			}
		}
		return nil
	}
	sc.set(t.name, v)
	return nil
}

// loopObject is Jinja's `loop` variable.
type loopObject struct {
	items   []any
	index0  int
	depth0  int
	node    *forNode
	outer   *scope
	r       *renderer
	lastVal any
	hasLast bool
}

func (r *renderer) runLoop(n *forNode, iterable any, sc *scope, out *output, depth0 int) error {
	items, err := iterate(iterable)
	if err != nil {
		return err
	}
	if n.cond != nil {
		kept := make([]any, 0, len(items))
		for _, it := range items {
			if err := r.step(); err != nil {
				return err
			}
			fs := newScope(sc)
			if err := r.assign(n.target, it, fs); err != nil {
				return err
			}
			c, err := r.eval(n.cond, fs)
			if err != nil {
				return err
			}
			if isTruthy(c) {
				kept = append(kept, it)
			}
		}
		items = kept
	}
	if len(items) == 0 {
		_, err := r.execBody(n.orElse, sc, out)
		return err
	}
	loop := &loopObject{items: items, depth0: depth0, node: n, outer: sc, r: r}
	for i, it := range items {
		if err := r.step(); err != nil {
			return err
		}
		loop.index0 = i
		is := newScope(sc)
		is.set("loop", loop)
		if err := r.assign(n.target, it, is); err != nil {
			return err
		}
		f, err := r.execBody(n.body, is, out)
		if err != nil {
			return err
		}
		if f == flowBreak {
			break
		}
	}
	return nil
}

// macroValue is a macro or the caller of a {% call %} block.
type macroValue struct {
	node     *macroNode
	closure  *scope
	name     string
	params   []string
	defaults []expr
	body     []node
}

func (r *renderer) callMacro(m *macroValue, args []any, kw *Dict, caller *macroValue) (any, error) {
	r.depth++
	defer func() { r.depth-- }()
	if r.depth > r.cfg.maxCallDepth {
		return nil, fmt.Errorf("%w: call depth above %d", ErrLimit, r.cfg.maxCallDepth)
	}
	sc := newScope(m.closure)
	var varargs []any
	if len(args) > len(m.params) {
		if m.node != nil && !m.node.catchVarargs {
			return nil, fmt.Errorf("macro '%s' takes not more than %d argument(s)", m.name, len(m.params))
		}
		varargs = append(varargs, args[len(m.params):]...)
		args = args[:len(m.params)]
	}
	extra, caller, err := macroKwargs(m, kw, caller)
	if err != nil {
		return nil, err
	}
	if err := r.bindParams(m, sc, args, kw); err != nil {
		return nil, err
	}
	sc.set("varargs", tuple(varargs))
	sc.set("kwargs", extra)
	if caller != nil {
		sc.set("caller", caller)
	}
	var buf output
	if _, err := r.execBody(m.body, sc, &buf); err != nil {
		return nil, err
	}
	return buf.String(), nil
}

// macroKwargs sorts the keyword arguments of a call of m: a caller= macro
// becomes the caller (unless a call block gave one), keywords that name no
// parameter go to kwargs (an error unless m reads kwargs), and the rest bind
// to parameters in bindParams.
func macroKwargs(m *macroValue, kw *Dict, caller *macroValue) (*Dict, *macroValue, error) {
	extra := NewDict()
	if kw == nil {
		return extra, caller, nil
	}
	for _, k := range kw.keys {
		found := slices.Contains(m.params, k)
		if k == "caller" && caller == nil {
			if c, ok := kw.val(k).(*macroValue); ok {
				caller = c
				continue
			}
		}
		if found {
			continue
		}
		if m.node != nil && !m.node.catchKwargs {
			return nil, nil, fmt.Errorf("macro '%s' takes no keyword argument '%s'", m.name, k)
		}
		extra.Set(k, kw.val(k))
	}
	return extra, caller, nil
}

// bindParams sets each parameter of m in sc: from its positional argument,
// its keyword, its default (evaluated in sc, so it sees earlier parameters)
// or an undefined naming it.
func (r *renderer) bindParams(m *macroValue, sc *scope, args []any, kw *Dict) error {
	firstDefault := len(m.params) - len(m.defaults)
	for i, p := range m.params {
		switch {
		case i < len(args):
			if kw != nil {
				if _, dup := kw.Get(p); dup {
					return fmt.Errorf("macro '%s' got multiple values for argument '%s'", m.name, p)
				}
			}
			sc.set(p, args[i])
		case kw != nil && hasKey(kw, p):
			sc.set(p, kw.val(p))
		case i >= firstDefault:
			v, err := r.eval(m.defaults[i-firstDefault], sc)
			if err != nil {
				return err
			}
			sc.set(p, v)
		default:
			sc.set(p, undefined{format: "parameter '%s' was not provided", a: p})
		}
	}
	return nil
}

func hasKey(d *Dict, k string) bool { _, ok := d.Get(k); return ok }

// ---- expressions ----

// evalItems evaluates the items of a list or tuple literal in order.
func (r *renderer) evalItems(items []expr, sc *scope) ([]any, error) {
	out := make([]any, len(items))
	for i, it := range items {
		v, err := r.eval(it, sc)
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

func (r *renderer) eval(e expr, sc *scope) (any, error) {
	switch e := e.(type) {
	case *constExpr:
		return e.v, nil
	case *nameExpr:
		return r.evalName(e, sc)
	case *listExpr:
		out, err := r.evalItems(e.items, sc)
		if err != nil {
			return nil, err
		}
		return out, nil
	case *tupleExpr:
		out, err := r.evalItems(e.items, sc)
		if err != nil {
			return nil, err
		}
		return tuple(out), nil
	case *dictExpr:
		return r.evalDict(e, sc)
	case *getattrExpr:
		obj, err := r.eval(e.obj, sc)
		if err != nil {
			return nil, err
		}
		return getAttr(obj, e.attr)
	case *getitemExpr:
		return r.evalGetItem(e, sc)
	case *callExpr:
		return r.evalCall(e, sc, nil)
	case *filterExpr:
		return r.evalFilter(e, sc)
	case *testExpr:
		return r.evalTest(e, sc)
	case *binExpr:
		return r.evalBinary(e, sc)
	case *concatExpr:
		return r.evalConcat(e, sc)
	case *unaryExpr:
		return r.evalUnary(e, sc)
	case *compareExpr:
		return r.evalCompare(e, sc)
	case *condExpr:
		return r.evalCond(e, sc)
	case *sliceExpr:
		return nil, errors.New("slice outside of a subscript")
	}
	return nil, fmt.Errorf("chattemplate: internal error: unknown expression %T", e)
}

// evalName looks a name up in the scope, then the globals; else it is undefined.
func (r *renderer) evalName(e *nameExpr, sc *scope) (any, error) {
	if v, ok := sc.lookup(e.name); ok {
		return v, nil
	}
	if g, ok := r.cfg.globals[e.name]; ok {
		return g, nil
	}
	return undefined{format: "'%s' is undefined", a: e.name}, nil
}

// evalDict builds a dict literal (string keys only), in order.
func (r *renderer) evalDict(e *dictExpr, sc *scope) (any, error) {
	d := NewDict()
	for i, ke := range e.keys {
		k, err := r.eval(ke, sc)
		if err != nil {
			return nil, err
		}
		ks, ok := k.(string)
		if !ok {
			return nil, fmt.Errorf("dict keys other than strings are not supported (got %s)", typeName(k))
		}
		v, err := r.eval(e.values[i], sc)
		if err != nil {
			return nil, err
		}
		d.Set(ks, v)
	}
	return d, nil
}

// evalGetItem is obj[key] and obj[start:stop:step].
func (r *renderer) evalGetItem(e *getitemExpr, sc *scope) (any, error) {
	obj, err := r.eval(e.obj, sc)
	if err != nil {
		return nil, err
	}
	if s, ok := e.key.(*sliceExpr); ok {
		v, err := r.evalSlice(obj, s, sc)
		if err != nil && r.folding {
			// Jinja2 folds constant subscripts at compile time through
			// the sandbox's getitem, which turns the TypeError into an
			// undefined value.
			if _, isUndef := obj.(undefined); !isUndef {
				return undefined{format: "'%s' object is not subscriptable", a: typeName(obj)}, nil
			}
		}
		return v, err
	}
	key, err := r.eval(e.key, sc)
	if err != nil {
		return nil, err
	}
	return getItem(obj, key)
}

// evalFilter applies a filter to its (possibly absent) operand.
func (r *renderer) evalFilter(e *filterExpr, sc *scope) (any, error) {
	var v any
	if e.node != nil {
		var err error
		if v, err = r.eval(e.node, sc); err != nil {
			return nil, err
		}
	}
	return r.applyFilter(e, v, sc)
}

// evalTest is `x is test(args)`.
func (r *renderer) evalTest(e *testExpr, sc *scope) (any, error) {
	v, err := r.eval(e.node, sc)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(&e.call, sc)
	if err != nil {
		return nil, err
	}
	if err := r.step(); err != nil {
		return nil, err
	}
	ok, err := tests[e.name](r, v, args, kw)
	if err != nil {
		return nil, fmt.Errorf("test '%s': %w", e.name, err)
	}
	return ok, nil
}

// evalBinary is a binary operator; and/or short-circuit.
func (r *renderer) evalBinary(e *binExpr, sc *scope) (any, error) {
	if e.op == "+" {
		if _, nested := e.l.(*binExpr); nested {
			return r.evalPlusChain(e, sc)
		}
	}
	l, err := r.eval(e.l, sc)
	if err != nil {
		return nil, err
	}
	switch e.op {
	case "and":
		if !isTruthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	case "or":
		if isTruthy(l) {
			return l, nil
		}
		return r.eval(e.r, sc)
	}
	rv, err := r.eval(e.r, sc)
	if err != nil {
		return nil, err
	}
	return r.binaryOp(e.op, l, rv)
}

// evalConcat is the ~ operator: the string forms joined, within the output bound.
func (r *renderer) evalConcat(e *concatExpr, sc *scope) (any, error) {
	var b strings.Builder
	for _, it := range e.items {
		v, err := r.eval(it, sc)
		if err != nil {
			return nil, err
		}
		if u, ok := v.(undefined); ok && u.unsafe {
			return nil, u.failure()
		}
		b.WriteString(pyStr(v))
		if err := r.checkSize(b.Len()); err != nil {
			return nil, err
		}
	}
	return b.String(), nil
}

// evalUnary is not, unary + and unary -.
func (r *renderer) evalUnary(e *unaryExpr, sc *scope) (any, error) {
	v, err := r.eval(e.x, sc)
	if err != nil {
		return nil, err
	}
	if e.op == "not" {
		return !isTruthy(v), nil
	}
	if u, ok := v.(undefined); ok {
		return nil, u.failure()
	}
	n, ok := numeric(v)
	if !ok {
		return nil, fmt.Errorf("bad operand type for unary %s: '%s'", e.op, typeName(v))
	}
	if e.op == "+" {
		if n.isFloat {
			return n.f, nil
		}
		return n.i, nil
	}
	if n.isFloat {
		return -n.f, nil
	}
	if n.i == math.MinInt64 {
		return nil, errors.New("integer overflow")
	}
	return -n.i, nil
}

// evalCompare is a comparison chain: true when every link holds.
func (r *renderer) evalCompare(e *compareExpr, sc *scope) (any, error) {
	left, err := r.eval(e.first, sc)
	if err != nil {
		return nil, err
	}
	for i, op := range e.ops {
		right, err := r.eval(e.rest[i], sc)
		if err != nil {
			return nil, err
		}
		ok, err := compareOp(op, left, right)
		if err != nil {
			return nil, err
		}
		if !ok {
			return false, nil
		}
		left = right
	}
	return true, nil
}

// evalCond is the inline `a if cond else b`; without else a false condition is undefined.
func (r *renderer) evalCond(e *condExpr, sc *scope) (any, error) {
	c, err := r.eval(e.cond, sc)
	if err != nil {
		return nil, err
	}
	if isTruthy(c) {
		return r.eval(e.then, sc)
	}
	if e.orElse == nil {
		return undefined{format: "the inline if-expression evaluated to false and no else section was defined"}, nil
	}
	return r.eval(e.orElse, sc)
}

// evalPlusChain evaluates a left-nested chain a + b + c + ... . Operands are
// evaluated left to right as Python does; when all are strings (the common
// case in chat templates) the result is built with one allocation instead
// of one copy per "+".
func (r *renderer) evalPlusChain(e *binExpr, sc *scope) (any, error) {
	vals, total, allStrings, err := r.plusOperands(e, sc)
	if err != nil {
		return nil, err
	}
	if !allStrings {
		return r.foldPlus(vals)
	}
	if err := r.build(total); err != nil {
		return nil, err
	}
	var b strings.Builder
	b.Grow(total)
	for _, v := range vals {
		b.WriteString(v.(string))
	}
	return b.String(), nil
}

// plusOperands evaluates the operands of a + chain left to right; total is
// their length when allStrings.
func (r *renderer) plusOperands(e *binExpr, sc *scope) (vals []any, total int, allStrings bool, err error) {
	var operands []expr
	cur := expr(e)
	for {
		b, ok := cur.(*binExpr)
		if !ok || b.op != "+" {
			break
		}
		operands = append(operands, b.r)
		cur = b.l
	}
	operands = append(operands, cur)
	vals = make([]any, len(operands))
	allStrings = true
	for i := range operands {
		v, err := r.eval(operands[len(operands)-1-i], sc)
		if err != nil {
			return nil, 0, false, err
		}
		vals[i] = v
		if s, ok := v.(string); ok {
			total += len(s)
		} else {
			allStrings = false
		}
	}
	return vals, total, allStrings, nil
}

// foldPlus adds operands that are not all strings pairwise, as Python does.
func (r *renderer) foldPlus(vals []any) (any, error) {
	acc := vals[0]
	for _, v := range vals[1:] {
		var err error
		if acc, err = r.binaryOp("+", acc, v); err != nil {
			return nil, err
		}
	}
	return acc, nil
}

// writePlusChain is execOutput for {{ a + b + ... }}: a chain of strings
// is written piece by piece instead of being joined first (one copy less of
// every message a chat template prints this way; docs/tokenizer.md
// "Decision cost at long context"). The bounds are charged as for the
// joined string.
func (r *renderer) writePlusChain(e *binExpr, sc *scope, out *output) error {
	vals, total, allStrings, err := r.plusOperands(e, sc)
	if err != nil {
		return err
	}
	if !allStrings {
		v, err := r.foldPlus(vals)
		if err != nil {
			return err
		}
		if u, ok := v.(undefined); ok && u.unsafe {
			return nil
		}
		return r.writeValue(out, v)
	}
	if err := r.build(total); err != nil {
		return err
	}
	for _, v := range vals {
		if err := r.write(out, v.(string)); err != nil {
			return err
		}
	}
	return nil
}

// isConstant reports whether Jinja2's optimizer would fold e to a constant
// (literals and operators over literals; calls and filters are not folded
// here).
func isConstant(e expr) bool {
	switch x := e.(type) {
	case nil:
		return true
	case *constExpr:
		return true
	case *listExpr:
		return allConstant(x.items)
	case *tupleExpr:
		return allConstant(x.items)
	case *dictExpr:
		return allConstant(x.keys) && allConstant(x.values)
	case *unaryExpr:
		return isConstant(x.x)
	case *binExpr:
		return isConstant(x.l) && isConstant(x.r)
	case *concatExpr:
		return allConstant(x.items)
	case *compareExpr:
		return isConstant(x.first) && allConstant(x.rest)
	case *condExpr:
		return isConstant(x.cond) && isConstant(x.then) && isConstant(x.orElse)
	case *getitemExpr:
		return isConstant(x.obj) && isConstant(x.key)
	case *testExpr:
		return isConstant(x.node) && constantCall(&x.call)
	case *filterExpr:
		// Filters that need the template context are never folded.
		switch x.name {
		case "select", "reject", "selectattr", "rejectattr", "map":
			return false
		}
		return x.node != nil && isConstant(x.node) && constantCall(&x.call)
	case *sliceExpr:
		return isConstant(x.start) && isConstant(x.stop) && isConstant(x.step)
	}
	return false
}

func constantCall(c *callExpr) bool {
	return c.dynArgs == nil && c.dynKw == nil && allConstant(c.args) && allConstant(c.kwValues)
}

func allConstant(items []expr) bool {
	for _, it := range items {
		if !isConstant(it) {
			return false
		}
	}
	return true
}

func compareOp(op string, l, r any) (bool, error) {
	switch op {
	case "==":
		return valuesEqual(l, r), nil
	case "!=":
		return !valuesEqual(l, r), nil
	case "in":
		return contains(r, l)
	case "notin":
		ok, err := contains(r, l)
		return !ok, err
	}
	for _, v := range []any{l, r} {
		if u, ok := v.(undefined); ok {
			return false, u.failure()
		}
	}
	c, ok := compareValues(l, r)
	if !ok {
		return false, fmt.Errorf("'%s' not supported between instances of '%s' and '%s'", op, typeName(l), typeName(r))
	}
	switch op {
	case "<":
		return c < 0, nil
	case "<=":
		return c <= 0, nil
	case ">":
		return c > 0, nil
	}
	return c >= 0, nil
}

// contains is Python's `item in container`.
func contains(container, item any) (bool, error) {
	switch c := container.(type) {
	case string:
		s, ok := item.(string)
		if !ok {
			if u, isU := item.(undefined); isU {
				return false, u.failure()
			}
			return false, fmt.Errorf("'in <string>' requires string as left operand, not %s", typeName(item))
		}
		return strings.Contains(c, s), nil
	case []any:
		return seqContains(c, item), nil
	case tuple:
		return seqContains(c, item), nil
	case *Dict:
		s, ok := item.(string)
		if !ok {
			switch item.(type) {
			case []any, *Dict, *namespace:
				return false, fmt.Errorf("unhashable type: '%s'", typeName(item))
			}
			return false, nil
		}
		_, found := c.Get(s)
		return found, nil
	case undefined:
		if c.unsafe {
			return false, c.failure()
		}
		return false, nil
	case *generator:
		// Python consumes the iterator up to and including the match.
		for {
			e, ok := c.next()
			if !ok {
				return false, nil
			}
			if valuesEqual(e, item) {
				return true, nil
			}
		}
	case *dictView:
		return seqContains(c.items, item), nil
	}
	return false, fmt.Errorf("argument of type '%s' is not iterable", typeName(container))
}

// seqContains is Python's `item in seq` for a list, tuple or dict view.
func seqContains(seq []any, item any) bool {
	for _, e := range seq {
		if valuesEqual(e, item) {
			return true
		}
	}
	return false
}

func (r *renderer) evalSlice(obj any, s *sliceExpr, sc *scope) (any, error) {
	var bounds [3]any
	for i, e := range []expr{s.start, s.stop, s.step} {
		if e == nil {
			continue
		}
		v, err := r.eval(e, sc)
		if err != nil {
			return nil, err
		}
		bounds[i] = v
	}
	return sliceValue(obj, bounds[0], bounds[1], bounds[2])
}

// sliceIndices is Python's slice.indices(n).
func sliceIndices(n int, start, stop, step any) (int, int, int, error) {
	st := 1
	if step != nil {
		v, ok := sliceInt(step)
		if !ok {
			return 0, 0, 0, errors.New("slice indices must be integers or None")
		}
		if v == 0 {
			return 0, 0, 0, errors.New("slice step cannot be zero")
		}
		st = int(max(min(v, int64(math.MaxInt32)), int64(math.MinInt32)))
	}
	defStart, defStop := 0, n
	if st < 0 {
		defStart, defStop = n-1, -1
	}
	a, err := sliceBound(start, defStart, n, st)
	if err != nil {
		return 0, 0, 0, err
	}
	b, err := sliceBound(stop, defStop, n, st)
	if err != nil {
		return 0, 0, 0, err
	}
	return a, b, st, nil
}

// sliceInt is a slice index: an int or a bool.
func sliceInt(v any) (int64, bool) {
	if b, isB := v.(bool); isB {
		return boolInt(b), true
	}
	i, ok := v.(int64)
	return i, ok
}

// sliceBound clamps one slice bound v (nil: def) into a sequence of length
// n, for step st, as slice.indices does.
func sliceBound(v any, def, n, st int) (int, error) {
	if v == nil {
		return def, nil
	}
	i, ok := sliceInt(v)
	if !ok {
		return 0, errors.New("slice indices must be integers or None")
	}
	i = max(min(i, int64(math.MaxInt32)), int64(math.MinInt32))
	x := int(i)
	switch {
	case x < 0:
		x += n
		if x < 0 {
			x = 0
			if st < 0 {
				x = -1
			}
		}
	case x >= n:
		x = n
		if st < 0 {
			x = n - 1
		}
	}
	return x, nil
}

func boolInt(b bool) int64 {
	if b {
		return 1
	}
	return 0
}

func sliceItems(items []any, start, stop, step any) ([]any, error) {
	a, b, st, err := sliceIndices(len(items), start, stop, step)
	if err != nil {
		return nil, err
	}
	out := []any{}
	if st > 0 {
		for i := a; i < b; i += st {
			out = append(out, items[i])
		}
	} else {
		for i := a; i > b; i += st {
			out = append(out, items[i])
		}
	}
	return out, nil
}

func sliceValue(obj, start, stop, step any) (any, error) {
	switch x := obj.(type) {
	case []any:
		return sliceItems(x, start, stop, step)
	case tuple:
		out, err := sliceItems(x, start, stop, step)
		return tuple(out), err
	case string:
		runes := []rune(x)
		items := make([]any, len(runes))
		for i, r := range runes {
			items[i] = r
		}
		out, err := sliceItems(items, start, stop, step)
		if err != nil {
			return nil, err
		}
		rs := make([]rune, len(out))
		for i, r := range out {
			rs[i] = r.(rune)
		}
		return string(rs), nil
	case undefined:
		return nil, x.failure()
	}
	// Jinja2 compiles slices to plain Python subscription (no sandbox
	// getitem), so slicing anything else raises.
	return nil, fmt.Errorf("'%s' object is not subscriptable", typeName(obj))
}

func (r *renderer) evalArgs(c *callExpr, sc *scope) ([]any, *Dict, error) {
	var args []any
	for _, a := range c.args {
		v, err := r.eval(a, sc)
		if err != nil {
			return nil, nil, err
		}
		args = append(args, v)
	}
	if c.dynArgs != nil {
		v, err := r.eval(c.dynArgs, sc)
		if err != nil {
			return nil, nil, err
		}
		items, err := iterate(v)
		if err != nil {
			return nil, nil, err
		}
		args = append(args, items...)
	}
	var kw *Dict
	if len(c.kwNames) > 0 || c.dynKw != nil {
		kw = NewDict()
	}
	for i, name := range c.kwNames {
		v, err := r.eval(c.kwValues[i], sc)
		if err != nil {
			return nil, nil, err
		}
		kw.Set(name, v)
	}
	if c.dynKw != nil {
		v, err := r.eval(c.dynKw, sc)
		if err != nil {
			return nil, nil, err
		}
		d, ok := v.(*Dict)
		if !ok {
			return nil, nil, fmt.Errorf("argument after ** must be a mapping, not %s", typeName(v))
		}
		for _, k := range d.keys {
			kw.Set(k, d.val(k))
		}
	}
	return args, kw, nil
}

func (r *renderer) evalCall(c *callExpr, sc *scope, caller *macroValue) (any, error) {
	fn, err := r.eval(c.fn, sc)
	if err != nil {
		return nil, err
	}
	args, kw, err := r.evalArgs(c, sc)
	if err != nil {
		return nil, err
	}
	if err := r.step(); err != nil {
		return nil, err
	}
	return r.callValue(fn, args, kw, caller)
}

func (r *renderer) callValue(fn any, args []any, kw *Dict, caller *macroValue) (any, error) {
	switch f := fn.(type) {
	case *builtinFunc:
		return f.fn(r, args, kw)
	case boundMethod:
		return callMethod(r, f, args, kw)
	case *macroValue:
		return r.callMacro(f, args, kw, caller)
	case *loopObject:
		if !f.node.recursive {
			return nil, errors.New("'LoopContext' object is not callable (loop is not recursive)")
		}
		if len(args) != 1 {
			return nil, errors.New("recursive loop call takes exactly one argument")
		}
		r.depth++
		defer func() { r.depth-- }()
		if r.depth > r.cfg.maxCallDepth {
			return nil, fmt.Errorf("%w: call depth above %d", ErrLimit, r.cfg.maxCallDepth)
		}
		var buf output
		if err := r.runLoop(f.node, args[0], f.outer, &buf, f.depth0+1); err != nil {
			return nil, err
		}
		return buf.String(), nil
	case undefined:
		return nil, f.failure()
	}
	return nil, fmt.Errorf("'%s' object is not callable", typeName(fn))
}

// builtinFunc is a global function such as range or namespace.
type builtinFunc struct {
	name string
	fn   func(r *renderer, args []any, kw *Dict) (any, error)
}

func (r *renderer) binaryOp(op string, l, rv any) (any, error) {
	for _, v := range []any{l, rv} {
		if u, ok := v.(undefined); ok {
			return nil, u.failure()
		}
	}
	ln, lok := numeric(l)
	rn, rok := numeric(rv)
	if lok && rok {
		return numericOp(op, ln, rn)
	}
	switch op {
	case "+":
		if v, ok, err := r.concatSeq(l, rv); ok {
			return v, err
		}
	case "*":
		seq, count := l, rv
		if lok {
			seq, count = rv, l
		}
		if cn, ok := numeric(count); ok && !cn.isFloat {
			if v, ok, err := r.repeatSeq(seq, max(cn.i, 0)); ok {
				return v, err
			}
		}
	case "%":
		if s, ok := l.(string); ok {
			return percentFormat(s, rv)
		}
	}
	return nil, fmt.Errorf("unsupported operand type(s) for %s: '%s' and '%s'", op, typeName(l), typeName(rv))
}

// concatSeq is l + rv for two strings, two lists or two tuples, within the
// output bound; false when the operands are not such a pair.
func (r *renderer) concatSeq(l, rv any) (any, bool, error) {
	switch x := l.(type) {
	case string:
		if y, ok := rv.(string); ok {
			if err := r.build(len(x) + len(y)); err != nil {
				return nil, true, err
			}
			return x + y, true, nil
		}
	case []any:
		if y, ok := rv.([]any); ok {
			if err := r.build(r.seqBytes(x) + r.seqBytes(y)); err != nil {
				return nil, true, err
			}
			return append(append([]any{}, x...), y...), true, nil
		}
	case tuple:
		if y, ok := rv.(tuple); ok {
			if err := r.build(r.seqBytes(x) + r.seqBytes(y)); err != nil {
				return nil, true, err
			}
			return append(append(tuple{}, x...), y...), true, nil
		}
	}
	return nil, false, nil
}

// repeatSeq is seq * n (n >= 0) for a string, list or tuple, within the
// output bound; false when seq is none of those.
func (r *renderer) repeatSeq(seq any, n int64) (any, bool, error) {
	switch x := seq.(type) {
	case string:
		if err := r.checkRepeat(len(x), n); err != nil {
			return nil, true, err
		}
		return strings.Repeat(x, int(n)), true, nil
	case []any:
		if err := r.checkRepeat(r.seqBytes(x), n); err != nil {
			return nil, true, err
		}
		out := make([]any, 0, len(x)*int(n))
		for i := int64(0); i < n; i++ {
			out = append(out, x...)
		}
		return out, true, nil
	case tuple:
		if err := r.checkRepeat(r.seqBytes(x), n); err != nil {
			return nil, true, err
		}
		out := make(tuple, 0, len(x)*int(n))
		for i := int64(0); i < n; i++ {
			out = append(out, x...)
		}
		return out, true, nil
	}
	return nil, false, nil
}

// checkRepeat bounds seq * n, seq being seqBytes bytes, without overflowing
// the multiplication.
func (r *renderer) checkRepeat(seqBytes int, n int64) error {
	if seqBytes == 0 || n == 0 {
		return nil
	}
	if n > int64(r.cfg.maxOutput/seqBytes) {
		return fmt.Errorf("%w: value larger than %d bytes", ErrLimit, r.cfg.maxOutput)
	}
	return r.build(seqBytes * int(n))
}

func numericOp(op string, a, b number) (any, error) {
	if !a.isFloat && !b.isFloat {
		switch op {
		case "+", "-", "*", "/", "//", "%", "**":
			return intOp(op, a.i, b.i)
		}
	}
	return floatOp(op, a.float(), b.float())
}

// intOp is op on two ints with Python's semantics (floor division and
// modulo, true division to float) and an error where int64 would overflow.
func intOp(op string, x, y int64) (any, error) {
	switch op {
	case "+":
		s := x + y
		if (s > x) != (y > 0) {
			return nil, errors.New("integer overflow")
		}
		return s, nil
	case "-":
		s := x - y
		if (s < x) != (y > 0) {
			return nil, errors.New("integer overflow")
		}
		return s, nil
	case "*":
		if x != 0 && y != 0 {
			p := x * y
			if p/y != x || (x == -1 && y == math.MinInt64) || (y == -1 && x == math.MinInt64) {
				return nil, errors.New("integer overflow")
			}
			return p, nil
		}
		return int64(0), nil
	case "/":
		if y == 0 {
			return nil, errors.New("division by zero")
		}
		return float64(x) / float64(y), nil
	case "//":
		if y == 0 {
			return nil, errors.New("integer division or modulo by zero")
		}
		q := x / y
		if (x%y != 0) && ((x < 0) != (y < 0)) {
			q--
		}
		return q, nil
	case "%":
		if y == 0 {
			return nil, errors.New("integer division or modulo by zero")
		}
		m := x % y
		if m != 0 && ((m < 0) != (y < 0)) {
			m += y
		}
		return m, nil
	case "**":
		return intPow(x, y)
	}
	return nil, fmt.Errorf("unknown operator %s", op)
}

// intPow is x ** y for ints: a float for a negative exponent, else an int
// (an error past int64).
func intPow(x, y int64) (any, error) {
	if y < 0 {
		return math.Pow(float64(x), float64(y)), nil
	}
	switch x {
	case 0:
		if y == 0 {
			return int64(1), nil
		}
		return int64(0), nil
	case 1:
		return int64(1), nil
	case -1:
		if y%2 == 0 {
			return int64(1), nil
		}
		return int64(-1), nil
	}
	res := int64(1)
	for i := int64(0); i < y; i++ {
		if x != 0 && (res > math.MaxInt64/abs64(x)) {
			return nil, errors.New("integer overflow")
		}
		res *= x
	}
	return res, nil
}

// floatOp is op on two floats with Python's semantics and errors.
func floatOp(op string, x, y float64) (any, error) {
	switch op {
	case "+":
		return x + y, nil
	case "-":
		return x - y, nil
	case "*":
		return x * y, nil
	case "/":
		if y == 0 {
			return nil, errors.New("float division by zero")
		}
		return x / y, nil
	case "//":
		if y == 0 {
			return nil, errors.New("float floor division by zero")
		}
		return math.Floor(x / y), nil
	case "%":
		if y == 0 {
			return nil, errors.New("float modulo")
		}
		m := math.Mod(x, y)
		if m != 0 && ((m < 0) != (y < 0)) {
			m += y
		}
		return m, nil
	case "**":
		p := math.Pow(x, y)
		if math.IsInf(p, 0) && !math.IsInf(x, 0) && !math.IsInf(y, 0) && x != 0 {
			return nil, errors.New("OverflowError: numerical result out of range")
		}
		return p, nil
	}
	return nil, fmt.Errorf("unknown operator %s", op)
}

func abs64(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// config holds the compile options of a Template.
type config struct {
	now           func() time.Time
	maxOutput     int
	maxBuilt      int // total bytes expressions may build per render (checkSize)
	maxSteps      int
	maxCallDepth  int
	globals       map[string]any
	contentFormat string
}
