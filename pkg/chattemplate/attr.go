package chattemplate

import (
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// boundMethod is a Python method looked up on a value (s.strip, d.items).
type boundMethod struct {
	recv any
	name string
}

// Method tables: the attribute names each Python type has. Names marked
// false mutate the object and are blocked by ImmutableSandboxedEnvironment.
var (
	strMethods = map[string]bool{
		"capitalize": true, "casefold": true, "center": true, "count": true, "encode": true, "endswith": true,
		"expandtabs": true, "find": true, "format": true, "format_map": true, "index": true, "isalnum": true,
		"isalpha": true, "isascii": true, "isdecimal": true, "isdigit": true, "isidentifier": true, "islower": true,
		"isnumeric": true, "isprintable": true, "isspace": true, "istitle": true, "isupper": true, "join": true,
		"ljust": true, "lower": true, "lstrip": true, "maketrans": true, "partition": true, "removeprefix": true,
		"removesuffix": true, "replace": true, "rfind": true, "rindex": true, "rjust": true, "rpartition": true,
		"rsplit": true, "rstrip": true, "split": true, "splitlines": true, "startswith": true, "strip": true,
		"swapcase": true, "title": true, "translate": true, "upper": true, "zfill": true,
	}
	dictMethods = map[string]bool{
		"clear": false, "copy": true, "fromkeys": true, "get": true, "items": true, "keys": true, "pop": false,
		"popitem": false, "setdefault": false, "update": false, "values": true,
	}
	listMethods = map[string]bool{
		"append": false, "clear": false, "copy": true, "count": true, "extend": false, "index": true,
		"insert": false, "pop": false, "remove": false, "reverse": false, "sort": false,
	}
	tupleMethods = map[string]bool{"count": true, "index": true}
)

func unsafeAttr(obj any, name string) undefined {
	return undefined{unsafe: true, format: "access to attribute '%s' of '%s' object is unsafe", a: name, b: typeName(obj)}
}

func missingAttr(obj any, name string) undefined {
	return undefined{format: "'%s' object has no attribute '%s'", a: typeName(obj), b: name}
}

// lookupMethod is Python getattr(obj, name) restricted to the sandbox.
// found is false when the object has no such attribute.
func lookupMethod(obj any, name string) (any, bool) {
	if strings.HasPrefix(name, "_") {
		return nil, false
	}
	var table map[string]bool
	switch x := obj.(type) {
	case string:
		table = strMethods
	case *Dict:
		table = dictMethods
	case []any:
		table = listMethods
	case tuple:
		table = tupleMethods
	case *namespace:
		v, ok := x.attrs.Get(name)
		return v, ok
	case *loopObject:
		return x.attr(name)
	case int64, bool:
		switch name {
		case "real", "numerator":
			return x, true
		case "imag":
			return int64(0), true
		case "denominator":
			return int64(1), true
		}
		return nil, false
	case float64:
		switch name {
		case "real":
			return x, true
		case "imag":
			return 0.0, true
		}
		return nil, false
	default:
		return nil, false
	}
	safe, ok := table[name]
	if !ok {
		return nil, false
	}
	if !safe {
		return unsafeAttr(obj, name), true
	}
	return boundMethod{recv: obj, name: name}, true
}

// getAttr implements `obj.name` as SandboxedEnvironment.getattr does:
// attribute first, then item.
func getAttr(obj any, name string) (any, error) {
	if u, ok := obj.(undefined); ok {
		return nil, u.failure()
	}
	if v, ok := lookupMethod(obj, name); ok {
		return v, nil
	}
	if d, ok := obj.(*Dict); ok {
		if v, ok := d.Get(name); ok {
			return v, nil
		}
	}
	return missingAttr(obj, name), nil
}

// getItem implements `obj[key]` as SandboxedEnvironment.getitem does: item
// first, then attribute for string keys.
func getItem(obj any, key any) (any, error) {
	if u, ok := obj.(undefined); ok {
		return nil, u.failure()
	}
	if u, ok := key.(undefined); ok && u.unsafe {
		return nil, u.failure()
	}
	switch x := obj.(type) {
	case *Dict:
		if s, ok := key.(string); ok {
			if v, ok := x.Get(s); ok {
				return v, nil
			}
		}
	case []any:
		if v, ok := indexSeq(x, key); ok {
			return v, nil
		}
	case tuple:
		if v, ok := indexSeq(x, key); ok {
			return v, nil
		}
	case string:
		if v, ok := indexString(x, key); ok {
			return v, nil
		}
	}
	if s, ok := key.(string); ok {
		if v, ok := lookupMethod(obj, s); ok {
			return v, nil
		}
	}
	return undefined{format: "%s has no element %s", a: typeName(obj), b: pyReprString(key)}, nil
}

// indexString is s[key] for an integer key (negative counts from the end):
// the character at that code-point index.
func indexString(s string, key any) (string, bool) {
	i, ok := intIndex(key)
	if !ok {
		return "", false
	}
	n := utf8.RuneCountInString(s)
	if i < 0 {
		i += int64(n)
	}
	if i < 0 || i >= int64(n) {
		return "", false
	}
	k := int64(0)
	for _, r := range s {
		if k == i {
			return string(r), true
		}
		k++
	}
	return "", false
}

func pyReprString(v any) string {
	var b strings.Builder
	writeRepr(&b, v)
	return b.String()
}

func intIndex(key any) (int64, bool) {
	switch k := key.(type) {
	case int64:
		return k, true
	case bool:
		return boolInt(k), true
	}
	return 0, false
}

func indexSeq(items []any, key any) (any, bool) {
	i, ok := intIndex(key)
	if !ok {
		return nil, false
	}
	if i < 0 {
		i += int64(len(items))
	}
	if i < 0 || i >= int64(len(items)) {
		return nil, false
	}
	return items[i], true
}

// attr exposes the loop variable's attributes.
func (l *loopObject) attr(name string) (any, bool) {
	n := len(l.items)
	switch name {
	case "index0":
		return int64(l.index0), true
	case "index":
		return int64(l.index0 + 1), true
	case "revindex":
		return int64(n - l.index0), true
	case "revindex0":
		return int64(n - l.index0 - 1), true
	case "first":
		return l.index0 == 0, true
	case "last":
		return l.index0 == n-1, true
	case "length":
		return int64(n), true
	case "depth":
		return int64(l.depth0 + 1), true
	case "depth0":
		return int64(l.depth0), true
	case "previtem":
		if l.index0 == 0 {
			return undefined{format: "there is no previous item"}, true
		}
		return l.items[l.index0-1], true
	case "nextitem":
		if l.index0+1 >= n {
			return undefined{format: "there is no next item"}, true
		}
		return l.items[l.index0+1], true
	case "cycle", "changed":
		return boundMethod{recv: l, name: name}, true
	}
	return nil, false
}

// bindArgs maps positional and keyword arguments onto named parameters.
// defaults[i] == required marks a required parameter.
type requiredArg struct{}

var required = requiredArg{}

func bindArgs(fname string, params []string, defaults []any, args []any, kw *Dict) ([]any, error) {
	if len(args) > len(params) {
		return nil, fmt.Errorf("%s() takes at most %d arguments (%d given)", fname, len(params), len(args))
	}
	out := make([]any, len(params))
	for i := range params {
		switch {
		case i < len(args):
			out[i] = args[i]
		default:
			out[i] = defaults[i]
		}
	}
	if kw != nil {
		for _, k := range kw.keys {
			found := false
			for i, p := range params {
				if p == k {
					if i < len(args) {
						return nil, fmt.Errorf("%s() got multiple values for argument '%s'", fname, k)
					}
					out[i] = kw.val(k)
					found = true
				}
			}
			if !found {
				return nil, fmt.Errorf("%s() got an unexpected keyword argument '%s'", fname, k)
			}
		}
	}
	for i, v := range out {
		if v == required {
			return nil, fmt.Errorf("%s() missing required argument '%s'", fname, params[i])
		}
	}
	return out, nil
}

func argString(fname string, v any) (string, error) {
	s, ok := v.(string)
	if !ok {
		return "", fmt.Errorf("%s() argument must be str, not %s", fname, typeName(v))
	}
	return s, nil
}

// optChars turns a strip() argument (None or str) into a predicate.
func optChars(fname string, v any) (func(rune) bool, error) {
	if v == nil {
		return pyIsSpace, nil
	}
	s, err := argString(fname, v)
	if err != nil {
		return nil, err
	}
	return func(r rune) bool { return strings.ContainsRune(s, r) }, nil
}

func callMethod(r *renderer, m boundMethod, args []any, kw *Dict) (any, error) {
	switch recv := m.recv.(type) {
	case string:
		return callStrMethod(r, recv, m.name, args, kw)
	case *Dict:
		return callDictMethod(recv, m.name, args, kw)
	case []any:
		return callSeqMethod(recv, m.name, args, kw)
	case tuple:
		return callSeqMethod(recv, m.name, args, kw)
	case *loopObject:
		switch m.name {
		case "cycle":
			if len(args) == 0 {
				return nil, errors.New("no items for cycling given")
			}
			return args[recv.index0%len(args)], nil
		case "changed":
			v := tuple(args)
			if recv.hasLast && valuesEqual(recv.lastVal, v) {
				return false, nil
			}
			recv.lastVal, recv.hasLast = v, true
			return true, nil
		}
	}
	return nil, fmt.Errorf("method %s of %s is not supported", m.name, typeName(m.recv))
}

func callDictMethod(d *Dict, name string, args []any, kw *Dict) (any, error) {
	switch name {
	case "items":
		if _, err := bindArgs("items", nil, nil, args, kw); err != nil {
			return nil, err
		}
		return &dictView{kind: "dict_items", items: dictItems(d)}, nil
	case "keys":
		if _, err := bindArgs("keys", nil, nil, args, kw); err != nil {
			return nil, err
		}
		out := make([]any, len(d.keys))
		for i, k := range d.keys {
			out[i] = k
		}
		return &dictView{kind: "dict_keys", items: out}, nil
	case "values":
		if _, err := bindArgs("values", nil, nil, args, kw); err != nil {
			return nil, err
		}
		return &dictView{kind: "dict_values", items: append([]any(nil), d.vals...)}, nil
	case "get":
		if kw != nil && kw.Len() > 0 {
			return nil, errors.New("get() takes no keyword arguments")
		}
		if len(args) < 1 || len(args) > 2 {
			return nil, fmt.Errorf("get expected 1 or 2 arguments, got %d", len(args))
		}
		if s, ok := args[0].(string); ok {
			if v, ok := d.Get(s); ok {
				return v, nil
			}
		}
		if len(args) == 2 {
			return args[1], nil
		}
		return nil, nil
	case "copy":
		return d.clone(), nil
	}
	return nil, fmt.Errorf("dict.%s is not supported", name)
}

func dictItems(d *Dict) []any {
	out := make([]any, len(d.keys))
	for i, k := range d.keys {
		out[i] = tuple{k, d.vals[i]}
	}
	return out
}

func callSeqMethod(items []any, name string, args []any, kw *Dict) (any, error) {
	switch name {
	case "count":
		if len(args) != 1 {
			return nil, errors.New("count() takes exactly one argument")
		}
		n := int64(0)
		for _, it := range items {
			if valuesEqual(it, args[0]) {
				n++
			}
		}
		return n, nil
	case "index":
		if len(args) < 1 {
			return nil, errors.New("index() takes at least 1 argument")
		}
		for i, it := range items {
			if valuesEqual(it, args[0]) {
				return int64(i), nil
			}
		}
		return nil, errors.New("value is not in list")
	case "copy":
		return append([]any{}, items...), nil
	}
	return nil, fmt.Errorf("list.%s is not supported", name)
}

// strKeywordMethods are the str methods that accept keyword arguments
// (Python 3.11); the others raise "takes no keyword arguments".
var strKeywordMethods = map[string]bool{"split": true, "rsplit": true, "splitlines": true, "format": true, "encode": true, "expandtabs": true}

// callStrMethod calls the str method name on s. The multi-line methods are
// functions of callStrMethod's own parameters, so the dispatch stays one
// uniform line per method.
func callStrMethod(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	if kw != nil && kw.Len() > 0 && !strKeywordMethods[name] {
		return nil, fmt.Errorf("str.%s() takes no keyword arguments", name)
	}
	switch name {
	case "strip", "lstrip", "rstrip":
		return strStrip(r, s, name, args, kw)
	case "split", "rsplit":
		return strSplit(r, s, name, args, kw)
	case "startswith", "endswith":
		return strStartsEnds(r, s, name, args, kw)
	case "replace":
		return strReplace(r, s, name, args, kw)
	case "upper":
		return pyUpper(s), nil
	case "lower":
		return pyLower(s), nil
	case "title":
		return pyTitle(s), nil
	case "capitalize":
		return pyCapitalize(s), nil
	case "swapcase":
		return strSwapcase(r, s, name, args, kw)
	case "casefold":
		return pyLower(s), nil
	case "find", "rfind", "index", "rindex", "count":
		return strFind(r, s, name, args, kw)
	case "join":
		return strJoin(r, s, name, args, kw)
	case "splitlines":
		return strSplitLines(r, s, name, args, kw)
	case "isdigit", "isdecimal", "isnumeric":
		return strAll(s, unicode.IsDigit), nil
	case "isalpha":
		return strAll(s, unicode.IsLetter), nil
	case "isalnum":
		return strAll(s, func(c rune) bool { return unicode.IsLetter(c) || unicode.IsDigit(c) }), nil
	case "isspace":
		return strAll(s, pyIsSpace), nil
	case "isascii":
		return strIsASCII(r, s, name, args, kw)
	case "islower", "isupper":
		return strIsCase(r, s, name, args, kw)
	case "removeprefix":
		return strRemovePrefix(r, s, name, args, kw)
	case "removesuffix":
		return strRemoveSuffix(r, s, name, args, kw)
	case "partition", "rpartition":
		return strPartition(r, s, name, args, kw)
	case "center", "ljust", "rjust", "zfill":
		return strJustify(r, s, name, args, kw)
	case "format":
		return pyFormat(s, args, kw)
	}
	return nil, fmt.Errorf("str.%s is not supported", name)
}

// strStrip is str.strip, lstrip and rstrip (chars: None or a str).
func strStrip(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	a, err := bindArgs(name, []string{"chars"}, []any{nil}, args, kw)
	if err != nil {
		return nil, err
	}
	pred, err := optChars(name, a[0])
	if err != nil {
		return nil, err
	}
	switch name {
	case "strip":
		return strings.TrimFunc(s, pred), nil
	case "lstrip":
		return strings.TrimLeftFunc(s, pred), nil
	}
	return strings.TrimRightFunc(s, pred), nil
}

// strSplit is str.split and str.rsplit.
func strSplit(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	a, err := bindArgs(name, []string{"sep", "maxsplit"}, []any{nil, int64(-1)}, args, kw)
	if err != nil {
		return nil, err
	}
	maxSplit, ok := intIndex(a[1])
	if !ok {
		return nil, errors.New("maxsplit must be an integer")
	}
	return pySplit(s, a[0], int(max(min(maxSplit, 1<<30), -1)), name == "rsplit")
}

// strStartsEnds is str.startswith and str.endswith: a str or tuple of str, optional start and end.
func strStartsEnds(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	if len(args) < 1 {
		return nil, fmt.Errorf("%s() takes at least 1 argument", name)
	}
	sub := s
	if len(args) > 1 {
		v, err := sliceValue(s, args[1], argOr(args, 2), nil)
		if err != nil {
			return nil, err
		}
		sub = v.(string)
	}
	var cands []any
	switch p := args[0].(type) {
	case string:
		cands = []any{p}
	case tuple:
		cands = p
	default:
		return nil, fmt.Errorf("%s first arg must be str or a tuple of str, not %s", name, typeName(args[0]))
	}
	for _, c := range cands {
		cs, ok := c.(string)
		if !ok {
			return nil, fmt.Errorf("tuple for %s must only contain str", name)
		}
		if (name == "startswith" && strings.HasPrefix(sub, cs)) || (name == "endswith" && strings.HasSuffix(sub, cs)) {
			return true, nil
		}
	}
	return false, nil
}

// strReplace is str.replace, sized against the output bound before it is built.
func strReplace(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	a, err := bindArgs(name, []string{"old", "new", "count"}, []any{required, required, int64(-1)}, args, kw)
	if err != nil {
		return nil, err
	}
	old, err := argString(name, a[0])
	if err != nil {
		return nil, err
	}
	nw, err := argString(name, a[1])
	if err != nil {
		return nil, err
	}
	n, ok := intIndex(a[2])
	if !ok {
		return nil, errors.New("replace() count must be an integer")
	}
	if n < 0 {
		n = -1
	}
	// Size the result before building it: "a"*N replaced by a long
	// string would otherwise allocate far past the bound first.
	if grow := len(nw) - len(old); grow > 0 {
		count := strings.Count(s, old)
		if old == "" {
			count = utf8.RuneCountInString(s) + 1
		}
		if n >= 0 {
			count = min(count, int(min(n, 1<<30)))
		}
		if count > 0 && int64(count) > int64(r.cfg.maxOutput-len(s))/int64(grow) {
			return nil, fmt.Errorf("%w: value larger than %d bytes", ErrLimit, r.cfg.maxOutput)
		}
	}
	res := strings.Replace(s, old, nw, int(min(n, 1<<30)))
	if err := r.build(len(res)); err != nil {
		return nil, err
	}
	return res, nil
}

// strSwapcase is str.swapcase.
func strSwapcase(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	var b strings.Builder
	for _, c := range s {
		switch {
		case unicode.IsUpper(c):
			b.WriteString(pyLower(string(c)))
		case unicode.IsLower(c):
			b.WriteString(pyUpper(string(c)))
		default:
			b.WriteRune(c)
		}
	}
	return b.String(), nil
}

// strFind is str.find, rfind, index, rindex and count (positions in code points).
func strFind(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	if len(args) < 1 {
		return nil, fmt.Errorf("%s() takes at least 1 argument", name)
	}
	sub, err := argString(name, args[0])
	if err != nil {
		return nil, err
	}
	var pos int
	switch name {
	case "count":
		if sub == "" {
			return int64(utf8.RuneCountInString(s) + 1), nil
		}
		return int64(strings.Count(s, sub)), nil
	case "find", "index":
		pos = strings.Index(s, sub)
	default:
		pos = strings.LastIndex(s, sub)
	}
	if pos < 0 {
		if name == "index" || name == "rindex" {
			return nil, errors.New("substring not found")
		}
		return int64(-1), nil
	}
	return int64(utf8.RuneCountInString(s[:pos])), nil
}

// strJoin is str.join, sized against the output bound before it is built.
func strJoin(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	if len(args) != 1 {
		return nil, errors.New("join() takes exactly one argument")
	}
	items, err := iterate(args[0])
	if err != nil {
		return nil, err
	}
	parts := make([]string, len(items))
	for i, it := range items {
		str, ok := it.(string)
		if !ok {
			return nil, fmt.Errorf("sequence item %d: expected str instance, %s found", i, typeName(it))
		}
		parts[i] = str
	}
	size := len(s) * max(len(parts)-1, 0)
	for _, p := range parts {
		size += len(p)
	}
	if err := r.build(size); err != nil { // before building it
		return nil, err
	}
	res := strings.Join(parts, s)
	if err := r.checkSize(len(res)); err != nil {
		return nil, err
	}
	return res, nil
}

// strSplitLines is str.splitlines.
func strSplitLines(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	a, err := bindArgs(name, []string{"keepends"}, []any{false}, args, kw)
	if err != nil {
		return nil, err
	}
	return pySplitLines(s, isTruthy(a[0])), nil
}

// strIsASCII is str.isascii.
func strIsASCII(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	for _, c := range s {
		if c > 0x7f {
			return false, nil
		}
	}
	return true, nil
}

// strIsCase is str.islower and str.isupper: true when there is a cased character and none of the other case.
func strIsCase(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	cased := false
	for _, c := range s {
		if unicode.IsUpper(c) || unicode.IsTitle(c) {
			if name == "islower" {
				return false, nil
			}
			cased = true
		} else if unicode.IsLower(c) {
			if name == "isupper" {
				return false, nil
			}
			cased = true
		}
	}
	return cased, nil
}

// strRemovePrefix is str.removeprefix.
func strRemovePrefix(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	if len(args) != 1 {
		return nil, errors.New("removeprefix() takes exactly one argument")
	}
	p, err := argString(name, args[0])
	if err != nil {
		return nil, err
	}
	return strings.TrimPrefix(s, p), nil
}

// strRemoveSuffix is str.removesuffix.
func strRemoveSuffix(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	if len(args) != 1 {
		return nil, errors.New("removesuffix() takes exactly one argument")
	}
	p, err := argString(name, args[0])
	if err != nil {
		return nil, err
	}
	return strings.TrimSuffix(s, p), nil
}

// strPartition is str.partition and str.rpartition.
func strPartition(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	if len(args) != 1 {
		return nil, fmt.Errorf("%s() takes exactly one argument", name)
	}
	sep, err := argString(name, args[0])
	if err != nil {
		return nil, err
	}
	if sep == "" {
		return nil, errors.New("empty separator")
	}
	i := strings.Index(s, sep)
	if name == "rpartition" {
		i = strings.LastIndex(s, sep)
	}
	if i < 0 {
		if name == "rpartition" {
			return tuple{"", "", s}, nil
		}
		return tuple{s, "", ""}, nil
	}
	return tuple{s[:i], sep, s[i+len(sep):]}, nil
}

// strJustify is str.center, ljust, rjust and zfill.
func strJustify(r *renderer, s, name string, args []any, kw *Dict) (any, error) {
	if len(args) < 1 {
		return nil, fmt.Errorf("%s() takes at least 1 argument", name)
	}
	w, ok := intIndex(args[0])
	if !ok {
		return nil, fmt.Errorf("%s() width must be an integer", name)
	}
	if err := r.build(int(min(w, 1<<31))); err != nil {
		return nil, err
	}
	fill := " "
	if name == "zfill" {
		fill = "0"
	} else if len(args) > 1 {
		f, err := argString(name, args[1])
		if err != nil || utf8.RuneCountInString(f) != 1 {
			return nil, errors.New("the fill character must be exactly one character long")
		}
		fill = f
	}
	n := utf8.RuneCountInString(s)
	pad := int(w) - n
	if pad <= 0 {
		return s, nil
	}
	switch name {
	case "ljust":
		return s + strings.Repeat(fill, pad), nil
	case "rjust":
		return strings.Repeat(fill, pad) + s, nil
	case "zfill":
		if strings.HasPrefix(s, "-") || strings.HasPrefix(s, "+") {
			return s[:1] + strings.Repeat("0", pad) + s[1:], nil
		}
		return strings.Repeat("0", pad) + s, nil
	}
	// CPython: left = marg/2 + (marg & width & 1).
	left := pad/2 + (pad & int(w) & 1)
	return strings.Repeat(fill, left) + s + strings.Repeat(fill, pad-left), nil
}

func argOr(args []any, i int) any {
	if i < len(args) {
		return args[i]
	}
	return nil
}

func strAll(s string, pred func(rune) bool) bool {
	if s == "" {
		return false
	}
	for _, c := range s {
		if !pred(c) {
			return false
		}
	}
	return true
}

// pySplit is Python's str.split / str.rsplit.
func pySplit(s string, sepArg any, maxSplit int, fromRight bool) (any, error) {
	var parts []string
	if sepArg == nil {
		parts = splitWhitespace(s, maxSplit, fromRight)
	} else {
		sep, ok := sepArg.(string)
		if !ok {
			return nil, fmt.Errorf("must be str or None, not %s", typeName(sepArg))
		}
		if sep == "" {
			return nil, errors.New("empty separator")
		}
		parts = splitSep(s, sep, maxSplit, fromRight)
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

// splitWhitespace is str.split() / str.rsplit() without a separator: runs of
// whitespace separate, and at most maxSplit splits (negative: no limit) are
// made from the left or, fromRight, from the right; the rest stays whole.
func splitWhitespace(s string, maxSplit int, fromRight bool) []string {
	fields := strings.FieldsFunc(s, pyIsSpace)
	if maxSplit < 0 || maxSplit >= len(fields) {
		return fields
	}
	var parts []string
	if !fromRight {
		// Split off maxSplit words, keep the rest (left-stripped) whole.
		rest := s
		for i := 0; i < maxSplit; i++ {
			rest = strings.TrimLeftFunc(rest, pyIsSpace)
			end := strings.IndexFunc(rest, pyIsSpace)
			parts = append(parts, rest[:end])
			rest = rest[end:]
		}
		rest = strings.TrimLeftFunc(rest, pyIsSpace)
		if rest != "" {
			parts = append(parts, rest)
		}
		return parts
	}
	rest := s
	var rev []string
	for i := 0; i < maxSplit; i++ {
		rest = strings.TrimRightFunc(rest, pyIsSpace)
		start := strings.LastIndexFunc(rest, pyIsSpace)
		rev = append(rev, rest[start+1:])
		rest = rest[:start+1]
	}
	rest = strings.TrimRightFunc(rest, pyIsSpace)
	if rest != "" {
		parts = append(parts, rest)
	}
	for i := len(rev) - 1; i >= 0; i-- {
		parts = append(parts, rev[i])
	}
	return parts
}

// splitSep is str.split(sep) / str.rsplit(sep) for a non-empty sep, with at
// most maxSplit splits (negative: no limit).
func splitSep(s, sep string, maxSplit int, fromRight bool) []string {
	switch {
	case maxSplit < 0:
		return strings.Split(s, sep)
	case !fromRight:
		return strings.SplitN(s, sep, maxSplit+1)
	}
	rest := s
	var rev []string
	for i := 0; i < maxSplit; i++ {
		j := strings.LastIndex(rest, sep)
		if j < 0 {
			break
		}
		rev = append(rev, rest[j+len(sep):])
		rest = rest[:j]
	}
	parts := []string{rest}
	for i := len(rev) - 1; i >= 0; i-- {
		parts = append(parts, rev[i])
	}
	return parts
}

// pySplitLines is Python's str.splitlines.
func pySplitLines(s string, keepEnds bool) []any {
	out := []any{}
	start := 0
	for i := 0; i < len(s); {
		c, size := utf8.DecodeRuneInString(s[i:])
		isBreak := false
		end := i + size
		switch c {
		case '\n', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			isBreak = true
		case '\r':
			isBreak = true
			if end < len(s) && s[end] == '\n' {
				end++
			}
		}
		if isBreak {
			if keepEnds {
				out = append(out, s[start:end])
			} else {
				out = append(out, s[start:i])
			}
			start = end
		}
		i = end
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// pyUpper and pyLower are Python's str.upper and str.lower: full Unicode
// case mappings (ß → SS, ﬁ → FI, final sigma), which Go's strings.ToUpper
// lacks. A Caser is stateful, so one is made per call; ASCII takes the
// fast path.
func pyUpper(s string) string {
	if isASCII(s) {
		return strings.ToUpper(s)
	}
	return cases.Upper(language.Und).String(s)
}

func pyLower(s string) string {
	if isASCII(s) {
		return strings.ToLower(s)
	}
	return cases.Lower(language.Und).String(s)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

func isCased(c rune) bool { return unicode.IsUpper(c) || unicode.IsLower(c) || unicode.IsTitle(c) }

// pyTitle is Python's str.title.
func pyTitle(s string) string {
	var b strings.Builder
	prevCased := false
	for _, c := range s {
		if prevCased {
			b.WriteString(pyLower(string(c)))
		} else {
			b.WriteRune(unicode.ToTitle(c))
		}
		prevCased = isCased(c)
	}
	return b.String()
}

// pyCapitalize is Python's str.capitalize.
func pyCapitalize(s string) string {
	if s == "" {
		return s
	}
	c, size := utf8.DecodeRuneInString(s)
	return string(unicode.ToTitle(c)) + pyLower(s[size:])
}
