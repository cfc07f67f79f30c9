package chattemplate

import (
	"fmt"
	"math"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The evaluator works on a small set of Go types that mirror the Python
// objects Jinja2 sees when transformers renders a chat template:
//
//	nil        None
//	bool       bool
//	int64      int
//	float64    float
//	string     str
//	[]any      list
//	tuple      tuple
//	*Dict      dict (insertion ordered, string keys)
//	undefined  jinja2.Undefined
//
// plus callables, namespaces and the loop object. Inputs are converted to
// these types once per render by toValue.

// undefined mirrors jinja2.Undefined: it prints as "", is falsy, iterates as
// empty, and fails on attribute access, item access, arithmetic and calls.
type undefined struct {
	// format and its arguments a, b describe the value for error
	// messages; they are formatted only when the value is misused.
	format string
	a, b   string
	unsafe bool // produced by the sandbox for a blocked attribute
}

func (u undefined) message() string {
	switch strings.Count(u.format, "%s") {
	case 0:
		return u.format
	case 1:
		return fmt.Sprintf(u.format, u.a)
	}
	return fmt.Sprintf(u.format, u.a, u.b)
}

func (u undefined) failure() error {
	if u.unsafe {
		return fmt.Errorf("security error: %s", u.message())
	}
	return fmt.Errorf("undefined error: %s", u.message())
}

// tuple is a Python tuple: like a list but printed with parentheses and never
// equal to a list.
type tuple []any

// Dict is an insertion-ordered mapping with string keys, the shape of a JSON
// object decoded by Python's json module. Use NewDict or DecodeJSON to build
// one when the key order of an input (for example a tool's JSON schema)
// matters to the rendered text; plain map[string]any inputs are read in
// sorted key order.
type Dict struct {
	keys []string
	vals []any
	// index maps keys to positions once the dict is large enough for
	// linear search to cost more than a map.
	index map[string]int
}

// dictIndexThreshold is the size from which a Dict keeps a hash index.
const dictIndexThreshold = 12

// NewDict returns an empty ordered dictionary.
func NewDict() *Dict { return &Dict{} }

func newDictCap(n int) *Dict { return &Dict{keys: make([]string, 0, n), vals: make([]any, 0, n)} }

func (d *Dict) find(key string) int {
	if d.index != nil {
		if i, ok := d.index[key]; ok {
			return i
		}
		return -1
	}
	for i, k := range d.keys {
		if k == key {
			return i
		}
	}
	return -1
}

// Set adds or replaces a key; a new key goes to the end, as in Python.
func (d *Dict) Set(key string, v any) {
	if i := d.find(key); i >= 0 {
		d.vals[i] = v
		return
	}
	d.keys = append(d.keys, key)
	d.vals = append(d.vals, v)
	switch {
	case d.index != nil:
		d.index[key] = len(d.keys) - 1
	case len(d.keys) >= dictIndexThreshold:
		d.index = make(map[string]int, len(d.keys)*2)
		for i, k := range d.keys {
			d.index[k] = i
		}
	}
}

// Get returns the value stored under key.
func (d *Dict) Get(key string) (any, bool) {
	if i := d.find(key); i >= 0 {
		return d.vals[i], true
	}
	return nil, false
}

// val returns the value under key, or nil when absent.
func (d *Dict) val(key string) any {
	if i := d.find(key); i >= 0 {
		return d.vals[i]
	}
	return nil
}

// Keys returns the keys in insertion order.
func (d *Dict) Keys() []string { return append([]string(nil), d.keys...) }

// Len is the number of keys.
func (d *Dict) Len() int { return len(d.keys) }

func (d *Dict) clone() *Dict {
	n := newDictCap(len(d.keys))
	for i, k := range d.keys {
		n.Set(k, d.vals[i])
	}
	return n
}

// generator is a Python iterator returned by filters such as select, map,
// items and reverse: always truthy, no len(), not subscriptable, and
// consumed by iteration (a second loop over it sees nothing).
type generator struct {
	name  string // Python type shown in messages: "generator", "list_reverseiterator"
	items []any
	pos   int
}

func newGenerator(name string, items []any) *generator { return &generator{name: name, items: items} }

// next consumes and returns the next item.
func (g *generator) next() (any, bool) {
	if g.pos >= len(g.items) {
		return nil, false
	}
	g.pos++
	return g.items[g.pos-1], true
}

// drain consumes the rest.
func (g *generator) drain() []any {
	rest := g.items[g.pos:]
	g.pos = len(g.items)
	return rest
}

// dictView is dict.items(), dict.keys() or dict.values(): sized and
// repeatable but not subscriptable.
type dictView struct {
	kind  string // "dict_items", "dict_keys", "dict_values"
	items []any
}

// namespace is the mutable object returned by namespace().
type namespace struct{ attrs *Dict }

// isTruthy follows Python truth testing.
func isTruthy(v any) bool {
	switch x := v.(type) {
	case nil:
		return false
	case bool:
		return x
	case int64:
		return x != 0
	case float64:
		return x != 0
	case string:
		return x != ""
	case []any:
		return len(x) > 0
	case tuple:
		return len(x) > 0
	case *Dict:
		return x.Len() > 0
	case *dictView:
		return len(x.items) > 0
	case undefined:
		return false
	default:
		return true
	}
}

// typeName is Python's type(x).__name__, used in error messages.
func typeName(v any) string {
	switch x := v.(type) {
	case nil:
		return "NoneType"
	case bool:
		return "bool"
	case int64:
		return "int"
	case float64:
		return "float"
	case string:
		return "str"
	case []any:
		return "list"
	case tuple:
		return "tuple"
	case *Dict:
		return "dict"
	case undefined:
		return "Undefined"
	case *namespace:
		return "Namespace"
	case *loopObject:
		return "LoopContext"
	case *generator:
		return x.name
	case *dictView:
		return x.kind
	default:
		return "function"
	}
}

// pyStr is Python's str(x) as Jinja2 prints a value.
func pyStr(v any) string {
	switch x := v.(type) {
	case string:
		return x
	case undefined:
		return ""
	case nil:
		return "None"
	case bool:
		if x {
			return "True"
		}
		return "False"
	case int64:
		return strconv.FormatInt(x, 10)
	case float64:
		return pyFloatRepr(x)
	default:
		var b strings.Builder
		writeRepr(&b, v)
		return b.String()
	}
}

// maxReprDepth bounds recursion when printing or comparing nested values
// (Python would raise RecursionError around this depth).
const maxReprDepth = 1000

// writeRepr writes Python's repr(x).
func writeRepr(b *strings.Builder, v any) { writeReprDepth(b, v, 0) }

func writeReprDepth(b *strings.Builder, v any, depth int) {
	if depth > maxReprDepth {
		b.WriteString("...")
		return
	}
	switch x := v.(type) {
	case string:
		writeStrRepr(b, x)
	case []any:
		b.WriteByte('[')
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			writeReprDepth(b, e, depth+1)
		}
		b.WriteByte(']')
	case tuple:
		b.WriteByte('(')
		for i, e := range x {
			if i > 0 {
				b.WriteString(", ")
			}
			writeReprDepth(b, e, depth+1)
		}
		if len(x) == 1 {
			b.WriteByte(',')
		}
		b.WriteByte(')')
	case *Dict:
		b.WriteByte('{')
		for i, k := range x.keys {
			if i > 0 {
				b.WriteString(", ")
			}
			writeStrRepr(b, k)
			b.WriteString(": ")
			writeReprDepth(b, x.val(k), depth+1)
		}
		b.WriteByte('}')
	case *namespace:
		b.WriteString("<Namespace ")
		writeReprDepth(b, x.attrs, depth+1)
		b.WriteByte('>')
	case undefined:
		b.WriteString("Undefined")
	case *generator:
		// Python prints an address here; renders that print a generator
		// cannot be reproduced byte for byte by any engine.
		fmt.Fprintf(b, "<%s object at 0x7f0000000000>", x.name)
	case *dictView:
		b.WriteString(x.kind)
		b.WriteString("([")
		for i, e := range x.items {
			if i > 0 {
				b.WriteString(", ")
			}
			writeReprDepth(b, e, depth+1)
		}
		b.WriteString("])")
	case nil, bool, int64, float64:
		b.WriteString(pyStr(v))
	default:
		fmt.Fprintf(b, "<%s>", typeName(v))
	}
}

