package chattemplate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// maxInputDepth bounds nesting of converted inputs and of tojson output, so a
// hostile request cannot exhaust the stack.
const maxInputDepth = 200

// DecodeJSON decodes one JSON value the way Python's json.loads does: objects
// keep their key order (as *Dict), integers become int64 (larger ones
// float64), other numbers float64. Pass its result in ChatInput (tools,
// documents, message fields) when the template prints them with tojson, so the
// rendered key order matches vLLM's.
func DecodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := decodeJSONValue(dec, 0)
	if err != nil {
		return nil, fmt.Errorf("chattemplate: decode JSON: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("chattemplate: decode JSON: trailing data after value")
	}
	return v, nil
}

func decodeJSONValue(dec *json.Decoder, depth int) (any, error) {
	if depth > maxInputDepth {
		return nil, errors.New("nesting too deep")
	}
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			return decodeJSONObject(dec, depth)
		case '[':
			return decodeJSONArray(dec, depth)
		}
		return nil, fmt.Errorf("unexpected delimiter %q", t)
	case json.Number:
		return numberValue(string(t))
	default:
		return t, nil // string, bool, nil
	}
}

// decodeJSONObject reads the members of an object whose '{' was read, in
// document order, and its '}'.
func decodeJSONObject(dec *json.Decoder, depth int) (any, error) {
	d := NewDict()
	for dec.More() {
		kt, err := dec.Token()
		if err != nil {
			return nil, err
		}
		key, ok := kt.(string)
		if !ok {
			return nil, errors.New("object key is not a string")
		}
		v, err := decodeJSONValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		d.Set(key, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return d, nil
}

// decodeJSONArray reads the elements of an array whose '[' was read, and
// its ']'.
func decodeJSONArray(dec *json.Decoder, depth int) (any, error) {
	list := []any{}
	for dec.More() {
		v, err := decodeJSONValue(dec, depth+1)
		if err != nil {
			return nil, err
		}
		list = append(list, v)
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	return list, nil
}

// numberValue converts a JSON number literal as json.loads does.
func numberValue(lit string) (any, error) {
	if !strings.ContainsAny(lit, ".eE") {
		if i, err := strconv.ParseInt(lit, 10, 64); err == nil {
			return i, nil
		}
		// Python keeps big integers exact; int64 cannot, so keep the value
		// as a float (documented limitation).
		bf, ok := new(big.Float).SetString(lit)
		if !ok {
			return nil, fmt.Errorf("bad number %q", lit)
		}
		f, _ := bf.Float64()
		return f, nil
	}
	f, err := strconv.ParseFloat(lit, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return nil, fmt.Errorf("bad number %q", lit)
	}
	return f, nil
}

// toValue converts a caller-supplied Go value into the evaluator's types.
func toValue(v any, depth int) (any, error) {
	if depth > maxInputDepth {
		return nil, errors.New("input nesting too deep")
	}
	switch x := v.(type) {
	case nil, bool, int64, float64, string, undefined:
		return x, nil
	case int:
		return int64(x), nil
	case int32:
		return int64(x), nil
	case uint32:
		return int64(x), nil
	case float32:
		return float64(x), nil
	case json.Number:
		return numberValue(string(x))
	case json.RawMessage:
		return DecodeJSON(x)
	case *Dict:
		out := newDictCap(len(x.keys))
		for _, k := range x.keys {
			cv, err := toValue(x.val(k), depth+1)
			if err != nil {
				return nil, err
			}
			out.Set(k, cv)
		}
		return out, nil
	case map[string]any:
		out := newDictCap(len(x))
		for _, k := range sortedKeys(x) {
			cv, err := toValue(x[k], depth+1)
			if err != nil {
				return nil, err
			}
			out.Set(k, cv)
		}
		return out, nil
	case map[string]string:
		out := NewDict()
		for _, k := range sortedStringKeys(x) {
			out.Set(k, x[k])
		}
		return out, nil
	case []any:
		return toValueList(x, depth)
	case []map[string]any:
		return toValueList(x, depth)
	case []string:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = e
		}
		return out, nil
	}
	return reflectValue(v, depth)
}

// toValueList converts each element of xs, one level deeper.
func toValueList[T any](xs []T, depth int) (any, error) {
	out := make([]any, len(xs))
	for i, e := range xs {
		cv, err := toValue(e, depth+1)
		if err != nil {
			return nil, err
		}
		out[i] = cv
	}
	return out, nil
}

// reflectValue is toValue for the integer, float, string, bool, slice, map
// and pointer kinds it has no case for.
func reflectValue(v any, depth int) (any, error) {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		u := rv.Uint()
		if u > math.MaxInt64 {
			return float64(u), nil
		}
		return int64(u), nil
	case reflect.Float32, reflect.Float64:
		return rv.Float(), nil
	case reflect.String:
		return rv.String(), nil
	case reflect.Bool:
		return rv.Bool(), nil
	case reflect.Slice, reflect.Array:
		out := make([]any, rv.Len())
		for i := range out {
			cv, err := toValue(rv.Index(i).Interface(), depth+1)
			if err != nil {
				return nil, err
			}
			out[i] = cv
		}
		return out, nil
	case reflect.Map:
		if rv.Type().Key().Kind() != reflect.String {
			break
		}
		m := make(map[string]any, rv.Len())
		iter := rv.MapRange()
		for iter.Next() {
			m[iter.Key().String()] = iter.Value().Interface()
		}
		return toValue(m, depth)
	case reflect.Pointer:
		if rv.IsNil() {
			return nil, nil
		}
		return toValue(rv.Elem().Interface(), depth)
	}
	return nil, fmt.Errorf("unsupported input type %T", v)
}

func sortedStringKeys(m map[string]string) []string {
	g := make(map[string]any, len(m))
	for k := range m {
		g[k] = nil
	}
	return sortedKeys(g)
}

// jsonOptions are the arguments of transformers' tojson filter, which calls
// json.dumps(x, ensure_ascii=..., indent=..., separators=..., sort_keys=...).
type jsonOptions struct {
	ensureASCII bool
	indent      *string // nil: compact one-line layout
	itemSep     string
	keySep      string
	sortKeys    bool
}

// pyJSONDumps is Python's json.dumps with the given options.
func pyJSONDumps(v any, o jsonOptions) (string, error) {
	var b strings.Builder
	if err := writeJSON(&b, v, o, 0); err != nil {
		return "", err
	}
	return b.String(), nil
}

func writeJSON(b *strings.Builder, v any, o jsonOptions, level int) error {
	if level > maxInputDepth {
		return errors.New("tojson: nesting too deep")
	}
	switch x := v.(type) {
	case nil:
		b.WriteString("null")
	case bool:
		if x {
			b.WriteString("true")
		} else {
			b.WriteString("false")
		}
	case int64:
		b.WriteString(strconv.FormatInt(x, 10))
	case float64:
		switch {
		case math.IsNaN(x):
			b.WriteString("NaN")
		case math.IsInf(x, 1):
			b.WriteString("Infinity")
		case math.IsInf(x, -1):
			b.WriteString("-Infinity")
		default:
			b.WriteString(pyFloatRepr(x))
		}
	case string:
		writeJSONString(b, x, o.ensureASCII)
	case []any:
		return writeJSONList(b, x, o, level)
	case tuple:
		return writeJSONList(b, x, o, level)
	case *Dict:
		if x.Len() == 0 {
			b.WriteString("{}")
			return nil
		}
		keys := x.keys
		if o.sortKeys {
			keys = append([]string(nil), keys...)
			sortStrings(keys)
		}
		b.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				b.WriteString(o.itemSep)
			}
			writeJSONNewline(b, o, level+1)
			writeJSONString(b, k, o.ensureASCII)
			b.WriteString(o.keySep)
			if err := writeJSON(b, x.val(k), o, level+1); err != nil {
				return err
			}
		}
		writeJSONNewline(b, o, level)
		b.WriteByte('}')
	default:
		return fmt.Errorf("tojson: Object of type %s is not JSON serializable", typeName(v))
	}
	return nil
}

