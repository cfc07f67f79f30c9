package chattemplate

import (
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"unicode"
)

type filterFunc func(r *renderer, v any, args []any, kw *Dict) (any, error)

type testFunc func(r *renderer, v any, args []any, kw *Dict) (bool, error)

// maxRange is the sandbox's MAX_RANGE.
const maxRange = 100000

var (
	filters map[string]filterFunc
	tests   map[string]testFunc
)

func init() {
	filters = map[string]filterFunc{
		"abs":        filterAbs,
		"attr":       filterAttr,
		"capitalize": strFilter(pyCapitalize),
		"center":     filterCenter,
		"count":      filterLength,
		"d":          filterDefault,
		"default":    filterDefault,
		"dictsort":   filterDictSort,
		"e":          filterEscape,
		"escape":     filterEscape,
		"first":      filterFirst,
		"float":      filterFloat,
		"format":     filterFormat,
		"indent":     filterIndent,
		"int":        filterInt,
		"items":      filterItems,
		"join":       filterJoin,
		"last":       filterLast,
		"length":     filterLength,
		"list":       filterList,
		"lower":      strFilter(pyLower),
		"map":        filterMap,
		"max":        filterMinMax(1),
		"min":        filterMinMax(-1),
		"reject":     filterSelect(false, false),
		"rejectattr": filterSelect(false, true),
		"replace":    filterReplace,
		"reverse":    filterReverse,
		"round":      filterRound,
		"safe":       func(r *renderer, v any, args []any, kw *Dict) (any, error) { return v, nil },
		"select":     filterSelect(true, false),
		"selectattr": filterSelect(true, true),
		"sort":       filterSort,
		"string":     func(r *renderer, v any, args []any, kw *Dict) (any, error) { return pyStr(v), nil },
		"sum":        filterSum,
		"title":      strFilter(jinjaTitle),
		"tojson":     filterToJSON,
		"trim":       filterTrim,
		"unique":     filterUnique,
		"upper":      strFilter(pyUpper),
		"wordcount":  filterWordCount,
	}
	tests = map[string]testFunc{
		"boolean":     func(r *renderer, v any, a []any, kw *Dict) (bool, error) { _, ok := v.(bool); return ok, nil },
		"callable":    testCallable,
		"defined":     func(r *renderer, v any, a []any, kw *Dict) (bool, error) { _, ok := v.(undefined); return !ok, nil },
		"divisibleby": testDivisibleBy,
		"eq":          testCompare("=="),
		"equalto":     testCompare("=="),
		"==":          testCompare("=="),
		"ne":          testCompare("!="),
		"!=":          testCompare("!="),
		"lt":          testCompare("<"),
		"lessthan":    testCompare("<"),
		"<":           testCompare("<"),
		"le":          testCompare("<="),
		"<=":          testCompare("<="),
		"gt":          testCompare(">"),
		"greaterthan": testCompare(">"),
		">":           testCompare(">"),
		"ge":          testCompare(">="),
		">=":          testCompare(">="),
		"even":        testParity(0),
		"odd":         testParity(1),
		"false":       func(r *renderer, v any, a []any, kw *Dict) (bool, error) { b, ok := v.(bool); return ok && !b, nil },
		"true":        func(r *renderer, v any, a []any, kw *Dict) (bool, error) { b, ok := v.(bool); return ok && b, nil },
		"float":       func(r *renderer, v any, a []any, kw *Dict) (bool, error) { _, ok := v.(float64); return ok, nil },
		"integer":     func(r *renderer, v any, a []any, kw *Dict) (bool, error) { _, ok := v.(int64); return ok, nil },
		"in":          testIn,
		"iterable":    testIterable,
		"lower":       testCase(false),
		"upper":       testCase(true),
		"mapping":     func(r *renderer, v any, a []any, kw *Dict) (bool, error) { _, ok := v.(*Dict); return ok, nil },
		"none":        func(r *renderer, v any, a []any, kw *Dict) (bool, error) { return v == nil, nil },
		"number":      func(r *renderer, v any, a []any, kw *Dict) (bool, error) { _, ok := numeric(v); return ok, nil },
		"sameas":      testSameAs,
		"sequence":    testSequence,
		"string":      func(r *renderer, v any, a []any, kw *Dict) (bool, error) { _, ok := v.(string); return ok, nil },
		"undefined":   func(r *renderer, v any, a []any, kw *Dict) (bool, error) { _, ok := v.(undefined); return ok, nil },
		"filter": func(r *renderer, v any, a []any, kw *Dict) (bool, error) {
			s, ok := v.(string)
			_, f := filters[s]
			return ok && f, nil
		},
		"test": func(r *renderer, v any, a []any, kw *Dict) (bool, error) {
			s, ok := v.(string)
			_, f := tests[s]
			return ok && f, nil
		},
	}
}

