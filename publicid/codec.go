package publicid

import (
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"fmt"
	"sync"
)

const (
	// MaxKindLen is the longest kind, in bytes.
	MaxKindLen = 64
	// blockSize is AES's block: the 8-byte ID, then the 8-byte check.
	blockSize = aes.BlockSize
	// checkSize is the redundancy Decode verifies: 64 bits, hence the
	// 2^-64 forgery bound.
	checkSize = blockSize - 8
	// aesKeySize selects AES-256 (doc.go says why not AES-128).
	aesKeySize = 32
	// kdfInfo prefixes the kind in HKDF's info; the 0 byte ends it, so no
	// kind's info is a prefix of another's.
	kdfInfo = "idrange publicid v1\x00"
)

// Codec encodes IDs of one kind as tokens and decodes tokens of that kind,
// under one KeySet: Encode with the primary key, Decode with the key the
// token names. It is immutable and safe for concurrent use; to rotate, build
// a Codec from the new key set and swap it in.
type Codec struct {
	kind    string
	primary *kindKey
	keys    [MaxKeyID + 1]*kindKey // by key id; nil: not in the key set
}

// kindKey is one key's material for one kind.
type kindKey struct {
	id      int
	block   cipher.Block // AES-256 under the derived key
	check   [checkSize]byte
	refused error // Decode's ErrNotAuthentic for this key and kind
}

// Decode's other errors, made once: refusing a token (a flood of forged
// ones) allocates nothing.
var (
	errLength  = fmt.Errorf("not %d characters: %w", TokenLen, ErrMalformed)
	errKeyChar = fmt.Errorf("first character is not a key id (A-Z, a-z, 0-9): %w", ErrMalformed)
	errBlock   = fmt.Errorf("not the canonical unpadded base64url of one block: %w", ErrMalformed)
	errUnknown = func() (e [MaxKeyID + 1]error) {
		for id := range e {
			e[id] = fmt.Errorf("key %d is not in the key set: %w", id, ErrUnknownKey)
		}
		return e
	}()
)

// scratch holds the blocks Encode and Decode pass to AES: through the
// cipher.Block interface a stack buffer would escape, costing two
// allocations per call.
var scratch = sync.Pool{New: func() any { return new([blockSize]byte) }}

// NewCodec derives the keys of kind from every key of keys. The error is
// ErrInvalidKind for a kind that is empty, longer than MaxKindLen or has a
// byte other than an ASCII letter, digit, '.', '_' or '-' (so every
// language spells it the same), and ErrInvalidKeys for a nil key set.
func NewCodec(keys *KeySet, kind string) (*Codec, error) {
	if err := checkKind(kind); err != nil {
		return nil, err
	}
	if keys == nil || len(keys.keys) == 0 {
		return nil, fmt.Errorf("no keys: %w", ErrInvalidKeys)
	}
	c := &Codec{kind: kind}
	for _, k := range keys.keys {
		kk := deriveKindKey(k.id, &k.secret, kind)
		c.keys[k.id] = kk
		if k.id == keys.primary {
			c.primary = kk
		}
	}
	return c, nil
}

// checkKind returns ErrInvalidKind unless kind is 1..MaxKindLen bytes of
// ASCII letters, digits, '.', '_' and '-'.
func checkKind(kind string) error {
	if kind == "" || len(kind) > MaxKindLen {
		return fmt.Errorf("kind is %d bytes, want 1..%d: %w", len(kind), MaxKindLen, ErrInvalidKind)
	}
	for i := range len(kind) {
		c := kind[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("kind %q: byte %d is not an ASCII letter, digit, '.', '_' or '-': %w", kind, i, ErrInvalidKind)
		}
	}
	return nil
}

// deriveKindKey is HKDF-SHA256(secret, salt empty, kdfInfo || kind), 40
// bytes: the AES-256 key, then the check.
func deriveKindKey(id int, secret *[KeySize]byte, kind string) *kindKey {
	okm, err := hkdf.Key(sha256.New, secret[:], nil, kdfInfo+kind, aesKeySize+checkSize)
	if err != nil { // only for a length HKDF cannot give; 40 bytes it can
		panic("publicid: " + err.Error())
	}
	block, err := aes.NewCipher(okm[:aesKeySize])
	if err != nil { // only for a key size AES does not have
		panic("publicid: " + err.Error())
	}
	kk := &kindKey{id: id, block: block,
		refused: fmt.Errorf("not a token of kind %q under key %d: %w", kind, id, ErrNotAuthentic)}
	copy(kk.check[:], okm[aesKeySize:])
	clear(okm)
	return kk
}

// Kind is the kind this Codec encodes and decodes.
func (c *Codec) Kind() string { return c.kind }

// Encode returns the token of id under the primary key: TokenLen
// characters of the URL-safe base64url alphabet, starting with the primary
// key's id character (a letter or digit). Every int64 has a token;
// idrange's IDs are positive (snowflake.ID is an int64).
func (c *Codec) Encode(id int64) string {
	k := c.primary
	b := scratch.Get().(*[blockSize]byte)
	binary.BigEndian.PutUint64(b[:8], uint64(id))
	copy(b[8:], k.check[:])
	k.block.Encrypt(b[:], b[:])
	var text [TokenLen]byte
	text[0] = keyIDChar(k.id)
	encodeBlock(text[1:], b)
	scratch.Put(b)
	return string(text[:])
}

// Decode returns the ID of token, which must be exactly a token Encode
// returned for this kind under a key of the key set. The error is
// ErrMalformed (not such text), ErrUnknownKey (a key id not in the set) or
// ErrNotAuthentic (anything else: forged, altered, another kind, another
// key). Decode does not allocate.
func (c *Codec) Decode(token string) (int64, error) {
	if len(token) != TokenLen {
		return 0, errLength
	}
	kid := keyIDOf(token[0])
	if kid < 0 {
		return 0, errKeyChar
	}
	b := scratch.Get().(*[blockSize]byte)
	defer scratch.Put(b)
	if !decodeBlock(b, token[1:]) {
		return 0, errBlock
	}
	k := c.keys[kid]
	if k == nil {
		return 0, errUnknown[kid]
	}
	k.block.Decrypt(b[:], b[:])
	if subtle.ConstantTimeCompare(b[8:], k.check[:]) != 1 {
		return 0, k.refused
	}
	return int64(binary.BigEndian.Uint64(b[:8])), nil
}
