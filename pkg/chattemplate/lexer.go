package chattemplate

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// The lexer follows jinja2/lexer.py (Jinja2 3.1) with the settings
// transformers uses: trim_blocks=True, lstrip_blocks=True,
// keep_trailing_newline=False, default delimiters.

type tokenKind int

const (
	tokEOF tokenKind = iota
	tokData
	tokVarBegin
	tokVarEnd
	tokBlockBegin
	tokBlockEnd
	tokName
	tokString
	tokInt
	tokFloat
	tokOp
)

var tokenKindNames = [...]string{"end of template", "template data", "'{{'", "'}}'", "'{%'", "'%}'", "name", "string", "integer", "float", "operator"}

func (k tokenKind) String() string { return tokenKindNames[k] }

type token struct {
	kind tokenKind
	val  string // name, operator, decoded string or data text
	num  any    // int64 or float64 for numbers
	line int
}

// SyntaxError reports a template that cannot be lexed or parsed.
type SyntaxError struct {
	Line int
	Msg  string
}

func (e *SyntaxError) Error() string {
	return fmt.Sprintf("chattemplate: syntax error at line %d: %s", e.Line, e.Msg)
}

type lexer struct {
	src  string
	pos  int
	toks []token
	// lineAtPos caches the line of linePos so positions, which only grow,
	// are counted once.
	linePos, lineNum int
}

func lineAt(src string, pos int) int { return strings.Count(src[:pos], "\n") + 1 }

// tokenize converts template source into tokens.
func tokenize(source string) ([]token, error) {
	// Newlines are normalised to "\n" and one trailing newline is dropped
	// (keep_trailing_newline=False).
	src := strings.ReplaceAll(source, "\r\n", "\n")
	src = strings.ReplaceAll(src, "\r", "\n")
	src = strings.TrimSuffix(src, "\n")
	lx := &lexer{src: src, lineNum: 1}
	if err := lx.run(); err != nil {
		return nil, err
	}
	lx.toks = append(lx.toks, token{kind: tokEOF, line: lineAt(src, len(src))})
	return lx.toks, nil
}

func (lx *lexer) fail(pos int, format string, args ...any) error {
	return &SyntaxError{Line: lineAt(lx.src, pos), Msg: fmt.Sprintf(format, args...)}
}

func (lx *lexer) lineOf(pos int) int {
	if pos < lx.linePos {
		return lineAt(lx.src, pos)
	}
	lx.lineNum += strings.Count(lx.src[lx.linePos:pos], "\n")
	lx.linePos = pos
	return lx.lineNum
}

func (lx *lexer) emit(kind tokenKind, val string, pos int) {
	lx.toks = append(lx.toks, token{kind: kind, val: val, line: lx.lineOf(pos)})
}

// pyRStrip is Python's str.rstrip() with no arguments.
func pyRStrip(s string) string {
	return strings.TrimRightFunc(s, pyIsSpace)
}

func allPySpace(s string) bool {
	if s == "" {
		return false
	}
	for _, r := range s {
		if !pyIsSpace(r) {
			return false
		}
	}
	return true
}

func (lx *lexer) run() error {
	src := lx.src
	for lx.pos < len(src) {
		start := lx.pos
		idx := findTagOpen(src, start)
		if idx < 0 {
			lx.emit(tokData, src[start:], start)
			lx.pos = len(src)
			return nil
		}
		kind := src[idx+1]
		openEnd := idx + 2
		sign := byte(0)
		if openEnd < len(src) && (src[openEnd] == '-' || src[openEnd] == '+') {
			sign = src[openEnd]
			openEnd++
		}
		isRaw := false
		rawBodyStart := 0
		if kind == '%' {
			rawBodyStart, isRaw = matchRawBegin(src, openEnd)
		}
		// lstrip_blocks applies to block and comment tags, not to {{.
		text := trimBeforeTag(src[start:idx], sign, kind != '{', start == 0 || src[start-1] == '\n')
		if text != "" {
			lx.emit(tokData, text, start)
		}
		if err := lx.lexOpened(kind, idx, openEnd, isRaw, rawBodyStart); err != nil {
			return err
		}
	}
	return nil
}

// findTagOpen is the index of the earliest tag opener ({{, {% or {#) at or
// after start, -1 when there is none.
func findTagOpen(src string, start int) int {
	for i := start; i+1 < len(src); i++ {
		if src[i] == '{' && (src[i+1] == '{' || src[i+1] == '%' || src[i+1] == '#') {
			return i
		}
	}
	return -1
}