// defaultGlobals builds the template globals: Jinja's defaults that matter
// for chat templates plus transformers' raise_exception and strftime_now.
func defaultGlobals(cfg *config) map[string]any {
	return map[string]any{
		"range":           &builtinFunc{name: "range", fn: globalRange},
		"namespace":       &builtinFunc{name: "namespace", fn: globalNamespace},
		"dict":            &builtinFunc{name: "dict", fn: globalDict},
		"raise_exception": &builtinFunc{name: "raise_exception", fn: globalRaise},
		"strftime_now": &builtinFunc{name: "strftime_now", fn: func(r *renderer, args []any, kw *Dict) (any, error) {
			a, err := bindArgs("strftime_now", []string{"format"}, []any{required}, args, kw)
			if err != nil {
				return nil, err
			}
			f, err := argString("strftime_now", a[0])
			if err != nil {
				return nil, err
			}
			return pyStrftime(cfg.now(), f), nil
		}},
	}
}

func (r *renderer) applyFilter(f *filterExpr, v any, sc *scope) (any, error) {
	args, kw, err := r.evalArgs(&f.call, sc)
	if err != nil {
		return nil, err
	}
	if err := r.step(); err != nil {
		return nil, err
	}
	res, err := filters[f.name](r, v, args, kw)
	if err != nil {
		return nil, fmt.Errorf("filter '%s': %w", f.name, err)
	}
	return res, nil
}

func strFilter(fn func(string) string) filterFunc {
	return func(r *renderer, v any, args []any, kw *Dict) (any, error) {
		if _, err := bindArgs("filter", nil, nil, args, kw); err != nil {
			return nil, err
		}
		return fn(pyStr(v)), nil
	}
}

// jinjaTitle is Jinja's title filter: words split on "-", whitespace and
// opening brackets, each capitalised.
func jinjaTitle(s string) string {
	var b strings.Builder
	word := true
	for _, c := range s {
		if c == '-' || pyIsSpace(c) || c == '(' || c == '{' || c == '[' || c == '<' {
			b.WriteRune(c)
			word = true
			continue
		}
		if word {
			b.WriteString(pyUpper(string(c)))
		} else {
			b.WriteString(pyLower(string(c)))
		}
		word = false
	}
	return b.String()
}

func filterTrim(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("trim", []string{"chars"}, []any{nil}, args, kw)
	if err != nil {
		return nil, err
	}
	pred, err := optChars("trim", a[0])
	if err != nil {
		return nil, err
	}
	return strings.TrimFunc(pyStr(v), pred), nil
}

func filterLength(r *renderer, v any, args []any, kw *Dict) (any, error) {
	n, err := length(v)
	return int64(n), err
}

func filterDefault(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("default", []string{"default_value", "boolean"}, []any{"", false}, args, kw)
	if err != nil {
		return nil, err
	}
	if _, ok := v.(undefined); ok || (isTruthy(a[1]) && !isTruthy(v)) {
		return a[0], nil
	}
	return v, nil
}

