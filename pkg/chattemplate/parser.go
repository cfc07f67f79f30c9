package chattemplate

import (
	"fmt"
	"slices"
)

// maxParseDepth bounds expression and block nesting.
const maxParseDepth = 150

// ---- AST ----

type node interface{}

type (
	textNode   struct{ text string }
	outputNode struct {
		expr     expr
		constant bool // foldable by Jinja2's optimizer
	}
	ifNode struct {
		conds  []expr
		bodies [][]node
		orElse []node
	}
	forNode struct {
		target    target
		iter      expr
		cond      expr
		body      []node
		orElse    []node
		recursive bool
	}
	setNode struct {
		target target
		value  expr
	}
	setBlockNode struct {
		target target
		filter expr // a filterExpr chain whose innermost node is nil, or nil
		body   []node
	}
	macroNode struct {
		name     string
		params   []string
		defaults []expr // aligned to the tail of params
		body     []node
		// catchVarargs/catchKwargs: the body reads varargs/kwargs, so extra
		// arguments are accepted (otherwise calling with them is an error).
		catchVarargs, catchKwargs bool
	}
	callBlockNode struct {
		call     *callExpr
		params   []string
		defaults []expr
		body     []node
	}
	filterBlockNode struct {
		filter expr
		body   []node
	}
	withNode struct {
		targets []target
		values  []expr
		body    []node
	}
	breakNode    struct{}
	continueNode struct{}
)

// target is an assignment target: a name, a tuple of targets, or ns.attr.
type target struct {
	name  string
	items []target // tuple unpacking when non-nil
	attr  string   // namespace attribute assignment when non-empty
}

type expr interface{}

type (
	constExpr   struct{ v any }
	nameExpr    struct{ name string }
	listExpr    struct{ items []expr }
	tupleExpr   struct{ items []expr }
	dictExpr    struct{ keys, values []expr }
	getattrExpr struct {
		obj  expr
		attr string
	}
	getitemExpr struct {
		obj expr
		key expr
	}
	sliceExpr struct{ start, stop, step expr }
	callExpr  struct {
		fn       expr
		args     []expr
		kwNames  []string
		kwValues []expr
		dynArgs  expr
		dynKw    expr
	}
	filterExpr struct {
		node expr // nil inside {% filter %} and {% set x | f %}
		name string
		call callExpr
	}
	testExpr struct {
		node expr
		name string
		call callExpr
	}
	binExpr struct {
		op   string
		l, r expr
	}
	concatExpr struct{ items []expr }
	unaryExpr  struct {
		op string // "not", "-", "+"
		x  expr
	}
	compareExpr struct {
		first expr
		ops   []string
		rest  []expr
	}
	condExpr struct{ cond, then, orElse expr }
)

// ---- parser ----

type parser struct {
	toks  []token
	pos   int
	depth int
	// loopDepth tracks for-loop nesting so break/continue outside a loop
	// are rejected at compile time.
	loopDepth int
}

func (p *parser) cur() token  { return p.toks[p.pos] }
func (p *parser) peek() token { return p.toks[min(p.pos+1, len(p.toks)-1)] }
func (p *parser) next() token {
	t := p.toks[p.pos]
	if p.pos < len(p.toks)-1 {
		p.pos++
	}
	return t
}

func (p *parser) fail(t token, format string, args ...any) error {
	return &SyntaxError{Line: t.line, Msg: fmt.Sprintf(format, args...)}
}

func (p *parser) isOp(op string) bool {
	t := p.cur()
	return t.kind == tokOp && t.val == op
}

func (p *parser) isName(name string) bool {
	t := p.cur()
	return t.kind == tokName && t.val == name
}

func (p *parser) expectOp(op string) error {
	if !p.isOp(op) {
		return p.fail(p.cur(), "expected '%s', got %s", op, describe(p.cur()))
	}
	p.next()
	return nil
}

func (p *parser) expectKind(k tokenKind) (token, error) {
	if p.cur().kind != k {
		return token{}, p.fail(p.cur(), "expected %s, got %s", k, describe(p.cur()))
	}
	return p.next(), nil
}

