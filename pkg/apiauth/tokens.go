// Package apiauth guards kvgate's management API: bearer tokens with a role
// read from a permission-restricted file, TLS certificates that reload when
// their files change, and one audit line per mutating call.
//
// The token file has one token per line, `<name> <role> <token>`, with role
// admin (every call) or read (GET and HEAD only); blank lines and lines
// starting with # are ignored. kvgate refuses a file that group or others may
// read or write, or that is owned by neither kvgate's user nor root, naming
// the file and its mode. The file is re-read when it changes; a change that
// does not parse keeps the tokens in force and is logged.
//
// A rule's backendTokenFile (BackendToken, backendtoken.go) is the other
// kind of secret file here: the key the rule's engines require, held to the
// same mode rules, reloaded on change and sent only on kvgate's own calls to
// the engines.
//
// Knobs (cmd/kvgate flags): --api-token-file, --api-tls-cert, --api-tls-key,
// --api-client-ca, --api-insecure; rule field backendTokenFile. Metrics (through Observer):
// kvgate_api_auth_failures_total{reason}, kvgate_api_reloads_total{file,result}.
// docs/security.md has the threat model.
package apiauth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
)

// Role is what a token may do.
type Role uint8

// Roles.
const (
	RoleRead  Role = iota + 1 // GET and HEAD
	RoleAdmin                 // every method
)

func (r Role) String() string {
	switch r {
	case RoleRead:
		return "read"
	case RoleAdmin:
		return "admin"
	}
	return "none"
}

// Bounds of the token file, so a wrong path (a large binary) cannot take
// memory, and a token guessed by brute force is not short.
const (
	MaxTokenFileBytes = 1 << 20
	MaxTokens         = 1024
	MinTokenLen       = 16
	MaxTokenLen       = 4096
	maxNameLen        = 128
)

type entry struct {
	name string
	role Role
	sum  [sha256.Size]byte // of the token: comparisons run over fixed-size digests
}

// Tokens is a parsed token file.
type Tokens struct {
	entries []entry
}

// Identity is who a request authenticated as.
type Identity struct {
	Name string
	Role Role
}

// Lookup finds the token's identity. Every entry is compared, in constant
// time over digests, so neither timing nor early exit tells how close a
// guess was or which entry matched.
func (t *Tokens) Lookup(token string) (Identity, bool) {
	sum := sha256.Sum256([]byte(token))
	var found Identity
	ok := 0
	for i := range t.entries {
		e := &t.entries[i]
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			found, ok = Identity{Name: e.name, Role: e.role}, 1
		}
	}
	return found, ok == 1
}

// Len is the number of tokens.
func (t *Tokens) Len() int { return len(t.entries) }

// ParseTokens reads the token file's content; errors name the line.
func ParseTokens(b []byte) (*Tokens, error) {
	if len(b) > MaxTokenFileBytes {
		return nil, fmt.Errorf("%d bytes, more than %d", len(b), MaxTokenFileBytes)
	}
	t := &Tokens{}
	names := map[string]bool{}
	sums := map[[sha256.Size]byte]string{}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), MaxTokenFileBytes)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("line %d: want \"<name> <role> <token>\", got %d fields", n, len(f))
		}
		name, roleName, token := f[0], f[1], f[2]
		if len(name) > maxNameLen || !printable(name) {
			return nil, fmt.Errorf("line %d: name must be 1-%d printable characters", n, maxNameLen)
		}
		if names[name] {
			return nil, fmt.Errorf("line %d: name %q is used twice", n, name)
		}
		var role Role
		switch roleName {
		case "admin":
			role = RoleAdmin
		case "read":
			role = RoleRead
		default:
			return nil, fmt.Errorf("line %d (%s): role %q; allowed values: admin, read", n, name, roleName)
		}
		if len(token) < MinTokenLen || len(token) > MaxTokenLen {
			return nil, fmt.Errorf("line %d (%s): the token must be %d-%d characters", n, name, MinTokenLen, MaxTokenLen)
		}
		sum := sha256.Sum256([]byte(token))
		if other, dup := sums[sum]; dup {
			return nil, fmt.Errorf("line %d (%s): the same token as %s", n, name, other)
		}
		if len(t.entries) >= MaxTokens {
			return nil, fmt.Errorf("line %d: more than %d tokens", n, MaxTokens)
		}
		names[name], sums[sum] = true, name
		t.entries = append(t.entries, entry{name: name, role: role, sum: sum})
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if len(t.entries) == 0 {
		return nil, errors.New("no token")
	}
	return t, nil
}

func printable(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f {
			return false
		}
	}
	return true
}

// CheckSecretFile refuses a file that group or others may read or write, or
// that neither this process's user nor root owns: a token or key readable by
// another local user is not a secret. The error names the file and its mode.
func CheckSecretFile(path string) (fs.FileInfo, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("%s is not a regular file (%s)", path, fi.Mode().Type())
	}
	if perm := fi.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s has mode %04o: group or others may access it; chmod 0600 (or 0400) %s", path, perm, path)
	}
	if owner, ok := ownerUID(fi); ok {
		if uid := os.Geteuid(); int(owner) != uid && owner != 0 {
			return nil, fmt.Errorf("%s is owned by uid %d, neither kvgate's user (uid %d) nor root", path, owner, uid)
		}
	}
	return fi, nil
}

// LoadTokenFile checks the file's mode and owner, then parses it.
func LoadTokenFile(path string) (*Tokens, error) {
	if _, err := CheckSecretFile(path); err != nil {
		return nil, fmt.Errorf("token file: %w", err)
	}
	b, err := readBounded(path, MaxTokenFileBytes)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	t, err := ParseTokens(b)
	if err != nil {
		return nil, fmt.Errorf("token file %s: %w", path, err)
	}
	return t, nil
}

// readBounded reads at most limit bytes of path, failing if it holds more.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var buf bytes.Buffer
	n, err := buf.ReadFrom(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, err
	}
	if n > limit {
		return nil, fmt.Errorf("larger than %d bytes", limit)
	}
	return buf.Bytes(), nil
}