func filterJoin(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("join", []string{"d", "attribute"}, []any{"", nil}, args, kw)
	if err != nil {
		return nil, err
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	var b strings.Builder
	sep := pyStr(a[0])
	for i, it := range items {
		if a[1] != nil {
			if it, err = attrPath(it, a[1]); err != nil {
				return nil, err
			}
		}
		if i > 0 {
			b.WriteString(sep)
		}
		b.WriteString(pyStr(it))
		if err := r.checkSize(b.Len()); err != nil {
			return nil, err
		}
	}
	return b.String(), nil
}

// attrPath resolves Jinja's attribute argument ("a.b" or an int index).
func attrPath(v any, attr any) (any, error) {
	if s, ok := attr.(string); ok {
		for _, part := range strings.Split(s, ".") {
			var key any = part
			if isDigits(part) {
				if i, err := strconv.ParseInt(part, 10, 64); err == nil {
					key = i
				}
			}
			var err error
			if v, err = getItem(v, key); err != nil {
				return nil, err
			}
		}
		return v, nil
	}
	return getItem(v, attr)
}

func isDigits(s string) bool {
	for _, c := range s {
		if !unicode.IsDigit(c) {
			return false
		}
	}
	return s != ""
}

func filterList(r *renderer, v any, args []any, kw *Dict) (any, error) {
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	return append([]any{}, items...), nil
}

func filterFirst(r *renderer, v any, args []any, kw *Dict) (any, error) {
	if g, ok := v.(*generator); ok {
		if item, ok := g.next(); ok {
			return item, nil
		}
		return undefined{format: "No first item, sequence was empty."}, nil
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return undefined{format: "No first item, sequence was empty."}, nil
	}
	return items[0], nil
}

func filterLast(r *renderer, v any, args []any, kw *Dict) (any, error) {
	if g, ok := v.(*generator); ok {
		return nil, fmt.Errorf("'%s' object is not reversible", g.name)
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return undefined{format: "No last item, sequence was empty."}, nil
	}
	return items[len(items)-1], nil
}

func filterItems(r *renderer, v any, args []any, kw *Dict) (any, error) {
	switch x := v.(type) {
	case undefined:
		return newGenerator("generator", nil), nil
	case *Dict:
		return newGenerator("generator", dictItems(x)), nil
	}
	return nil, fmt.Errorf("can only get item pairs from a mapping, not %s", typeName(v))
}

func filterInt(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("int", []string{"default", "base"}, []any{int64(0), int64(10)}, args, kw)
	if err != nil {
		return nil, err
	}
	if u, ok := v.(undefined); ok {
		return nil, u.failure() // int(Undefined) raises UndefinedError
	}
	switch x := v.(type) {
	case int64:
		return x, nil
	case bool:
		return boolInt(x), nil
	case float64:
		if math.IsNaN(x) || math.IsInf(x, 0) {
			return a[0], nil
		}
		return int64(x), nil
	case string:
		base, _ := intIndex(a[1])
		s := strings.ReplaceAll(strings.TrimFunc(x, pyIsSpace), "_", "")
		if i, err := strconv.ParseInt(s, int(base), 64); err == nil {
			return i, nil
		}
		if base == 10 {
			if f, err := strconv.ParseFloat(s, 64); err == nil && !math.IsInf(f, 0) && !math.IsNaN(f) {
				return int64(f), nil
			}
		}
	}
	return a[0], nil
}

func filterFloat(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("float", []string{"default"}, []any{0.0}, args, kw)
	if err != nil {
		return nil, err
	}
	if u, ok := v.(undefined); ok {
		return nil, u.failure() // float(Undefined) raises UndefinedError
	}
	switch x := v.(type) {
	case int64:
		return float64(x), nil
	case bool:
		return float64(boolInt(x)), nil
	case float64:
		return x, nil
	case string:
		if f, err := strconv.ParseFloat(strings.TrimFunc(x, pyIsSpace), 64); err == nil {
			return f, nil
		}
	}
	return a[0], nil
}

func filterAbs(r *renderer, v any, args []any, kw *Dict) (any, error) {
	n, ok := numeric(v)
	if !ok {
		return nil, fmt.Errorf("bad operand type for abs(): '%s'", typeName(v))
	}
	if n.isFloat {
		return math.Abs(n.f), nil
	}
	return abs64(n.i), nil
}

func filterAttr(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("attr", []string{"name"}, []any{required}, args, kw)
	if err != nil {
		return nil, err
	}
	name, err := argString("attr", a[0])
	if err != nil {
		return nil, err
	}
	return getAttr(v, name)
}

func filterCenter(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("center", []string{"width"}, []any{int64(80)}, args, kw)
	if err != nil {
		return nil, err
	}
	return callStrMethod(r, pyStr(v), "center", []any{a[0]}, nil)
}

func filterEscape(r *renderer, v any, args []any, kw *Dict) (any, error) {
	s := pyStr(v)
	rep := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&#34;", "'", "&#39;")
	return rep.Replace(s), nil
}

func filterFormat(r *renderer, v any, args []any, kw *Dict) (any, error) {
	s := pyStr(v)
	if kw != nil && kw.Len() > 0 {
		return percentFormat(s, kw)
	}
	if len(args) == 1 {
		return percentFormat(s, args[0])
	}
	return percentFormat(s, tuple(args))
}

func filterIndent(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("indent", []string{"width", "first", "blank"}, []any{int64(4), false, false}, args, kw)
	if err != nil {
		return nil, err
	}
	var ind string
	switch w := a[0].(type) {
	case string:
		ind = w
	default:
		n, ok := intIndex(w)
		if !ok {
			return nil, errors.New("indent width must be an int or str")
		}
		ind = strings.Repeat(" ", int(max(min(n, 1<<16), 0)))
	}
	str, ok := v.(string)
	if !ok {
		if u, isU := v.(undefined); isU {
			return nil, u.failure()
		}
		// do_indent does s += "\n": only strings work.
		return nil, fmt.Errorf("indent needs a string, not %s", typeName(v))
	}
	// Jinja2's do_indent: append "\n" (for splitlines), then indent every
	// line after the first that is non-empty (all of them with blank=True).
	lines := pySplitLines(str+"\n", false)
	var b strings.Builder
	for i, l := range lines {
		line := l.(string)
		if i > 0 {
			b.WriteByte('\n')
			if isTruthy(a[2]) || line != "" {
				b.WriteString(ind)
			}
		}
		b.WriteString(line)
		if err := r.checkSize(b.Len()); err != nil {
			return nil, err
		}
	}
	out := b.String()
	if isTruthy(a[1]) {
		out = ind + out
	}
	return out, nil
}

func filterMap(r *renderer, v any, args []any, kw *Dict) (any, error) {
	if !isTruthy(v) {
		// do_map starts with "if value:", so falsy inputs yield nothing.
		return newGenerator("generator", nil), nil
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	out := make([]any, 0, len(items))
	if len(args) == 0 && kw != nil && hasKey(kw, "attribute") {
		attr := kw.val("attribute")
		def, hasDef := kw.Get("default")
		for _, it := range items {
			x, err := attrPath(it, attr)
			if err != nil {
				return nil, err
			}
			if _, isU := x.(undefined); isU && hasDef {
				x = def
			}
			out = append(out, x)
		}
		return newGenerator("generator", out), nil
	}
	if len(args) == 0 {
		return nil, errors.New("map requires a filter argument")
	}
	name, ok := args[0].(string)
	f, found := filters[name]
	if !ok || !found {
		return nil, fmt.Errorf("no filter named %v", pyStr(args[0]))
	}
	for _, it := range items {
		if err := r.step(); err != nil {
			return nil, err
		}
		x, err := f(r, it, args[1:], kw)
		if err != nil {
			return nil, err
		}
		out = append(out, x)
	}
	return newGenerator("generator", out), nil
}

func filterSelect(keep, byAttr bool) filterFunc {
	return func(r *renderer, v any, args []any, kw *Dict) (any, error) {
		if !isTruthy(v) {
			// select_or_reject starts with "if value:".
			return newGenerator("generator", nil), nil
		}
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		var attr any
		if byAttr {
			if len(args) == 0 {
				return nil, errors.New("missing attribute argument")
			}
			attr, args = args[0], args[1:]
		}
		var test testFunc
		if len(args) > 0 {
			name, ok := args[0].(string)
			t, found := tests[name]
			if !ok || !found {
				return nil, fmt.Errorf("no test named %v", pyStr(args[0]))
			}
			test, args = t, args[1:]
		}
		out := []any{}
		for _, it := range items {
			if err := r.step(); err != nil {
				return nil, err
			}
			ok, err := selectTest(r, it, byAttr, attr, test, args, kw)
			if err != nil {
				return nil, err
			}
			if ok == keep {
				out = append(out, it)
			}
		}
		return newGenerator("generator", out), nil
	}
}

// selectTest is the test select/reject applies to item it: test (or
// truthiness when nil) of it, or of its attribute attr when byAttr.
func selectTest(r *renderer, it any, byAttr bool, attr any, test testFunc, args []any, kw *Dict) (bool, error) {
	x := it
	if byAttr {
		var err error
		if x, err = attrPath(it, attr); err != nil {
			return false, err
		}
	}
	if test == nil {
		return isTruthy(x), nil
	}
	return test(r, x, args, kw)
}

func filterReplace(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("replace", []string{"old", "new", "count"}, []any{required, required, nil}, args, kw)
	if err != nil {
		return nil, err
	}
	if a[2] == nil {
		a[2] = int64(-1)
	}
	return callStrMethod(r, pyStr(v), "replace", []any{pyStr(a[0]), pyStr(a[1]), a[2]}, nil)
}

// filterReverse is Jinja's reverse: a reversed string, reversed(seq) for
// sequences and dicts (an iterator), or a reversed list for other iterables.
func filterReverse(r *renderer, v any, args []any, kw *Dict) (any, error) {
	name := ""
	switch v.(type) {
	case string:
		return sliceValue(v, nil, nil, int64(-1))
	case []any:
		name = "list_reverseiterator"
	case tuple:
		name = "reversed"
	case *Dict:
		name = "dict_reversekeyiterator"
	case *dictView:
		name = "dict_reverseitemiterator"
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	rev, err := sliceItems(items, nil, nil, int64(-1))
	if err != nil || name == "" {
		return rev, err
	}
	return newGenerator(name, rev), nil
}

// roundInt is Python's round(int, ndigits), which stays an int: to
// 10**-ndigits, ties to even.
func roundInt(i, prec int64) int64 {
	if prec >= 0 {
		return i
	}
	p := int64(math.Pow(10, float64(min(-prec, 18))))
	q := i / p
	rem := i - q*p
	if 2*abs64(rem) > p || (2*abs64(rem) == p && q%2 != 0) {
		if rem > 0 {
			q++
		} else {
			q--
		}
	}
	return q * p
}

func filterRound(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("round", []string{"precision", "method"}, []any{int64(0), "common"}, args, kw)
	if err != nil {
		return nil, err
	}
	n, ok := numeric(v)
	if !ok {
		return nil, fmt.Errorf("must be real number, not %s", typeName(v))
	}
	prec, _ := intIndex(a[0])
	if !n.isFloat && a[1] == "common" {
		return roundInt(n.i, prec), nil
	}
	if a[1] == "common" {
		// Python's round(): correctly rounded, ties to even.
		if prec >= 0 && prec <= 300 {
			f, _ := strconv.ParseFloat(strconv.FormatFloat(n.float(), 'f', int(prec), 64), 64)
			return f, nil
		}
	}
	p := math.Pow(10, float64(prec))
	x := n.float() * p
	switch a[1] {
	case "common":
		x = math.RoundToEven(x)
	case "ceil":
		x = math.Ceil(x)
	case "floor":
		x = math.Floor(x)
	default:
		return nil, errors.New("method must be common, ceil or floor")
	}
	return x / p, nil
}

func sortKey(v any, attr any, caseSensitive bool) (any, error) {
	if attr != nil {
		var err error
		if v, err = attrPath(v, attr); err != nil {
			return nil, err
		}
	}
	if s, ok := v.(string); ok && !caseSensitive {
		return pyLower(s), nil
	}
	return v, nil
}

func sortValues(items []any, keys []any, reverse bool) error {
	var cmpErr error
	idx := make([]int, len(items))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(i, j int) bool {
		c, ok := compareValues(keys[idx[i]], keys[idx[j]])
		if !ok && cmpErr == nil {
			cmpErr = fmt.Errorf("'<' not supported between instances of '%s' and '%s'", typeName(keys[idx[i]]), typeName(keys[idx[j]]))
		}
		if reverse {
			return c > 0
		}
		return c < 0
	})
	sorted := make([]any, len(items))
	for i, k := range idx {
		sorted[i] = items[k]
	}
	copy(items, sorted)
	return cmpErr
}

// filterSort is Jinja's sort: sorted() with a key that is the list of the
// (comma-separated) attributes, so equal keys never need "<".
func filterSort(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("sort", []string{"reverse", "case_sensitive", "attribute"}, []any{false, false, nil}, args, kw)
	if err != nil {
		return nil, err
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	items = append([]any{}, items...)
	attrs := []any{a[2]}
	if s, ok := a[2].(string); ok {
		attrs = nil
		for _, part := range strings.Split(s, ",") {
			attrs = append(attrs, part)
		}
	}
	keys := make([]any, len(items))
	for i, it := range items {
		key := make([]any, len(attrs))
		for j, attr := range attrs {
			if key[j], err = sortKey(it, attr, isTruthy(a[1])); err != nil {
				return nil, err
			}
		}
		keys[i] = key
	}
	return items, sortValues(items, keys, isTruthy(a[0]))
}

func filterDictSort(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("dictsort", []string{"case_sensitive", "by", "reverse"}, []any{false, "key", false}, args, kw)
	if err != nil {
		return nil, err
	}
	d, ok := v.(*Dict)
	if !ok {
		return nil, errors.New("dictsort requires a mapping")
	}
	list := dictItems(d)
	pos := 0
	if a[1] == "value" {
		pos = 1
	}
	keys := make([]any, len(list))
	for i, it := range list {
		keys[i], _ = sortKey(it.(tuple)[pos], nil, isTruthy(a[0]))
	}
	return list, sortValues(list, keys, isTruthy(a[2]))
}

func filterUnique(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("unique", []string{"case_sensitive", "attribute"}, []any{false, nil}, args, kw)
	if err != nil {
		return nil, err
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	var out, seen []any
	for _, it := range items {
		k, err := sortKey(it, a[1], isTruthy(a[0]))
		if err != nil {
			return nil, err
		}
		dup := false
		for _, s := range seen {
			if valuesEqual(s, k) {
				dup = true
				break
			}
		}
		if !dup {
			seen = append(seen, k)
			out = append(out, it)
		}
	}
	if out == nil {
		out = []any{}
	}
	return newGenerator("generator", out), nil
}

func filterMinMax(sign int) filterFunc {
	return func(r *renderer, v any, args []any, kw *Dict) (any, error) {
		a, err := bindArgs("min/max", []string{"case_sensitive", "attribute"}, []any{false, nil}, args, kw)
		if err != nil {
			return nil, err
		}
		items, err := iterate(v)
		if err != nil {
			return nil, err
		}
		if len(items) == 0 {
			return undefined{format: "No aggregated item, sequence was empty."}, nil
		}
		best := items[0]
		bestKey, err := sortKey(best, a[1], isTruthy(a[0]))
		if err != nil {
			return nil, err
		}
		for _, it := range items[1:] {
			k, err := sortKey(it, a[1], isTruthy(a[0]))
			if err != nil {
				return nil, err
			}
			c, ok := compareValues(k, bestKey)
			if !ok {
				return nil, errors.New("values are not comparable")
			}
			if c*sign > 0 {
				best, bestKey = it, k
			}
		}
		return best, nil
	}
}

func filterSum(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("sum", []string{"attribute", "start"}, []any{nil, int64(0)}, args, kw)
	if err != nil {
		return nil, err
	}
	items, err := iterate(v)
	if err != nil {
		return nil, err
	}
	total := a[1]
	for _, it := range items {
		if a[0] != nil {
			if it, err = attrPath(it, a[0]); err != nil {
				return nil, err
			}
		}
		if total, err = r.binaryOp("+", total, it); err != nil {
			return nil, err
		}
	}
	return total, nil
}

func filterWordCount(r *renderer, v any, args []any, kw *Dict) (any, error) {
	n := 0
	inWord := false
	for _, c := range pyStr(v) {
		isWord := c == '_' || (c >= '0' && c <= '9') || isCased(c) || c > 0x7f && !pyIsSpace(c) && c != 0x85
		if isWord && !inWord {
			n++
		}
		inWord = isWord
	}
	return int64(n), nil
}

// filterToJSON is transformers' tojson override:
// json.dumps(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
func filterToJSON(r *renderer, v any, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("tojson", []string{"ensure_ascii", "indent", "separators", "sort_keys"}, []any{false, nil, nil, false}, args, kw)
	if err != nil {
		return nil, err
	}
	o := jsonOptions{ensureASCII: isTruthy(a[0]), sortKeys: isTruthy(a[3]), itemSep: ", ", keySep: ": "}
	switch ind := a[1].(type) {
	case nil:
	case string:
		o.indent = &ind
	default:
		n, ok := intIndex(ind)
		if !ok {
			return nil, fmt.Errorf("indent must be an int or str, not %s", typeName(ind))
		}
		s := strings.Repeat(" ", int(max(min(n, 1<<10), 0)))
		o.indent = &s
	}
	if o.indent != nil {
		o.itemSep = ","
	}
	if a[2] != nil {
		seps, err := iterate(a[2])
		if err != nil || len(seps) != 2 {
			return nil, errors.New("separators must be a pair of strings")
		}
		is, ok1 := seps[0].(string)
		ks, ok2 := seps[1].(string)
		if !ok1 || !ok2 {
			return nil, errors.New("separators must be a pair of strings")
		}
		o.itemSep, o.keySep = is, ks
	}
	if err := r.checkValue(v); err != nil {
		return nil, err
	}
	s, err := pyJSONDumps(v, o)
	if err != nil {
		return nil, err
	}
	return s, r.build(len(s))
}

// ---- tests ----

func testCompare(op string) testFunc {
	return func(r *renderer, v any, args []any, kw *Dict) (bool, error) {
		if len(args) != 1 {
			return false, errors.New("comparison test takes exactly one argument")
		}
		return compareOp(op, v, args[0])
	}
}

// testParity is Jinja's odd/even test: value % 2 == 1 (or == 0), so it
// follows Python's % for every type (a str formats, a float works).
func testParity(want int64) testFunc {
	return func(r *renderer, v any, args []any, kw *Dict) (bool, error) {
		res, err := r.binaryOp("%", v, int64(2))
		if err != nil {
			return false, err
		}
		return valuesEqual(res, want), nil
	}
}

func testDivisibleBy(r *renderer, v any, args []any, kw *Dict) (bool, error) {
	if len(args) != 1 {
		return false, errors.New("divisibleby takes exactly one argument")
	}
	res, err := r.binaryOp("%", v, args[0])
	if err != nil {
		return false, err
	}
	return valuesEqual(res, int64(0)), nil
}

func testIn(r *renderer, v any, args []any, kw *Dict) (bool, error) {
	if len(args) != 1 {
		return false, errors.New("in takes exactly one argument")
	}
	return contains(args[0], v)
}

func testIterable(r *renderer, v any, args []any, kw *Dict) (bool, error) {
	switch v.(type) {
	case string, []any, tuple, *Dict, undefined, *generator, *dictView:
		return true, nil
	}
	return false, nil
}

func testSequence(r *renderer, v any, args []any, kw *Dict) (bool, error) {
	switch v.(type) {
	// Undefined has __len__ and __getitem__ (which raises when called).
	case string, []any, tuple, *Dict, undefined:
		return true, nil
	}
	return false, nil
}

func testCallable(r *renderer, v any, args []any, kw *Dict) (bool, error) {
	switch v.(type) {
	// jinja2.Undefined and LoopContext define __call__ (which may raise).
	case *builtinFunc, boundMethod, *macroValue, *loopObject, undefined:
		return true, nil
	}
	return false, nil
}

// testCase is Jinja's lower/upper test: str(value).islower() / isupper().
func testCase(upper bool) testFunc {
	name := "islower"
	if upper {
		name = "isupper"
	}
	return func(r *renderer, v any, args []any, kw *Dict) (bool, error) {
		res, err := callStrMethod(r, pyStr(v), name, nil, nil)
		if err != nil {
			return false, err
		}
		return res.(bool), nil
	}
}

// testSameAs approximates Python's "is": containers by identity, scalars
// by type and value (True is not 1, 1.0 is not True).
func testSameAs(r *renderer, v any, args []any, kw *Dict) (bool, error) {
	if len(args) != 1 {
		return false, errors.New("sameas takes exactly one argument")
	}
	o := args[0]
	switch x := v.(type) {
	case nil:
		return o == nil, nil
	case bool:
		b, ok := o.(bool)
		return ok && b == x, nil
	case int64:
		i, ok := o.(int64)
		return ok && i == x, nil
	case float64:
		f, ok := o.(float64)
		return ok && f == x, nil
	case string:
		s, ok := o.(string)
		return ok && s == x, nil
	case *Dict:
		d, ok := o.(*Dict)
		return ok && d == x, nil
	case []any:
		l, ok := o.([]any)
		return ok && len(l) == len(x) && (len(x) == 0 || &l[0] == &x[0]), nil
	case undefined:
		return false, nil
	}
	return identical(v, o), nil
}

// ---- globals ----

func globalRange(r *renderer, args []any, kw *Dict) (any, error) {
	if kw != nil && kw.Len() > 0 {
		return nil, errors.New("range() takes no keyword arguments")
	}
	ints := make([]int64, len(args))
	for i, a := range args {
		n, ok := intIndex(a)
		if !ok {
			return nil, fmt.Errorf("'%s' object cannot be interpreted as an integer", typeName(a))
		}
		ints[i] = n
	}
	var start, stop, step int64 = 0, 0, 1
	switch len(ints) {
	case 1:
		stop = ints[0]
	case 2:
		start, stop = ints[0], ints[1]
	case 3:
		start, stop, step = ints[0], ints[1], ints[2]
	default:
		return nil, fmt.Errorf("range expected 1 to 3 arguments, got %d", len(ints))
	}
	if step == 0 {
		return nil, errors.New("range() arg 3 must not be zero")
	}
	// Unsigned arithmetic: stop-start may not fit in an int64.
	var n uint64
	if step > 0 && stop > start {
		n = (uint64(stop-start) + uint64(step) - 1) / uint64(step)
	} else if step < 0 && stop < start {
		n = (uint64(start-stop) + uint64(-step) - 1) / uint64(-step)
	}
	if n > maxRange {
		return nil, fmt.Errorf("range too big. The sandbox blocks ranges larger than MAX_RANGE (%d)", maxRange)
	}
	if err := r.build(int(n) * itemBytes); err != nil { // a loop over range() rebuilds it each pass
		return nil, err
	}
	out := make([]any, n)
	for i := range out {
		out[i] = start + int64(i)*step
	}
	return out, nil
}

func globalNamespace(r *renderer, args []any, kw *Dict) (any, error) {
	ns := &namespace{attrs: NewDict()}
	for _, a := range args {
		d, ok := a.(*Dict)
		if !ok {
			return nil, fmt.Errorf("namespace() positional argument must be a mapping, not %s", typeName(a))
		}
		for _, k := range d.keys {
			ns.attrs.Set(k, d.val(k))
		}
	}
	if kw != nil {
		for _, k := range kw.keys {
			ns.attrs.Set(k, kw.val(k))
		}
	}
	return ns, nil
}

func globalDict(r *renderer, args []any, kw *Dict) (any, error) {
	d := NewDict()
	for _, a := range args {
		src, ok := a.(*Dict)
		if !ok {
			return nil, fmt.Errorf("dict() argument must be a mapping, not %s", typeName(a))
		}
		for _, k := range src.keys {
			d.Set(k, src.val(k))
		}
	}
	if kw != nil {
		for _, k := range kw.keys {
			d.Set(k, kw.val(k))
		}
	}
	return d, nil
}

func globalRaise(r *renderer, args []any, kw *Dict) (any, error) {
	a, err := bindArgs("raise_exception", []string{"message"}, []any{required}, args, kw)
	if err != nil {
		return nil, err
	}
	return nil, &TemplateException{Message: pyStr(a[0])}
}

// percentFormat is Python's `fmt % args` for the common conversions.
func percentFormat(format string, arg any) (any, error) {
	var list []any
	var mapping *Dict
	// Python skips the "not all arguments converted" check when the
	// argument supports subscription (dict, list) and is not a tuple/str.
	mappingLike := false
	switch x := arg.(type) {
	case tuple:
		list = x
	case *Dict:
		mapping = x
		mappingLike = true
		list = []any{x}
	case []any:
		mappingLike = true
		list = []any{x}
	default:
		list = []any{x}
	}
	var b strings.Builder
	next := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		if c != '%' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(format) {
			return nil, errors.New("incomplete format")
		}
		var val any
		keyed := false
		if format[i] == '(' {
			end := strings.IndexByte(format[i:], ')')
			if end < 0 || mapping == nil {
				return nil, errors.New("format requires a mapping")
			}
			val, keyed = mapping.val(format[i+1:i+end]), true
			i += end + 1
		}
		start := i
		for i < len(format) && strings.IndexByte("-+ #0123456789.", format[i]) >= 0 {
			i++
		}
		if i >= len(format) {
			return nil, errors.New("incomplete format")
		}
		flags := format[start:i]
		verb := format[i]
		if verb == '%' {
			b.WriteByte('%')
			continue
		}
		if !keyed {
			if next >= len(list) {
				return nil, errors.New("not enough arguments for format string")
			}
			val = list[next]
			next++
		}
		if err := writePercentVerb(&b, verb, flags, val); err != nil {
			return nil, err
		}
	}
	if !mappingLike && next < len(list) {
		return nil, errors.New("not all arguments converted during string formatting")
	}
	return b.String(), nil
}

// writePercentVerb writes val formatted by one %-conversion (verb with its
// flags).
func writePercentVerb(b *strings.Builder, verb byte, flags string, val any) error {
	switch verb {
	case 's':
		b.WriteString(fmt.Sprintf("%"+flags+"s", pyStr(val)))
	case 'r', 'a':
		b.WriteString(fmt.Sprintf("%"+flags+"s", pyReprString(val)))
	case 'd', 'i', 'u':
		n, ok := numeric(val)
		if !ok {
			return fmt.Errorf("%%d format: a real number is required, not %s", typeName(val))
		}
		iv := n.i
		if n.isFloat {
			iv = int64(n.f)
		}
		b.WriteString(fmt.Sprintf("%"+flags+"d", iv))
	case 'f', 'F', 'e', 'E', 'g', 'G':
		n, ok := numeric(val)
		if !ok {
			return fmt.Errorf("must be real number, not %s", typeName(val))
		}
		if !strings.Contains(flags, ".") && verb != 'g' && verb != 'G' {
			flags += ".6"
		}
		b.WriteString(fmt.Sprintf("%"+flags+string(verb), n.float()))
	case 'x', 'X', 'o':
		n, ok := numeric(val)
		if !ok || n.isFloat {
			return fmt.Errorf("%%%c format: an integer is required", verb)
		}
		b.WriteString(fmt.Sprintf("%"+flags+string(verb), n.i))
	case 'c':
		switch x := val.(type) {
		case string:
			b.WriteString(x)
		case int64:
			b.WriteRune(rune(x))
		}
	default:
		return fmt.Errorf("unsupported format character '%c'", verb)
	}
	return nil
}

// pyFormat is a subset of str.format: {} {0} {name} with optional !r/!s.
func pyFormat(format string, args []any, kw *Dict) (any, error) {
	var b strings.Builder
	auto := 0
	for i := 0; i < len(format); i++ {
		c := format[i]
		switch {
		case c == '{' && i+1 < len(format) && format[i+1] == '{':
			b.WriteByte('{')
			i++
		case c == '}' && i+1 < len(format) && format[i+1] == '}':
			b.WriteByte('}')
			i++
		case c == '{':
			end := strings.IndexByte(format[i:], '}')
			if end < 0 {
				return nil, errors.New("single '{' encountered in format string")
			}
			field := format[i+1 : i+end]
			i += end
			conv := ""
			if j := strings.IndexByte(field, '!'); j >= 0 {
				field, conv = field[:j], field[j+1:]
			}
			if strings.ContainsRune(field, ':') {
				return nil, errors.New("format specs are not supported")
			}
			val, err := formatField(field, args, &auto, kw)
			if err != nil {
				return nil, err
			}
			if conv == "r" {
				b.WriteString(pyReprString(val))
			} else {
				b.WriteString(pyStr(val))
			}
		case c == '}':
			return nil, errors.New("single '}' encountered in format string")
		default:
			b.WriteByte(c)
		}
	}
	return b.String(), nil
}

// formatField is the value of one str.format replacement field: the next
// positional argument ({}, counted by auto), a numbered one or a keyword.
func formatField(field string, args []any, auto *int, kw *Dict) (any, error) {
	switch {
	case field == "":
		if *auto >= len(args) {
			return nil, errors.New("replacement index out of range")
		}
		val := args[*auto]
		*auto++
		return val, nil
	case field[0] >= '0' && field[0] <= '9':
		n, err := strconv.Atoi(field)
		if err != nil || n >= len(args) {
			return nil, errors.New("replacement index out of range")
		}
		return args[n], nil
	default:
		if kw == nil || !hasKey(kw, field) {
			return nil, fmt.Errorf("KeyError: '%s'", field)
		}
		return kw.val(field), nil
	}
}