func describe(t token) string {
	switch t.kind {
	case tokName, tokOp:
		return fmt.Sprintf("'%s'", t.val)
	case tokString:
		return "string"
	}
	return t.kind.String()
}

func (p *parser) enter() error {
	p.depth++
	if p.depth > maxParseDepth {
		return p.fail(p.cur(), "template nesting exceeds %d levels", maxParseDepth)
	}
	return nil
}

func (p *parser) leave() { p.depth-- }

func parse(toks []token) ([]node, error) {
	p := &parser{toks: toks}
	body, err := p.subparse(nil)
	if err != nil {
		return nil, err
	}
	if p.cur().kind != tokEOF {
		return nil, p.fail(p.cur(), "unexpected %s", describe(p.cur()))
	}
	return body, nil
}

// subparse reads nodes until a block tag whose name is in ends (left
// unconsumed at the name) or the end of the template.
func (p *parser) subparse(ends []string) ([]node, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	var body []node
	for {
		t := p.cur()
		switch t.kind {
		case tokEOF:
			if len(ends) > 0 {
				return nil, p.fail(t, "unexpected end of template, expected one of %v", ends)
			}
			return body, nil
		case tokData:
			p.next()
			body = append(body, &textNode{text: t.val})
		case tokVarBegin:
			p.next()
			n, err := p.parseOutput()
			if err != nil {
				return nil, err
			}
			body = append(body, n)
		case tokBlockBegin:
			p.next()
			name := p.cur()
			if name.kind != tokName {
				return nil, p.fail(name, "tag name expected")
			}
			if slices.Contains(ends, name.val) {
				return body, nil
			}
			n, err := p.parseStatement()
			if err != nil {
				return nil, err
			}
			if _, err := p.expectKind(tokBlockEnd); err != nil {
				return nil, err
			}
			body = append(body, n...)
		default:
			return nil, p.fail(t, "unexpected %s", describe(t))
		}
	}
}

// parseOutput parses the expression of a {{ … }} tag (after its opener)
// and its closer.
func (p *parser) parseOutput() (node, error) {
	e, err := p.parseTuple(true, nil, false)
	if err != nil {
		return nil, err
	}
	if _, err := p.expectKind(tokVarEnd); err != nil {
		return nil, err
	}
	return &outputNode{expr: e, constant: isConstant(e)}, nil
}

// endBlock consumes the end tag name (already current).
func (p *parser) endTag(name string) error {
	if !p.isName(name) {
		return p.fail(p.cur(), "expected '%s'", name)
	}
	p.next()
	return nil
}

func (p *parser) parseStatement() ([]node, error) {
	t := p.next()
	switch t.val {
	case "if":
		n, err := p.parseIf()
		return []node{n}, err
	case "for":
		n, err := p.parseFor()
		return []node{n}, err
	case "set":
		n, err := p.parseSet()
		return []node{n}, err
	case "macro":
		n, err := p.parseMacro()
		return []node{n}, err
	case "call":
		n, err := p.parseCallBlock()
		return []node{n}, err
	case "filter":
		f, err := p.parseFilter(nil, true)
		if err != nil {
			return nil, err
		}
		if _, err := p.expectKind(tokBlockEnd); err != nil {
			return nil, err
		}
		body, err := p.subparse([]string{"endfilter"})
		if err != nil {
			return nil, err
		}
		return []node{&filterBlockNode{filter: f, body: body}}, p.endTag("endfilter")
	case "with":
		n, err := p.parseWith()
		return []node{n}, err
	case "generation":
		// transformers' AssistantTracker tag: renders its body unchanged.
		if _, err := p.expectKind(tokBlockEnd); err != nil {
			return nil, err
		}
		body, err := p.subparse([]string{"endgeneration"})
		if err != nil {
			return nil, err
		}
		return body, p.endTag("endgeneration")
	case "break", "continue":
		if p.loopDepth == 0 {
			return nil, p.fail(t, "'%s' outside of a loop", t.val)
		}
		if t.val == "break" {
			return []node{&breakNode{}}, nil
		}
		return []node{&continueNode{}}, nil
	}
	return nil, p.fail(t, "encountered unknown tag '%s'", t.val)
}