// trimBeforeTag applies whitespace control to the data text before a tag
// whose opener carries sign: '-' strips all trailing whitespace; without '+',
// lstrip (lstrip_blocks) drops the spaces between the last line start and the
// tag. lineStarting: text begins a line.
func trimBeforeTag(text string, sign byte, lstrip, lineStarting bool) string {
	switch {
	case sign == '-':
		return pyRStrip(text)
	case sign != '+' && lstrip:
		lpos := strings.LastIndexByte(text, '\n') + 1
		if (lpos > 0 || lineStarting) && allPySpace(text[lpos:]) {
			return text[:lpos]
		}
	}
	return text
}

// lexOpened lexes the tag of the given kind opened at idx, whose content
// starts at openEnd (a raw block's body at rawBodyStart).
func (lx *lexer) lexOpened(kind byte, idx, openEnd int, isRaw bool, rawBodyStart int) error {
	switch {
	case isRaw:
		return lx.lexRaw(rawBodyStart)
	case kind == '#':
		return lx.lexComment(openEnd)
	case kind == '{':
		lx.emit(tokVarBegin, "", idx)
		return lx.lexTag(openEnd, false)
	default:
		lx.emit(tokBlockBegin, "", idx)
		return lx.lexTag(openEnd, true)
	}
}

// matchRawBegin matches `\s*raw\s*(-%}\s*|%})` at pos.
func matchRawBegin(src string, pos int) (int, bool) {
	p := skipPySpace(src, pos)
	if !strings.HasPrefix(src[p:], "raw") {
		return 0, false
	}
	p = skipPySpace(src, p+3)
	if strings.HasPrefix(src[p:], "-%}") {
		return skipPySpace(src, p+3), true
	}
	if strings.HasPrefix(src[p:], "%}") {
		return p + 2, true
	}
	return 0, false
}

func skipPySpace(src string, pos int) int {
	for pos < len(src) {
		r, size := utf8.DecodeRuneInString(src[pos:])
		if !pyIsSpace(r) {
			break
		}
		pos += size
	}
	return pos
}

// matchBlockEnd matches `+%}`, `-%}\s*` or `%}\n?` (trim_blocks) at pos.
func matchBlockEnd(src string, pos int, closer string) (int, bool) {
	switch {
	case strings.HasPrefix(src[pos:], "+"+closer):
		return pos + 3, true
	case strings.HasPrefix(src[pos:], "-"+closer):
		return skipPySpace(src, pos+3), true
	case strings.HasPrefix(src[pos:], closer):
		end := pos + 2
		if end < len(src) && src[end] == '\n' {
			end++
		}
		return end, true
	}
	return 0, false
}

func (lx *lexer) lexComment(pos int) error {
	src := lx.src
	for i := pos; i < len(src); i++ {
		if end, ok := matchBlockEnd(src, i, "#}"); ok {
			lx.pos = end
			return nil
		}
	}
	return lx.fail(pos, "missing end of comment tag")
}

func (lx *lexer) lexRaw(pos int) error {
	src := lx.src
	for i := pos; i+1 < len(src); i++ {
		if src[i] != '{' || src[i+1] != '%' {
			continue
		}
		p := i + 2
		sign := byte(0)
		if p < len(src) && (src[p] == '-' || src[p] == '+') {
			sign = src[p]
			p++
		}
		p = skipPySpace(src, p)
		if !strings.HasPrefix(src[p:], "endraw") {
			continue
		}
		p = skipPySpace(src, p+6)
		end, ok := matchBlockEnd(src, p, "%}")
		if !ok {
			continue
		}
		text := trimBeforeTag(src[pos:i], sign, true, pos == 0 || src[pos-1] == '\n')
		if text != "" {
			lx.emit(tokData, text, pos)
		}
		lx.pos = end
		return nil
	}
	return lx.fail(pos, "missing end of raw directive")
}

var operators3 = []string{"//", "**", "==", "!=", ">=", "<="}

const singleOps = "+-/*%~[](){}><=.:|,;"

func (lx *lexer) lexTag(pos int, block bool) error {
	src := lx.src
	var balance []byte
	for {
		if pos >= len(src) {
			if block {
				return lx.fail(pos, "unexpected end of template, expected '%%}'")
			}
			return lx.fail(pos, "unexpected end of template, expected '}}'")
		}
		if len(balance) == 0 && lx.closeTag(pos, block) {
			return nil
		}
		r, size := utf8.DecodeRuneInString(src[pos:])
		var err error
		switch {
		case pyIsSpace(r):
			pos += size
		case r >= '0' && r <= '9':
			pos, err = lx.lexNumberToken(pos)
		case r == '_' || unicode.IsLetter(r):
			end := scanName(src, pos)
			lx.emit(tokName, src[pos:end], pos)
			pos = end
		case r == '\'' || r == '"':
			end, val, serr := lexString(src, pos)
			if serr != nil {
				return lx.fail(pos, "%v", serr)
			}
			lx.emit(tokString, val, pos)
			pos = end
		default:
			pos, err = lx.lexOperator(pos, r, &balance)
		}
		if err != nil {
			return err
		}
	}
}