func writeJSONList(b *strings.Builder, items []any, o jsonOptions, level int) error {
	if len(items) == 0 {
		b.WriteString("[]")
		return nil
	}
	b.WriteByte('[')
	for i, e := range items {
		if i > 0 {
			b.WriteString(o.itemSep)
		}
		writeJSONNewline(b, o, level+1)
		if err := writeJSON(b, e, o, level+1); err != nil {
			return err
		}
	}
	writeJSONNewline(b, o, level)
	b.WriteByte(']')
	return nil
}

func writeJSONNewline(b *strings.Builder, o jsonOptions, level int) {
	if o.indent == nil {
		return
	}
	b.WriteByte('\n')
	for i := 0; i < level; i++ {
		b.WriteString(*o.indent)
	}
}

// writeJSONString escapes like Python's json encoder.
func writeJSONString(b *strings.Builder, s string, ensureASCII bool) {
	b.WriteByte('"')
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		i += size
		switch r {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		default:
			switch {
			case r < 0x20:
				fmt.Fprintf(b, `\u%04x`, r)
			case ensureASCII && r > 0x7e:
				if r > 0xffff {
					r -= 0x10000
					fmt.Fprintf(b, `\u%04x\u%04x`, 0xd800+(r>>10), 0xdc00+(r&0x3ff))
				} else {
					fmt.Fprintf(b, `\u%04x`, r)
				}
			default:
				b.WriteRune(r)
			}
		}
	}
	b.WriteByte('"')
}

func sortStrings(s []string) { sort.Strings(s) }

// PyJSONDumps is Python's json.dumps(v) with its defaults (ensure_ascii=True,
// separators ", " and ": ", keys in order): what vLLM's Anthropic conversion
// writes into a tool call's arguments (docs/tokenizer.md, "/v1/messages").
func PyJSONDumps(v any) (string, error) {
	return pyJSONDumps(v, jsonOptions{ensureASCII: true, itemSep: ", ", keySep: ": "})
}

// MarshalJSON encodes a value made of DecodeJSON's types (*Dict, []any,
// strings, int64, float64, bools, nil) as compact JSON, keeping key order, so
// a converted conversation can be handed on as a JSON body and decoded again
// unchanged.
func MarshalJSON(v any) ([]byte, error) {
	s, err := pyJSONDumps(v, jsonOptions{itemSep: ",", keySep: ":"})
	return []byte(s), err
}