func (p *parser) parseIf() (node, error) {
	n := &ifNode{}
	for {
		cond, err := p.parseTuple(false, nil, false)
		if err != nil {
			return nil, err
		}
		if _, err := p.expectKind(tokBlockEnd); err != nil {
			return nil, err
		}
		body, err := p.subparse([]string{"elif", "else", "endif"})
		if err != nil {
			return nil, err
		}
		n.conds = append(n.conds, cond)
		n.bodies = append(n.bodies, body)
		switch p.next().val {
		case "elif":
			continue
		case "else":
			if _, err := p.expectKind(tokBlockEnd); err != nil {
				return nil, err
			}
			n.orElse, err = p.subparse([]string{"endif"})
			if err != nil {
				return nil, err
			}
			return n, p.endTag("endif")
		}
		return n, nil
	}
}

func (p *parser) parseFor() (node, error) {
	tgt, err := p.parseAssignTarget(false, []string{"in"})
	if err != nil {
		return nil, err
	}
	if !p.isName("in") {
		return nil, p.fail(p.cur(), "expected 'in'")
	}
	p.next()
	iter, err := p.parseTuple(false, []string{"recursive"}, false)
	if err != nil {
		return nil, err
	}
	n := &forNode{target: tgt, iter: iter}
	if p.isName("if") {
		p.next()
		if n.cond, err = p.parseExpression(true); err != nil {
			return nil, err
		}
	}
	if p.isName("recursive") {
		p.next()
		n.recursive = true
	}
	if _, err := p.expectKind(tokBlockEnd); err != nil {
		return nil, err
	}
	p.loopDepth++
	n.body, err = p.subparse([]string{"endfor", "else"})
	p.loopDepth--
	if err != nil {
		return nil, err
	}
	if p.next().val == "else" {
		if _, err := p.expectKind(tokBlockEnd); err != nil {
			return nil, err
		}
		if n.orElse, err = p.subparse([]string{"endfor"}); err != nil {
			return nil, err
		}
		return n, p.endTag("endfor")
	}
	return n, nil
}

func (p *parser) parseSet() (node, error) {
	tgt, err := p.parseAssignTarget(true, nil)
	if err != nil {
		return nil, err
	}
	if p.isOp("=") {
		p.next()
		v, err := p.parseTuple(true, nil, false)
		if err != nil {
			return nil, err
		}
		return &setNode{target: tgt, value: v}, nil
	}
	n := &setBlockNode{target: tgt}
	if p.isOp("|") {
		if n.filter, err = p.parseFilter(nil, false); err != nil {
			return nil, err
		}
	}
	if _, err := p.expectKind(tokBlockEnd); err != nil {
		return nil, err
	}
	if n.body, err = p.subparse([]string{"endset"}); err != nil {
		return nil, err
	}
	return n, p.endTag("endset")
}

func (p *parser) parseSignature() ([]string, []expr, error) {
	var params []string
	var defaults []expr
	if err := p.expectOp("("); err != nil {
		return nil, nil, err
	}
	for !p.isOp(")") {
		if len(params) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, nil, err
			}
			if p.isOp(")") {
				break
			}
		}
		name, err := p.expectKind(tokName)
		if err != nil {
			return nil, nil, err
		}
		params = append(params, name.val)
		if p.isOp("=") {
			p.next()
			d, err := p.parseExpression(true)
			if err != nil {
				return nil, nil, err
			}
			defaults = append(defaults, d)
		} else if len(defaults) > 0 {
			return nil, nil, p.fail(name, "non-default argument follows default argument")
		}
	}
	p.next()
	return params, defaults, nil
}

func (p *parser) parseMacro() (node, error) {
	name, err := p.expectKind(tokName)
	if err != nil {
		return nil, err
	}
	params, defaults, err := p.parseSignature()
	if err != nil {
		return nil, err
	}
	if _, err := p.expectKind(tokBlockEnd); err != nil {
		return nil, err
	}
	saved := p.loopDepth
	p.loopDepth = 0
	body, err := p.subparse([]string{"endmacro"})
	p.loopDepth = saved
	if err != nil {
		return nil, err
	}
	return &macroNode{name: name.val, params: params, defaults: defaults, body: body,
		catchVarargs: usesName(body, "varargs"), catchKwargs: usesName(body, "kwargs")}, p.endTag("endmacro")
}