// closeTag emits the end of the tag when one (%} of a block, }} of a
// variable, with their whitespace control) is at pos; it reports whether it
// did.
func (lx *lexer) closeTag(pos int, block bool) bool {
	src := lx.src
	if block {
		end, ok := matchBlockEnd(src, pos, "%}")
		if ok {
			lx.emit(tokBlockEnd, "", pos)
			lx.pos = end
		}
		return ok
	}
	if strings.HasPrefix(src[pos:], "-}}") {
		lx.emit(tokVarEnd, "", pos)
		lx.pos = skipPySpace(src, pos+3)
		return true
	}
	if strings.HasPrefix(src[pos:], "}}") {
		lx.emit(tokVarEnd, "", pos)
		lx.pos = pos + 2
		return true
	}
	return false
}

// lexNumberToken emits the number literal at pos and returns its end.
func (lx *lexer) lexNumberToken(pos int) (int, error) {
	end, val, err := lexNumber(lx.src, pos)
	if err != nil {
		return 0, lx.fail(pos, "%v", err)
	}
	kind := tokInt
	if _, ok := val.(float64); ok {
		kind = tokFloat
	}
	lx.toks = append(lx.toks, token{kind: kind, val: lx.src[pos:end], num: val, line: lx.lineOf(pos)})
	return end, nil
}

// scanName is the end of the identifier starting at pos.
func scanName(src string, pos int) int {
	end := pos
	for end < len(src) {
		r, size := utf8.DecodeRuneInString(src[end:])
		if r != '_' && !unicode.IsLetter(r) && !unicode.IsDigit(r) {
			break
		}
		end += size
	}
	return end
}

// lexOperator emits the operator at pos (r is its first rune), keeping
// bracket balance, and returns its end.
func (lx *lexer) lexOperator(pos int, r rune, balance *[]byte) (int, error) {
	src := lx.src
	op := ""
	for _, o := range operators3 {
		if strings.HasPrefix(src[pos:], o) {
			op = o
			break
		}
	}
	if op == "" && strings.IndexByte(singleOps, src[pos]) >= 0 {
		op = src[pos : pos+1]
	}
	if op == "" {
		return 0, lx.fail(pos, "unexpected char %q", r)
	}
	b := *balance
	switch op {
	case "(":
		b = append(b, ')')
	case "[":
		b = append(b, ']')
	case "{":
		b = append(b, '}')
	case ")", "]", "}":
		if len(b) == 0 {
			return 0, lx.fail(pos, "unexpected '%s'", op)
		}
		want := b[len(b)-1]
		b = b[:len(b)-1]
		if want != op[0] {
			return 0, lx.fail(pos, "unexpected '%s', expected '%c'", op, want)
		}
	}
	*balance = b
	lx.emit(tokOp, op, pos)
	return pos + len(op), nil
}

// lexNumber reads an integer or float literal as Jinja's float_re and
// integer_re do (underscores allowed between digits; 0b/0o/0x prefixes).
func lexNumber(src string, pos int) (int, any, error) {
	end, v, ok, err := lexPrefixedInt(src, pos)
	if err != nil {
		return 0, nil, err
	}
	if ok {
		return end, v, nil
	}
	end = scanDigits(src, pos, isDecDigit)
	isFloat := false
	// Fractional part and exponent, unless the number follows a dot (foo.0.1).
	if afterDot := pos > 0 && src[pos-1] == '.'; !afterDot {
		end, isFloat = floatTail(src, end)
	}
	lit := strings.ReplaceAll(src[pos:end], "_", "")
	if isFloat {
		f, err := strconv.ParseFloat(lit, 64)
		// Python gives inf for overflowing literals.
		if err != nil && !errors.Is(err, strconv.ErrRange) {
			return 0, nil, fmt.Errorf("bad float literal %s", lit)
		}
		return end, f, nil
	}
	// Jinja2's integer_re does not accept leading zeros ("01" lexes as 0, 1).
	if lit[0] == '0' {
		p := pos + 1
		for p < len(src) && (src[p] == '0' || (src[p] == '_' && p+1 < len(src) && src[p+1] == '0')) {
			p++
		}
		return p, int64(0), nil
	}
	n, err := strconv.ParseInt(lit, 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("integer literal out of range: %s", lit)
	}
	return end, n, nil
}

