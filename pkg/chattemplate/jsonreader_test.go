package chattemplate

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
)

// readAll decodes data as one value with the reader, as DecodeJSON does.
func readAll(data []byte) (any, error) {
	r := NewJSONReader(data)
	v, err := r.Value(0)
	if err != nil {
		return nil, err
	}
	return v, r.End()
}

// skipAll validates data as one value with the reader.
func skipAll(data []byte) error {
	r := NewJSONReader(data)
	if err := r.Skip(0); err != nil {
		return err
	}
	return r.End()
}

// checkReaderAgrees is the reader's contract: Skip accepts exactly what
// encoding/json accepts, and on valid input Value gives what DecodeJSON
// gives (both refuse nesting beyond maxInputDepth).
func checkReaderAgrees(t *testing.T, data []byte) {
	t.Helper()
	valid := json.Valid(data)
	if err := skipAll(data); (err == nil) != valid {
		t.Fatalf("Skip(%.80q) = %v, json.Valid = %v", data, err, valid)
	}
	got, gotErr := readAll(data)
	if !valid {
		if gotErr == nil {
			t.Fatalf("Value(%.80q) accepted invalid JSON", data)
		}
		return
	}
	want, wantErr := DecodeJSON(data)
	if (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("Value(%.80q) error %v, DecodeJSON error %v", data, gotErr, wantErr)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Value(%.80q) = %#v, DecodeJSON = %#v", data, got, want)
	}
}

func TestJSONReaderMatchesDecodeJSON(t *testing.T) {
	tests := []struct{ name, in string }{
		{"object keeps key order", `{"b":1,"a":{"z":[1,2.5,-0,1e3,"x"],"y":null}}`},
		{"repeated key keeps first place, last value", `{"a":1,"b":2,"a":3}`},
		{"whitespace everywhere", " \t\n{ \"a\" :\r [ 1 , { } , [ ] ] } \n"},
		{"escapes", `"\"\\\/\b\f\n\r\t\u0041\u00e9\u4e2d"`},
		{"surrogate pair", `"\ud83d\ude42"`},
		{"lone high surrogate", `"\ud83dx"`},
		{"lone low surrogate", `"\ude42"`},
		{"high surrogate then a non-low escape", `"\ud83d\u0041"`},
		{"two high surrogates", `"\ud83d\ud83d\ude42"`},
		{"invalid UTF-8", "\"a\xffb\xc3\""},
		{"UTF-8 encoded surrogate", "\"\xed\xa0\x80\""},
		{"raw unicode", `"café 東京 🙂"`},
		{"DEL byte", "\"\x7f\""},
		{"big integer", `123456789012345678901234567890`},
		{"int64 bounds", `[9223372036854775807,-9223372036854775808,9223372036854775808]`},
		{"float overflow", `1e400`},
		{"literals", `[true,false,null]`},
		{"empty containers", `[{},[],""]`},
		{"nested at the bound", strings.Repeat("[", maxInputDepth+1) + strings.Repeat("]", maxInputDepth+1)},
		{"nested over the bound", strings.Repeat("[", maxInputDepth+2) + strings.Repeat("]", maxInputDepth+2)},
		{"trailing comma in array", `[1,]`},
		{"trailing comma in object", `{"a":1,}`},
		{"missing colon", `{"a" 1}`},
		{"non-string key", `{1:2}`},
		{"leading zero", `01`},
		{"bare minus", `-`},
		{"dot without digits", `1.`},
		{"exponent without digits", `1e+`},
		{"plus sign", `+1`},
		{"control character in string", "\"a\x01\""},
		{"bad escape", `"\x"`},
		{"short unicode escape", `"\u12"`},
		{"unterminated string", `"abc`},
		{"unterminated escape", `"\`},
		{"truncated literal", `tru`},
		{"misspelt literal", `nul1`},
		{"two values", `1 2`},
		{"trailing garbage", `{} x`},
		{"empty input", ``},
		{"only whitespace", ` `},
		{"unclosed array", `[1`},
		{"unclosed object", `{"a":1`},
		{"close without open", `]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { checkReaderAgrees(t, []byte(tc.in)) })
	}
}

// TestJSONReaderSkipDepth: Skip takes the nesting encoding/json takes and
// no more.
func TestJSONReaderSkipDepth(t *testing.T) {
	for _, n := range []int{MaxSkipDepth - 1, MaxSkipDepth, MaxSkipDepth + 1} {
		data := []byte(strings.Repeat("[", n) + strings.Repeat("]", n))
		if err := skipAll(data); (err == nil) != json.Valid(data) {
			t.Errorf("depth %d: Skip error %v, json.Valid %v", n, err, json.Valid(data))
		}
	}
}

// TestJSONReaderObjectMap: a message object decodes as DecodeMessages
// gives it; a value that is not an object is left unread.
func TestJSONReaderObjectMap(t *testing.T) {
	in := `{"role":"user","content":[{"type":"text","text":"hi"}],"role":"assistant","n":1}`
	r := NewJSONReader([]byte(in))
	got, ok, err := r.ObjectMap(1)
	if err != nil || !ok {
		t.Fatalf("ObjectMap: ok %v, err %v", ok, err)
	}
	want, err := DecodeMessages([]byte("[" + in + "]"))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want[0]) {
		t.Fatalf("ObjectMap = %#v, DecodeMessages = %#v", got, want[0])
	}
	r = NewJSONReader([]byte(` "x"`))
	if _, ok, err := r.ObjectMap(1); ok || err != nil || r.Offset() != 1 {
		t.Fatalf("a string: ok %v, err %v, offset %d (want false, nil, 1)", ok, err, r.Offset())
	}
}

func FuzzJSONReader(f *testing.F) {
	for _, s := range []string{
		`{"a":[1,2.5,"x\u00e9\ud83d\ude42",null,true,{"b":{}}]}`,
		`[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"text","text":"yo"}]}]`,
		"\"\\ud83d\\u0041\xff\"",
		`[1e400,-0,01]`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) > 1<<16 {
			return
		}
		checkReaderAgrees(t, data)
	})
}