func (p *parser) parseCallBlock() (node, error) {
	n := &callBlockNode{}
	var err error
	if p.isOp("(") {
		if n.params, n.defaults, err = p.parseSignature(); err != nil {
			return nil, err
		}
	}
	e, err := p.parseExpression(true)
	if err != nil {
		return nil, err
	}
	c, ok := e.(*callExpr)
	if !ok {
		return nil, p.fail(p.cur(), "expected call")
	}
	n.call = c
	if _, err := p.expectKind(tokBlockEnd); err != nil {
		return nil, err
	}
	saved := p.loopDepth
	p.loopDepth = 0
	n.body, err = p.subparse([]string{"endcall"})
	p.loopDepth = saved
	if err != nil {
		return nil, err
	}
	return n, p.endTag("endcall")
}

func (p *parser) parseWith() (node, error) {
	n := &withNode{}
	for p.cur().kind != tokBlockEnd {
		if len(n.targets) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		tgt, err := p.parseAssignTarget(false, nil)
		if err != nil {
			return nil, err
		}
		if err := p.expectOp("="); err != nil {
			return nil, err
		}
		v, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		n.targets = append(n.targets, tgt)
		n.values = append(n.values, v)
	}
	p.next()
	body, err := p.subparse([]string{"endwith"})
	if err != nil {
		return nil, err
	}
	n.body = body
	// subparse left us at the name; the caller expects block_end next.
	return n, p.endTag("endwith")
}

// parseAssignTarget parses a name, a tuple of names, or (withNamespace) ns.attr.
func (p *parser) parseAssignTarget(withNamespace bool, extraEnds []string) (target, error) {
	if withNamespace && p.cur().kind == tokName && p.peek().kind == tokOp && p.peek().val == "." {
		ns := p.next()
		p.next()
		attr, err := p.expectKind(tokName)
		if err != nil {
			return target{}, err
		}
		return target{name: ns.val, attr: attr.val}, nil
	}
	var items []target
	isTuple := false
	for {
		if len(items) > 0 {
			if err := p.expectOp(","); err != nil {
				return target{}, err
			}
		}
		if p.isTupleEnd(extraEnds) || p.isOp("=") || p.isOp("|") {
			break
		}
		t, err := p.parseTargetItem()
		if err != nil {
			return target{}, err
		}
		items = append(items, t)
		if p.isOp(",") {
			isTuple = true
		} else {
			break
		}
	}
	if len(items) == 0 {
		return target{}, p.fail(p.cur(), "expected assignment target")
	}
	if !isTuple {
		return items[0], nil
	}
	return target{items: items}, nil
}

// parseTargetItem parses one item of an assignment target: a name, or a
// parenthesized target.
func (p *parser) parseTargetItem() (target, error) {
	if p.isOp("(") {
		p.next()
		inner, err := p.parseAssignTarget(false, nil)
		if err != nil {
			return target{}, err
		}
		if err := p.expectOp(")"); err != nil {
			return target{}, err
		}
		return inner, nil
	}
	name, err := p.expectKind(tokName)
	if err != nil {
		return target{}, err
	}
	switch name.val {
	case "true", "false", "none", "True", "False", "None":
		return target{}, p.fail(name, "can't assign to constant '%s'", name.val)
	}
	return target{name: name.val}, nil
}

func (p *parser) isTupleEnd(extraEnds []string) bool {
	t := p.cur()
	switch t.kind {
	case tokVarEnd, tokBlockEnd, tokEOF:
		return true
	case tokOp:
		return t.val == ")"
	case tokName:
		for _, e := range extraEnds {
			if t.val == e {
				return true
			}
		}
	}
	return false
}

// parseTuple mirrors Parser.parse_tuple.
func (p *parser) parseTuple(withCond bool, extraEnds []string, explicitParens bool) (expr, error) {
	var args []expr
	isTuple := false
	for {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		if p.isTupleEnd(extraEnds) {
			break
		}
		e, err := p.parseExpression(withCond)
		if err != nil {
			return nil, err
		}
		args = append(args, e)
		if p.isOp(",") {
			isTuple = true
		} else {
			break
		}
	}
	if !isTuple {
		if len(args) > 0 {
			return args[0], nil
		}
		if !explicitParens {
			return nil, p.fail(p.cur(), "expected an expression, got %s", describe(p.cur()))
		}
	}
	return &tupleExpr{items: args}, nil
}