func isDecDigit(c byte) bool { return c >= '0' && c <= '9' }

// scanDigits matches (d+_)*d+ of the digits ok accepts at p: the end, or -1
// when there is no digit.
func scanDigits(src string, p int, ok func(byte) bool) int {
	start := p
	for p < len(src) && ok(src[p]) {
		p++
		if p+1 < len(src) && src[p] == '_' && ok(src[p+1]) {
			p++
		}
	}
	if p == start {
		return -1
	}
	return p
}

// lexPrefixedInt reads a 0b/0o/0x literal at pos; ok false (and no error)
// when there is none, and the caller reads a decimal number instead.
func lexPrefixedInt(src string, pos int) (end int, v int64, ok bool, err error) {
	if src[pos] != '0' || pos+1 >= len(src) {
		return 0, 0, false, nil
	}
	base := 0
	var digit func(byte) bool
	switch src[pos+1] {
	case 'b', 'B':
		base, digit = 2, func(c byte) bool { return c == '0' || c == '1' }
	case 'o', 'O':
		base, digit = 8, func(c byte) bool { return c >= '0' && c <= '7' }
	case 'x', 'X':
		base, digit = 16, func(c byte) bool {
			return isDecDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F')
		}
	default:
		return 0, 0, false, nil
	}
	p := pos + 2
	if p < len(src) && src[p] == '_' {
		p++
	}
	end = scanDigits(src, p, digit)
	if end <= 0 {
		return 0, 0, false, nil
	}
	v, perr := strconv.ParseInt(strings.ReplaceAll(src[pos+2:end], "_", ""), base, 64)
	if perr != nil {
		return 0, 0, false, fmt.Errorf("integer literal out of range: %s", src[pos:end])
	}
	return end, v, true, nil
}

// floatTail extends the digits ending at end by a fractional part and an
// exponent; isFloat reports whether there was either.
func floatTail(src string, end int) (int, bool) {
	isFloat := false
	if end+1 < len(src) && src[end] == '.' && isDecDigit(src[end+1]) {
		end = scanDigits(src, end+1, isDecDigit)
		isFloat = true
	}
	if end < len(src) && (src[end] == 'e' || src[end] == 'E') {
		p := end + 1
		if p < len(src) && (src[p] == '+' || src[p] == '-') {
			p++
		}
		if e := scanDigits(src, p, isDecDigit); e > 0 {
			end = e
			isFloat = true
		}
	}
	return end, isFloat
}

// lexString reads a quoted string and decodes it as Python's
// "unicode-escape" codec does (which is what Jinja2 applies).
func lexString(src string, pos int) (int, string, error) {
	quote := src[pos]
	i := pos + 1
	for i < len(src) {
		switch src[i] {
		case '\\':
			i += 2
			continue
		case quote:
			return i + 1, unescapePython(src[pos+1 : i]), nil
		}
		i++
	}
	return 0, "", fmt.Errorf("unterminated string")
}

func unescapePython(s string) string {
	if strings.IndexByte(s, '\\') < 0 {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		c := s[i]
		if c != '\\' || i+1 >= len(s) {
			b.WriteByte(c)
			i++
			continue
		}
		e := s[i+1]
		i += 2
		switch e {
		case '\n':
		case '\\':
			b.WriteByte('\\')
		case '\'':
			b.WriteByte('\'')
		case '"':
			b.WriteByte('"')
		case 'a':
			b.WriteByte(7)
		case 'b':
			b.WriteByte(8)
		case 'f':
			b.WriteByte(12)
		case 'n':
			b.WriteByte('\n')
		case 'r':
			b.WriteByte('\r')
		case 't':
			b.WriteByte('\t')
		case 'v':
			b.WriteByte(11)
		case 'x', 'u', 'U':
			n := map[byte]int{'x': 2, 'u': 4, 'U': 8}[e]
			if i+n <= len(s) {
				if v, err := strconv.ParseUint(s[i:i+n], 16, 32); err == nil && v <= unicode.MaxRune {
					b.WriteRune(rune(v))
					i += n
					continue
				}
			}
			// Python raises here; keep the text so rendering still fails
			// visibly rather than silently.
			b.WriteByte('\\')
			b.WriteByte(e)
		case '0', '1', '2', '3', '4', '5', '6', '7':
			v := int(e - '0')
			for k := 0; k < 2 && i < len(s) && s[i] >= '0' && s[i] <= '7'; k++ {
				v = v*8 + int(s[i]-'0')
				i++
			}
			b.WriteRune(rune(v))
		default:
			b.WriteByte('\\')
			b.WriteByte(e)
		}
	}
	return b.String()
}
