package publicid

import (
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

const (
	// KeySize is the length of a key's secret: 32 random bytes.
	KeySize = 32
	// MaxKeyID is the largest key id. A token carries its key id in clear
	// as its first character, one of the 62 letters and digits of the
	// base64url alphabet (ids 0..61), so a token never starts with '-' or
	// '_' and is never mistaken for a command-line flag.
	MaxKeyID = 61
)

// KeySet is a set of keys, each named by a key id, one of them the
// primary: Encode uses the primary, Decode any key of the set. It is
// immutable and safe for concurrent use; AddKey and WithPrimary return new
// sets. Formatting a KeySet with fmt shows its key ids, never its secrets.
type KeySet struct {
	keys    []key // sorted by id
	primary int
}

type key struct {
	id     int
	secret [KeySize]byte
}

// entry is a key as given (to NewKeySet or in a key file), with where it
// was given for error messages.
type entry struct {
	id     int
	secret []byte
	where  string // "key 3" or "line 7"
}

// NewKeySet returns the key set of secrets (key id -> KeySize random bytes,
// copied) whose primary key is primary. The error is ErrInvalidKeys, naming
// the problem: no keys, a key id outside 0..MaxKeyID, a secret of the wrong
// length or all zeros, two ids with the same secret, or a primary that is
// not one of the keys.
func NewKeySet(primary int, secrets map[int][]byte) (*KeySet, error) {
	entries := make([]entry, 0, len(secrets))
	for id, s := range secrets {
		entries = append(entries, entry{id: id, secret: s, where: "key " + strconv.Itoa(id)})
	}
	slices.SortFunc(entries, func(a, b entry) int { return a.id - b.id })
	return build(entries, primary, "")
}

// GenerateKeySet returns a key set of one new random key, id 0, the
// primary.
func GenerateKeySet() *KeySet {
	ks := &KeySet{keys: []key{{id: 0}}, primary: 0}
	rand.Read(ks.keys[0].secret[:]) // never fails (crypto/rand)
	return ks
}

// build checks entries and the primary (primaryWhere: where it was given,
// "" when it is an argument) and returns their key set.
func build(entries []entry, primary int, primaryWhere string) (*KeySet, error) {
	if len(entries) == 0 {
		return nil, fmt.Errorf("no keys: %w", ErrInvalidKeys)
	}
	ks := &KeySet{keys: make([]key, 0, len(entries)), primary: primary}
	seen := map[int]string{}
	for _, e := range entries {
		switch {
		case e.id < 0 || e.id > MaxKeyID:
			return nil, fmt.Errorf("%s: key id %d not in 0..%d: %w", e.where, e.id, MaxKeyID, ErrInvalidKeys)
		case seen[e.id] != "":
			return nil, fmt.Errorf("%s: key %d given twice (also %s): %w", e.where, e.id, seen[e.id], ErrInvalidKeys)
		case len(e.secret) != KeySize:
			return nil, fmt.Errorf("%s: key %d: secret is %d bytes, want %d: %w", e.where, e.id, len(e.secret), KeySize, ErrInvalidKeys)
		case subtle.ConstantTimeCompare(e.secret, make([]byte, KeySize)) == 1:
			return nil, fmt.Errorf("%s: key %d: secret is all zeros, not random: %w", e.where, e.id, ErrInvalidKeys)
		}
		for _, k := range ks.keys {
			if subtle.ConstantTimeCompare(k.secret[:], e.secret) == 1 {
				return nil, fmt.Errorf("%s: key %d has the same secret as key %d: %w", e.where, e.id, k.id, ErrInvalidKeys)
			}
		}
		seen[e.id] = e.where
		k := key{id: e.id}
		copy(k.secret[:], e.secret)
		ks.keys = append(ks.keys, k)
	}
	slices.SortFunc(ks.keys, func(a, b key) int { return a.id - b.id })
	if seen[primary] == "" {
		where := primaryWhere
		if where != "" {
			where += ": "
		}
		return nil, fmt.Errorf("%sprimary key %d is not one of the keys (%s): %w", where, primary, ks.idList(), ErrInvalidKeys)
	}
	return ks, nil
}

// Primary is the id of the key Encode uses.
func (ks *KeySet) Primary() int { return ks.primary }

// IDs are the key ids of the set, in increasing order.
func (ks *KeySet) IDs() []int {
	ids := make([]int, len(ks.keys))
	for i, k := range ks.keys {
		ids[i] = k.id
	}
	return ids
}

// errFull is AddKey's error when every key id is taken.
var errFull = errors.New("publicid: every key id 0..61 is in use; remove retired keys first")

// AddKey returns a copy of ks with a new random key, and the new key's id:
// the first id after the primary's (cyclically, after MaxKeyID comes 0)
// that ks does not use. The primary is unchanged: the new key decodes at
// once and encodes after WithPrimary. A key set that already uses every id
// is refused.
func (ks *KeySet) AddKey() (*KeySet, int, error) {
	if len(ks.keys) > MaxKeyID {
		return nil, 0, errFull
	}
	id := ks.primary
	for ks.has(id) {
		id = (id + 1) % (MaxKeyID + 1)
	}
	k := key{id: id}
	rand.Read(k.secret[:]) // never fails (crypto/rand)
	out := &KeySet{keys: append(slices.Clone(ks.keys), k), primary: ks.primary}
	slices.SortFunc(out.keys, func(a, b key) int { return a.id - b.id })
	return out, id, nil
}

// WithPrimary returns a copy of ks whose primary is key id; the error is
// ErrInvalidKeys when ks has no such key.
func (ks *KeySet) WithPrimary(id int) (*KeySet, error) {
	if !ks.has(id) {
		return nil, fmt.Errorf("primary key %d is not one of the keys (%s): %w", id, ks.idList(), ErrInvalidKeys)
	}
	return &KeySet{keys: slices.Clone(ks.keys), primary: id}, nil
}

func (ks *KeySet) has(id int) bool {
	_, found := slices.BinarySearchFunc(ks.keys, id, func(k key, id int) int { return k.id - id })
	return found
}

// idList is the key ids as "0 1 5".
func (ks *KeySet) idList() string {
	var b strings.Builder
	for i, k := range ks.keys {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(strconv.Itoa(k.id))
	}
	return b.String()
}

// String names the key ids and the primary, never a secret.
func (ks KeySet) String() string {
	return fmt.Sprintf("publicid.KeySet{keys: %s, primary: %d}", ks.idList(), ks.primary)
}

// GoString is String, so %#v shows no secret either.
func (ks KeySet) GoString() string { return ks.String() }

// Format writes String for every verb, so no verb (%d, %x on the struct)
// prints a secret.
func (ks KeySet) Format(f fmt.State, _ rune) { f.Write([]byte(ks.String())) }