func (p *parser) parseExpression(withCond bool) (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	if !withCond {
		return p.parseOr()
	}
	e, err := p.parseOr()
	if err != nil {
		return nil, err
	}
	for p.isName("if") {
		p.next()
		cond, err := p.parseOr()
		if err != nil {
			return nil, err
		}
		var orElse expr
		if p.isName("else") {
			p.next()
			if orElse, err = p.parseExpression(true); err != nil {
				return nil, err
			}
		}
		e = &condExpr{cond: cond, then: e, orElse: orElse}
	}
	return e, nil
}

func (p *parser) parseOr() (expr, error) {
	l, err := p.parseAnd()
	if err != nil {
		return nil, err
	}
	for p.isName("or") {
		p.next()
		r, err := p.parseAnd()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "or", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseAnd() (expr, error) {
	l, err := p.parseNot()
	if err != nil {
		return nil, err
	}
	for p.isName("and") {
		p.next()
		r, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "and", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseNot() (expr, error) {
	if p.isName("not") {
		p.next()
		if err := p.enter(); err != nil {
			return nil, err
		}
		defer p.leave()
		x, err := p.parseNot()
		if err != nil {
			return nil, err
		}
		return &unaryExpr{op: "not", x: x}, nil
	}
	return p.parseCompare()
}

func (p *parser) parseCompare() (expr, error) {
	first, err := p.parseMath1()
	if err != nil {
		return nil, err
	}
	var ops []string
	var rest []expr
	for {
		t := p.cur()
		op := ""
		switch {
		case t.kind == tokOp && (t.val == "==" || t.val == "!=" || t.val == "<" || t.val == ">" || t.val == "<=" || t.val == ">="):
			op = t.val
			p.next()
		case p.isName("in"):
			op = "in"
			p.next()
		case p.isName("not") && p.peek().kind == tokName && p.peek().val == "in":
			op = "notin"
			p.next()
			p.next()
		}
		if op == "" {
			break
		}
		r, err := p.parseMath1()
		if err != nil {
			return nil, err
		}
		ops = append(ops, op)
		rest = append(rest, r)
	}
	if len(ops) == 0 {
		return first, nil
	}
	return &compareExpr{first: first, ops: ops, rest: rest}, nil
}

func (p *parser) parseMath1() (expr, error) {
	l, err := p.parseConcat()
	if err != nil {
		return nil, err
	}
	for p.isOp("+") || p.isOp("-") {
		op := p.next().val
		r, err := p.parseConcat()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseConcat() (expr, error) {
	first, err := p.parseMath2()
	if err != nil {
		return nil, err
	}
	if !p.isOp("~") {
		return first, nil
	}
	items := []expr{first}
	for p.isOp("~") {
		p.next()
		e, err := p.parseMath2()
		if err != nil {
			return nil, err
		}
		items = append(items, e)
	}
	return &concatExpr{items: items}, nil
}

func (p *parser) parseMath2() (expr, error) {
	l, err := p.parsePow()
	if err != nil {
		return nil, err
	}
	for p.isOp("*") || p.isOp("/") || p.isOp("//") || p.isOp("%") {
		op := p.next().val
		r, err := p.parsePow()
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: op, l: l, r: r}
	}
	return l, nil
}

func (p *parser) parsePow() (expr, error) {
	l, err := p.parseUnary(true)
	if err != nil {
		return nil, err
	}
	for p.isOp("**") {
		p.next()
		r, err := p.parseUnary(true)
		if err != nil {
			return nil, err
		}
		l = &binExpr{op: "**", l: l, r: r}
	}
	return l, nil
}

func (p *parser) parseUnary(withFilter bool) (expr, error) {
	if err := p.enter(); err != nil {
		return nil, err
	}
	defer p.leave()
	var e expr
	var err error
	switch {
	case p.isOp("-"), p.isOp("+"):
		op := p.next().val
		x, err := p.parseUnary(false)
		if err != nil {
			return nil, err
		}
		e = &unaryExpr{op: op, x: x}
	default:
		if e, err = p.parsePrimary(); err != nil {
			return nil, err
		}
	}
	if e, err = p.parsePostfix(e); err != nil {
		return nil, err
	}
	if withFilter {
		return p.parseFilterExpr(e)
	}
	return e, nil
}

func (p *parser) parsePrimary() (expr, error) {
	t := p.cur()
	switch t.kind {
	case tokName:
		p.next()
		switch t.val {
		case "true", "True":
			return &constExpr{v: true}, nil
		case "false", "False":
			return &constExpr{v: false}, nil
		case "none", "None":
			return &constExpr{v: nil}, nil
		}
		return &nameExpr{name: t.val}, nil
	case tokString:
		p.next()
		s := t.val
		for p.cur().kind == tokString {
			s += p.next().val
		}
		return &constExpr{v: s}, nil
	case tokInt, tokFloat:
		p.next()
		return &constExpr{v: t.num}, nil
	case tokOp:
		switch t.val {
		case "(":
			p.next()
			e, err := p.parseTuple(true, nil, true)
			if err != nil {
				return nil, err
			}
			return e, p.expectOp(")")
		case "[":
			p.next()
			return p.parseListLiteral()
		case "{":
			p.next()
			return p.parseDictLiteral()
		}
	}
	return nil, p.fail(t, "unexpected %s", describe(t))
}

// parseListLiteral parses the items of [ … ] after the '[' and the ']'
// (a trailing comma allowed).
func (p *parser) parseListLiteral() (expr, error) {
	l := &listExpr{}
	for !p.isOp("]") {
		if len(l.items) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
			if p.isOp("]") {
				break
			}
		}
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		l.items = append(l.items, e)
	}
	p.next()
	return l, nil
}

// parseDictLiteral parses the key: value pairs of { … } after the '{' and
// the '}' (a trailing comma allowed).
func (p *parser) parseDictLiteral() (expr, error) {
	d := &dictExpr{}
	for !p.isOp("}") {
		if len(d.keys) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
			if p.isOp("}") {
				break
			}
		}
		k, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		if err := p.expectOp(":"); err != nil {
			return nil, err
		}
		v, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		d.keys = append(d.keys, k)
		d.values = append(d.values, v)
	}
	p.next()
	return d, nil
}

func (p *parser) parsePostfix(e expr) (expr, error) {
	for {
		switch {
		case p.isOp("."), p.isOp("["):
			var err error
			if e, err = p.parseSubscript(e); err != nil {
				return nil, err
			}
		case p.isOp("("):
			c, err := p.parseCallArgs()
			if err != nil {
				return nil, err
			}
			c.fn = e
			e = c
		default:
			return e, nil
		}
	}
}

func (p *parser) parseFilterExpr(e expr) (expr, error) {
	for {
		var err error
		switch {
		case p.isOp("|"):
			e, err = p.parseFilter(e, false)
		case p.isName("is"):
			e, err = p.parseTest(e)
		case p.isOp("("):
			var c *callExpr
			c, err = p.parseCallArgs()
			if err == nil {
				c.fn = e
				e = c
			}
		default:
			return e, nil
		}
		if err != nil {
			return nil, err
		}
	}
}

func (p *parser) parseSubscript(e expr) (expr, error) {
	t := p.next()
	if t.val == "." {
		a := p.next()
		switch a.kind {
		case tokName:
			return &getattrExpr{obj: e, attr: a.val}, nil
		case tokInt:
			return &getitemExpr{obj: e, key: &constExpr{v: a.num}}, nil
		}
		return nil, p.fail(a, "expected name or number")
	}
	var args []expr
	for !p.isOp("]") {
		if len(args) > 0 {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
		}
		a, err := p.parseSubscribed()
		if err != nil {
			return nil, err
		}
		args = append(args, a)
	}
	p.next()
	switch len(args) {
	case 0:
		return nil, p.fail(t, "expected subscript")
	case 1:
		return &getitemExpr{obj: e, key: args[0]}, nil
	}
	return &getitemExpr{obj: e, key: &tupleExpr{items: args}}, nil
}

func (p *parser) parseSubscribed() (expr, error) {
	var parts [3]expr
	if p.isOp(":") {
		p.next()
	} else {
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		if !p.isOp(":") {
			return e, nil
		}
		p.next()
		parts[0] = e
	}
	if !p.isOp(":") && !p.isOp("]") && !p.isOp(",") {
		e, err := p.parseExpression(true)
		if err != nil {
			return nil, err
		}
		parts[1] = e
	}
	if p.isOp(":") {
		p.next()
		if !p.isOp("]") && !p.isOp(",") {
			e, err := p.parseExpression(true)
			if err != nil {
				return nil, err
			}
			parts[2] = e
		}
	}
	return &sliceExpr{start: parts[0], stop: parts[1], step: parts[2]}, nil
}

func (p *parser) parseCallArgs() (*callExpr, error) {
	open := p.next() // "("
	c := &callExpr{}
	bad := func() error { return p.fail(open, "invalid syntax for function call expression") }
	needComma := false
	for !p.isOp(")") {
		if needComma {
			if err := p.expectOp(","); err != nil {
				return nil, err
			}
			if p.isOp(")") {
				break
			}
		}
		if err := p.parseCallArg(c, bad); err != nil {
			return nil, err
		}
		needComma = true
	}
	p.next()
	return c, nil
}

// parseCallArg parses one argument of a call into c: *args, **kwargs, a
// keyword or a positional argument, in the order Python allows (bad is the
// error for one out of order).
func (p *parser) parseCallArg(c *callExpr, bad func() error) error {
	switch {
	case p.isOp("*"):
		if c.dynArgs != nil || c.dynKw != nil {
			return bad()
		}
		p.next()
		e, err := p.parseExpression(true)
		if err != nil {
			return err
		}
		c.dynArgs = e
	case p.isOp("**"):
		if c.dynKw != nil {
			return bad()
		}
		p.next()
		e, err := p.parseExpression(true)
		if err != nil {
			return err
		}
		c.dynKw = e
	case p.cur().kind == tokName && p.peek().kind == tokOp && p.peek().val == "=":
		if c.dynKw != nil {
			return bad()
		}
		name := p.next().val
		p.next()
		e, err := p.parseExpression(true)
		if err != nil {
			return err
		}
		c.kwNames = append(c.kwNames, name)
		c.kwValues = append(c.kwValues, e)
	default:
		if c.dynArgs != nil || c.dynKw != nil || len(c.kwNames) > 0 {
			return bad()
		}
		e, err := p.parseExpression(true)
		if err != nil {
			return err
		}
		c.args = append(c.args, e)
	}
	return nil
}

// parseFilter parses `| name(args) | ...`; with inline the first name has no pipe.
func (p *parser) parseFilter(e expr, inline bool) (expr, error) {
	for p.isOp("|") || inline {
		if !inline {
			p.next()
		}
		inline = false
		name, err := p.expectKind(tokName)
		if err != nil {
			return nil, err
		}
		f := &filterExpr{node: e, name: name.val}
		if _, ok := filters[name.val]; !ok {
			return nil, p.fail(name, "no filter named '%s'", name.val)
		}
		if p.isOp("(") {
			c, err := p.parseCallArgs()
			if err != nil {
				return nil, err
			}
			f.call = *c
		}
		e = f
	}
	return e, nil
}

func (p *parser) parseTest(e expr) (expr, error) {
	p.next() // "is"
	negated := false
	if p.isName("not") {
		p.next()
		negated = true
	}
	name, err := p.expectKind(tokName)
	if err != nil {
		return nil, err
	}
	if _, ok := tests[name.val]; !ok {
		return nil, p.fail(name, "no test named '%s'", name.val)
	}
	t := &testExpr{node: e, name: name.val}
	cur := p.cur()
	switch {
	case p.isOp("("):
		c, err := p.parseCallArgs()
		if err != nil {
			return nil, err
		}
		t.call = *c
	case (cur.kind == tokName || cur.kind == tokString || cur.kind == tokInt || cur.kind == tokFloat ||
		p.isOp("[") || p.isOp("{")) && !p.isName("else") && !p.isName("or") && !p.isName("and"):
		if p.isName("is") {
			return nil, p.fail(cur, "you cannot chain multiple tests with is")
		}
		arg, err := p.parsePrimary()
		if err != nil {
			return nil, err
		}
		if arg, err = p.parsePostfix(arg); err != nil {
			return nil, err
		}
		t.call.args = []expr{arg}
	}
	if negated {
		return &unaryExpr{op: "not", x: t}, nil
	}
	return t, nil
}

// usesName reports whether any expression in nodes reads the variable name
// (Jinja2's find_undeclared, used to decide whether a macro accepts extra
// positional arguments (varargs), keyword arguments (kwargs) or a caller).
func usesName(nodes []node, name string) bool {
	found := false
	var visitExpr func(e expr)
	visitExpr = func(e expr) {
		if found || e == nil {
			return
		}
		if n, ok := e.(*nameExpr); ok {
			found = n.name == name
			return
		}
		exprChildren(e, visitExpr)
	}
	var visitNodes func(ns []node)
	visitNodes = func(ns []node) {
		for _, n := range ns {
			if found {
				return
			}
			nodeChildren(n, visitExpr, visitNodes)
		}
	}
	visitNodes(nodes)
	return found
}

// exprChildren calls visit on each sub-expression of e.
func exprChildren(e expr, visit func(expr)) {
	switch x := e.(type) {
	case *listExpr:
		for _, it := range x.items {
			visit(it)
		}
	case *tupleExpr:
		for _, it := range x.items {
			visit(it)
		}
	case *dictExpr:
		for i := range x.keys {
			visit(x.keys[i])
			visit(x.values[i])
		}
	case *getattrExpr:
		visit(x.obj)
	case *getitemExpr:
		visit(x.obj)
		visit(x.key)
	case *sliceExpr:
		visit(x.start)
		visit(x.stop)
		visit(x.step)
	case *callExpr:
		visit(x.fn)
		visitCall(x, visit)
	case *filterExpr:
		visit(x.node)
		visitCall(&x.call, visit)
	case *testExpr:
		visit(x.node)
		visitCall(&x.call, visit)
	case *binExpr:
		visit(x.l)
		visit(x.r)
	case *concatExpr:
		for _, it := range x.items {
			visit(it)
		}
	case *unaryExpr:
		visit(x.x)
	case *compareExpr:
		visit(x.first)
		for _, it := range x.rest {
			visit(it)
		}
	case *condExpr:
		visit(x.cond)
		visit(x.then)
		visit(x.orElse)
	}
}

// nodeChildren calls visitExpr on the expressions of statement n and
// visitNodes on its bodies. A nested macro contributes only its defaults: it
// has its own varargs, kwargs and caller.
func nodeChildren(n node, visitExpr func(expr), visitNodes func([]node)) {
	switch x := n.(type) {
	case *outputNode:
		visitExpr(x.expr)
	case *ifNode:
		for i, c := range x.conds {
			visitExpr(c)
			visitNodes(x.bodies[i])
		}
		visitNodes(x.orElse)
	case *forNode:
		visitExpr(x.iter)
		visitExpr(x.cond)
		visitNodes(x.body)
		visitNodes(x.orElse)
	case *setNode:
		visitExpr(x.value)
	case *setBlockNode:
		visitExpr(x.filter)
		visitNodes(x.body)
	case *callBlockNode:
		visitExpr(x.call)
		for _, d := range x.defaults {
			visitExpr(d)
		}
		visitNodes(x.body)
	case *filterBlockNode:
		visitExpr(x.filter)
		visitNodes(x.body)
	case *withNode:
		for _, v := range x.values {
			visitExpr(v)
		}
		visitNodes(x.body)
	case *macroNode:
		// Nested macros have their own varargs/kwargs/caller.
		for _, d := range x.defaults {
			visitExpr(d)
		}
	}
}

func visitCall(c *callExpr, visit func(expr)) {
	for _, a := range c.args {
		visit(a)
	}
	for _, v := range c.kwValues {
		visit(v)
	}
	visit(c.dynArgs)
	visit(c.dynKw)
}
