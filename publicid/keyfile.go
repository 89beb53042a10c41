package publicid

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The key file: text, one statement a line, what `rangesvc token keygen`
// writes and ReadKeyFile reads:
//
//	# comment
//	key ID SECRET     a key: ID in 0..MaxKeyID, SECRET its KeySize bytes in
//	                  standard base64 with padding (openssl rand -base64 32)
//	primary ID        the key Encode uses (exactly one such line)
//
// Blank lines and lines starting with '#' are ignored; fields are separated
// by spaces or tabs.

// keyFileHeader starts every file KeyFile writes.
const keyFileHeader = `# idrange public-ID token keys (package publicid, rangesvc token).
# SECRET: whoever reads this file can decode every token and forge new ones.
# Keep it mode 0600. "key ID SECRET": a key, ID 0..61 (each token names its
# key id in clear), SECRET 32 random bytes in base64. "primary ID": the key
# that encodes; every key listed decodes. docs/operations.md has the rotation.
`

// ReadKeyFile reads and checks the key file at path (see ParseKeyFile);
// errors name the file.
func ReadKeyFile(path string) (*KeySet, error) {
	text, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("key file: %w", err)
	}
	ks, err := ParseKeyFile(text)
	if err != nil {
		return nil, fmt.Errorf("key file %s: %w", path, err)
	}
	return ks, nil
}

// ParseKeyFile reads the key file format (key and primary lines). Every
// error is ErrInvalidKeys and names the line and the problem (an unknown
// statement, a wrong number of fields, a key id that is not a number in
// 0..MaxKeyID, a secret that is not standard base64 or not KeySize bytes or
// all zeros, a key id or a secret given twice, no primary or two primary
// lines, a primary that is no key); it never shows a secret.
func ParseKeyFile(text []byte) (*KeySet, error) {
	var entries []entry
	primary, primaryLine := -1, 0
	for n, line := range strings.Split(string(text), "\n") {
		n++
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], "#") {
			continue
		}
		where := "line " + strconv.Itoa(n)
		switch f[0] {
		case "key":
			if len(f) != 3 {
				return nil, fmt.Errorf("%s: a key line has %d fields, want 3 (key ID SECRET): %w", where, len(f), ErrInvalidKeys)
			}
			id, err := parseKeyID(f[1])
			if err != nil {
				return nil, fmt.Errorf("%s: %v: %w", where, err, ErrInvalidKeys)
			}
			secret, err := base64.StdEncoding.Strict().DecodeString(f[2])
			if err != nil {
				return nil, fmt.Errorf("%s: key %d: secret is not standard base64 with padding: %w", where, id, ErrInvalidKeys)
			}
			entries = append(entries, entry{id: id, secret: secret, where: where})
		case "primary":
			if len(f) != 2 {
				return nil, fmt.Errorf("%s: a primary line has %d fields, want 2 (primary ID): %w", where, len(f), ErrInvalidKeys)
			}
			if primaryLine != 0 {
				return nil, fmt.Errorf("%s: a second primary line (the first is line %d): %w", where, primaryLine, ErrInvalidKeys)
			}
			id, err := parseKeyID(f[1])
			if err != nil {
				return nil, fmt.Errorf("%s: primary: %v: %w", where, err, ErrInvalidKeys)
			}
			primary, primaryLine = id, n
		default:
			// The statement is not echoed: a line that is not a statement
			// may be a pasted secret.
			return nil, fmt.Errorf("%s: not a key line, a primary line or a # comment: %w", where, ErrInvalidKeys)
		}
	}
	if primaryLine == 0 && len(entries) > 0 {
		return nil, fmt.Errorf("no primary line (primary ID): %w", ErrInvalidKeys)
	}
	return build(entries, primary, "line "+strconv.Itoa(primaryLine))
}

// parseKeyID reads a key id: decimal digits without sign or leading zero,
// 0..MaxKeyID. The error does not quote s (it could be a misplaced secret).
func parseKeyID(s string) (int, error) {
	id, err := strconv.Atoi(s)
	if err != nil || strconv.Itoa(id) != s || id < 0 || id > MaxKeyID {
		return 0, fmt.Errorf("key id is not a number in 0..%d", MaxKeyID)
	}
	return id, nil
}

// KeyFile is ks in the key file format (ParseKeyFile reads it back): a
// header comment, one key line per key in id order, the primary line. It
// holds the secrets: write it with mode 0600.
func (ks *KeySet) KeyFile() []byte {
	var b bytes.Buffer
	b.WriteString(keyFileHeader)
	for _, k := range ks.keys {
		fmt.Fprintf(&b, "key %d %s\n", k.id, base64.StdEncoding.EncodeToString(k.secret[:]))
	}
	fmt.Fprintf(&b, "primary %d\n", ks.primary)
	return b.Bytes()
}
