package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/dlclark/regexp2"
	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites text before pre-tokenization (HF "normalizer").
type normalizer interface {
	normalize(s string) string
}

type typed struct {
	Type string `json:"type"`
}

// patternJSON is HF's Pattern: {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type unicodeForm struct{ form norm.Form }

func (u unicodeForm) normalize(s string) string {
	out := u.form.String(s)
	if u.form == norm.NFC || u.form == norm.NFKC {
		out = composeRecent(out)
	} else {
		out = decomposeRecent(out)
	}
	return out
}

type lowercase struct{}

// normalize lowercases like Rust's str::to_lowercase (full Unicode mapping).
func (lowercase) normalize(s string) string { return strings.ToLower(s) }

type prepend struct{ prefix string }

// normalize prepends only to non-empty text, as HF does.
func (p prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return p.prefix + s
}

type replaceString struct{ old, new string }

func (r replaceString) normalize(s string) string { return strings.ReplaceAll(s, r.old, r.new) }

type replaceRegex struct {
	re  *regexp2.Regexp
	new string
}

func (r replaceRegex) normalize(s string) string {
	out, err := r.re.Replace(s, strings.ReplaceAll(r.new, "$", "$$"), -1, -1)
	if err != nil { // only a match timeout, and none is set
		return s
	}
	return out
}

type strip struct{ left, right bool }

func (st strip) normalize(s string) string {
	if st.left {
		s = strings.TrimLeftFunc(s, isWhiteSpace)
	}
	if st.right {
		s = strings.TrimRightFunc(s, isWhiteSpace)
	}
	return s
}

type normalizerSeq []normalizer

func (seq normalizerSeq) normalize(s string) string {
	for _, n := range seq {
		s = n.normalize(s)
	}
	return s
}

// parseReplace parses a Replace normalizer: a literal (non-empty) or a regex
// pattern.
func parseReplace(raw json.RawMessage) (normalizer, error) {
	var r struct {
		Pattern patternJSON `json:"pattern"`
		Content string      `json:"content"`
	}
	if err := json.Unmarshal(raw, &r); err != nil {
		return nil, fmt.Errorf("normalizer Replace: %w", err)
	}
	switch {
	case r.Pattern.String != nil:
		if *r.Pattern.String == "" {
			return nil, fmt.Errorf("normalizer Replace: empty pattern")
		}
		return replaceString{*r.Pattern.String, r.Content}, nil
	case r.Pattern.Regex != nil:
		re, err := regexp2.Compile(*r.Pattern.Regex, regexp2.None)
		if err != nil {
			return nil, fmt.Errorf("normalizer Replace regex: %w", err)
		}
		return replaceRegex{re, r.Content}, nil
	}
	return nil, fmt.Errorf("normalizer Replace: no pattern")
}

// parseNormalizerSeq parses a Sequence normalizer; a sequence of one is that
// one, and an empty one is none.
func parseNormalizerSeq(raw json.RawMessage) (normalizer, error) {
	var sq struct {
		Normalizers []json.RawMessage `json:"normalizers"`
	}
	if err := json.Unmarshal(raw, &sq); err != nil {
		return nil, fmt.Errorf("normalizer Sequence: %w", err)
	}
	var seq normalizerSeq
	for _, r := range sq.Normalizers {
		n, err := parseNormalizer(r)
		if err != nil {
			return nil, err
		}
		if n != nil {
			seq = append(seq, n)
		}
	}
	if len(seq) == 0 {
		return nil, nil
	}
	if len(seq) == 1 {
		return seq[0], nil
	}
	return seq, nil
}

// parseNormalizer builds the normalizer; nil JSON or null means none.
func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	if isNull(raw) {
		return nil, nil
	}
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return nil, fmt.Errorf("normalizer: %w", err)
	}
	switch t.Type {
	case "NFC":
		return unicodeForm{norm.NFC}, nil
	case "NFD":
		return unicodeForm{norm.NFD}, nil
	case "NFKC":
		return unicodeForm{norm.NFKC}, nil
	case "NFKD":
		return unicodeForm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "Prepend":
		var p struct {
			Prepend string `json:"prepend"`
		}
		if err := json.Unmarshal(raw, &p); err != nil {
			return nil, fmt.Errorf("normalizer Prepend: %w", err)
		}
		return prepend{p.Prepend}, nil
	case "Replace":
		return parseReplace(raw)
	case "Strip":
		var st struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return nil, fmt.Errorf("normalizer Strip: %w", err)
		}
		return strip{st.Left, st.Right}, nil
	case "Sequence":
		return parseNormalizerSeq(raw)
	}
	return nil, &UnsupportedError{Component: "normalizer", Type: t.Type}
}

func isNull(raw json.RawMessage) bool {
	s := strings.TrimSpace(string(raw))
	return s == "" || s == "null"
}
