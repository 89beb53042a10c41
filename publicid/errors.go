package publicid

import "errors"

// Errors returned by this package, matched with errors.Is; the messages
// that wrap them say what is wrong. Decode returns ErrMalformed,
// ErrUnknownKey or ErrNotAuthentic, and never echoes the token (it is
// untrusted input).
var (
	// ErrMalformed: the text is not a token of this format: not TokenLen
	// characters, a character outside the alphabet, or a spelling Encode
	// never writes. Treat it like ErrNotAuthentic (not found).
	ErrMalformed = errors.New("publicid: malformed token")
	// ErrUnknownKey: the token names a key id the key set does not hold: a
	// retired key, a key not yet rolled out here, or a forgery.
	ErrUnknownKey = errors.New("publicid: token names an unknown key")
	// ErrNotAuthentic: the token did not come from Encode under this key
	// and kind: forged, altered, of another kind, or made with another key
	// of the same id.
	ErrNotAuthentic = errors.New("publicid: token is not authentic")
	// ErrInvalidKind: a kind is empty, longer than MaxKindLen or holds a
	// byte other than an ASCII letter, digit, '.', '_' or '-'.
	ErrInvalidKind = errors.New("publicid: invalid kind")
	// ErrInvalidKeys: a key set or key file is not valid (NewKeySet,
	// ParseKeyFile, ReadKeyFile, NewCodec); the message says which line or
	// key and what is wrong, and never shows a secret.
	ErrInvalidKeys = errors.New("publicid: invalid key set")
)