// writeStrRepr writes Python's repr of a str.
func writeStrRepr(b *strings.Builder, s string) {
	quote := byte('\'')
	if strings.IndexByte(s, '\'') >= 0 && strings.IndexByte(s, '"') < 0 {
		quote = '"'
	}
	b.WriteByte(quote)
	for _, r := range s {
		switch {
		case r == rune(quote) || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case r < 0x20 || r == 0x7f:
			fmt.Fprintf(b, `\x%02x`, r)
		case r < 0x7f:
			b.WriteRune(r)
		case !unicode.IsPrint(r) || r == utf8.RuneError:
			switch {
			case r <= 0xff:
				fmt.Fprintf(b, `\x%02x`, r)
			case r <= 0xffff:
				fmt.Fprintf(b, `\u%04x`, r)
			default:
				fmt.Fprintf(b, `\U%08x`, r)
			}
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte(quote)
}

// pyFloatRepr is Python's repr(float): the shortest round-tripping digits,
// positional for exponents in [-4, 16), scientific otherwise, and always
// with a fractional part or exponent.
func pyFloatRepr(f float64) string {
	switch {
	case math.IsNaN(f):
		return "nan"
	case math.IsInf(f, 1):
		return "inf"
	case math.IsInf(f, -1):
		return "-inf"
	}
	s := strconv.FormatFloat(f, 'e', -1, 64) // d.ddddde±XX
	neg := false
	if s[0] == '-' {
		neg = true
		s = s[1:]
	}
	mant, expStr, _ := strings.Cut(s, "e")
	exp, _ := strconv.Atoi(expStr)
	digits := strings.Replace(mant, ".", "", 1)
	var out string
	if exp >= -4 && exp < 16 {
		out = positionalDigits(digits, exp)
	} else {
		m := digits[:1]
		if len(digits) > 1 {
			m += "." + digits[1:]
		}
		sign := "+"
		if exp < 0 {
			sign = "-"
			exp = -exp
		}
		out = fmt.Sprintf("%se%s%02d", m, sign, exp)
	}
	if neg {
		return "-" + out
	}
	return out
}

// positionalDigits writes the shortest digits of a float with decimal
// exponent exp (-4 <= exp < 16) without an exponent, as repr does: at least
// one digit after the point.
func positionalDigits(digits string, exp int) string {
	if exp < 0 {
		return "0." + strings.Repeat("0", -exp-1) + digits
	}
	if len(digits) <= exp+1 {
		return digits + strings.Repeat("0", exp+1-len(digits)) + ".0"
	}
	return digits[:exp+1] + "." + digits[exp+1:]
}

// valuesEqual is Python ==.
func valuesEqual(a, b any) bool { return valuesEqualDepth(a, b, 0) }

func valuesEqualDepth(a, b any, depth int) bool {
	if depth > maxReprDepth {
		return false
	}
	if na, ok := numeric(a); ok {
		if nb, ok := numeric(b); ok {
			return na.eq(nb)
		}
		return false
	}
	switch x := a.(type) {
	case nil:
		return b == nil
	case string:
		y, ok := b.(string)
		return ok && x == y
	case []any:
		y, ok := b.([]any)
		return ok && seqEqual(x, y, depth)
	case tuple:
		y, ok := b.(tuple)
		return ok && seqEqual(x, y, depth)
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || x.Len() != y.Len() {
			return false
		}
		for _, k := range x.keys {
			yv, ok := y.Get(k)
			if !ok || !valuesEqualDepth(x.val(k), yv, depth+1) {
				return false
			}
		}
		return true
	case undefined:
		_, ok := b.(undefined)
		return ok
	default:
		return identical(a, b)
	}
}

// identical is Python's "is" for the remaining kinds of values (functions,
// methods, namespaces, iterators). It never panics on uncomparable values.
func identical(a, b any) bool {
	if ma, ok := a.(boundMethod); ok {
		mb, ok := b.(boundMethod)
		return ok && ma.name == mb.name && identical(ma.recv, mb.recv)
	}
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	if !va.IsValid() || !vb.IsValid() {
		return !va.IsValid() && !vb.IsValid()
	}
	if va.Type() != vb.Type() {
		return false
	}
	if va.Kind() == reflect.Slice {
		return va.Len() == vb.Len() && va.Pointer() == vb.Pointer()
	}
	if va.Comparable() && vb.Comparable() {
		return a == b
	}
	return false
}

func seqEqual(a, b []any, depth int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !valuesEqualDepth(a[i], b[i], depth+1) {
			return false
		}
	}
	return true
}

// number is an int or float operand (bool counts as int, as in Python).
type number struct {
	isFloat bool
	i       int64
	f       float64
}

func numeric(v any) (number, bool) {
	switch x := v.(type) {
	case bool:
		if x {
			return number{i: 1}, true
		}
		return number{}, true
	case int64:
		return number{i: x}, true
	case float64:
		return number{isFloat: true, f: x}, true
	}
	return number{}, false
}

func (n number) float() float64 {
	if n.isFloat {
		return n.f
	}
	return float64(n.i)
}

func (n number) eq(o number) bool {
	if !n.isFloat && !o.isFloat {
		return n.i == o.i
	}
	return n.float() == o.float()
}

// compareValues orders two values as Python's < does; ok is false when the
// types cannot be ordered.
func compareValues(a, b any) (int, bool) { return compareValuesDepth(a, b, 0) }

func compareValuesDepth(a, b any, depth int) (int, bool) {
	if depth > maxReprDepth {
		return 0, false
	}
	if na, ok := numeric(a); ok {
		nb, ok := numeric(b)
		if !ok {
			return 0, false
		}
		if !na.isFloat && !nb.isFloat {
			return cmpInt(na.i, nb.i), true
		}
		fa, fb := na.float(), nb.float()
		switch {
		case fa < fb:
			return -1, true
		case fa > fb:
			return 1, true
		}
		return 0, true
	}
	switch x := a.(type) {
	case string:
		y, ok := b.(string)
		if !ok {
			return 0, false
		}
		return strings.Compare(x, y), true
	case []any:
		y, ok := b.([]any)
		if !ok {
			return 0, false
		}
		return compareSeq(x, y, depth)
	case tuple:
		y, ok := b.(tuple)
		if !ok {
			return 0, false
		}
		return compareSeq(x, y, depth)
	}
	return 0, false
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

func compareSeq(a, b []any, depth int) (int, bool) {
	for i := 0; i < len(a) && i < len(b); i++ {
		if valuesEqual(a[i], b[i]) {
			continue
		}
		return compareValuesDepth(a[i], b[i], depth+1)
	}
	return cmpInt(int64(len(a)), int64(len(b))), true
}

// iterate returns the items a Python for loop would visit.
func iterate(v any) ([]any, error) {
	switch x := v.(type) {
	case []any:
		return x, nil
	case tuple:
		return x, nil
	case *Dict:
		out := make([]any, len(x.keys))
		for i, k := range x.keys {
			out[i] = k
		}
		return out, nil
	case string:
		out := make([]any, 0, len(x))
		for _, r := range x {
			out = append(out, string(r))
		}
		return out, nil
	case undefined:
		if x.unsafe {
			return nil, x.failure()
		}
		return nil, nil
	case *generator:
		return x.drain(), nil
	case *dictView:
		return x.items, nil
	case *namespace:
		return nil, fmt.Errorf("'Namespace' object is not iterable")
	}
	return nil, fmt.Errorf("'%s' object is not iterable", typeName(v))
}

// length is Python's len().
func length(v any) (int, error) {
	switch x := v.(type) {
	case string:
		return utf8.RuneCountInString(x), nil
	case []any:
		return len(x), nil
	case tuple:
		return len(x), nil
	case *Dict:
		return x.Len(), nil
	case *dictView:
		return len(x.items), nil
	case undefined:
		return 0, nil
	}
	return 0, fmt.Errorf("object of type '%s' has no len()", typeName(v))
}

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(r rune) bool {
	return unicode.IsSpace(r) || (r >= 0x1c && r <= 0x1f)
}

// sortedKeys returns map keys sorted, for deterministic conversion of Go maps.
func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
