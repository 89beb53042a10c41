// Package publicid turns an ID into a token that can be shown to untrusted
// clients (in a URL, a page, an API answer) and back: keyed, authenticated,
// reversible, typed by a kind.
//
//	keys, err := publicid.ReadKeyFile("/etc/app/token.keys") // rangesvc token keygen
//	orders, err := publicid.NewCodec(keys, "order")
//	tok := orders.Encode(int64(id))   // 23 URL-safe characters, e.g. in /orders/{tok}
//	v, err := orders.Decode(tok)      // errors.Is(err, publicid.ErrNotAuthentic) ...
//
// A raw ID tells anyone its creation time, region and worker, and two IDs
// tell the volume minted between them. A token tells nothing without the
// key: it is one AES-256 block over the ID and 64 bits of redundancy derived
// from the key and the kind, so
//
//   - the same key, kind and ID always give the same token (stable URLs);
//   - a token reveals nothing about its ID but the key id (its first
//     character): tokens of consecutive IDs look like unrelated random
//     strings;
//   - a token that was not made by Encode (forged, altered, truncated,
//     extended, of another kind, or under another key) is refused before any
//     lookup, except with probability about 2^-64 per attempt, and a lucky
//     forgery decodes to a random 64-bit value the forger cannot choose;
//   - an order token does not decode as a user token (ErrNotAuthentic);
//   - keys rotate: the token carries its key id in clear, Encode uses the
//     key set's primary key and Decode whichever key the token names.
//
// The construction (docs/public-ids.md has the argument and the figures):
// for each key (KeySize random bytes) and kind, HKDF-SHA256 (RFC 5869; empty
// salt, info "idrange publicid v1" || 0x00 || kind) derives 40 bytes: an
// AES-256 key and an 8-byte check value. The token is
//
//	alphabet[keyID] || base64url(AES-256-Encrypt(aesKey, bigEndian64(id) || check))
//
// with alphabet the base64url (RFC 4648 section 5) alphabet, key ids
// 0..MaxKeyID (so a token starts with a letter or digit, never "-"), and
// the 16-byte block in unpadded base64url: 22 characters, the unused low 4
// bits of the last one zero. Decode accepts exactly that text (any other
// spelling is ErrMalformed), decrypts with the key its first character
// names and compares the last 8 bytes with that key's check for the kind in
// constant time.
//
// AES-256 rather than AES-128: the block is 128 bits either way, the key
// comes from HKDF at no cost, and the 4 extra rounds cost a few nanoseconds,
// while tokens may sit in URLs and archives for decades under keys that are
// rarely rotated; a 256-bit key leaves no margin to argue about (many kinds
// and keys attacked at once, quantum search). The weaker number is the
// forgery bound, which comes from the 64 bits of redundancy, not the key.
//
// What it does not do:
//   - It is not authorization. Whoever holds a token (a shared link, a log,
//     a Referer header) can present it; every read must still check that
//     the caller may see the row.
//   - It is not a secret once the key leaks: whoever has a key decodes every
//     token made with it and can make valid tokens for any ID. Rotate to a
//     new key and retire the leaked one (tokens made with it stop decoding).
//   - It does not hide equality: one ID gives one token per key and kind, so
//     appearances of the same token link to the same row, and a client can
//     count distinct IDs. A new primary key gives an ID a new token.
//   - Tokens do not expire and cannot be revoked one by one.
//   - Timing: with AES hardware (amd64 AES-NI, arm64, s390x) AES runs in
//     constant time; elsewhere Go's table-based AES may leak through cache
//     timing (see crypto/aes).
//
// A Codec and a KeySet are immutable and safe for concurrent use. Decode
// does not allocate, not even to refuse a token; Encode allocates only its
// result. Errors a caller
// acts on are sentinels matched with errors.Is. The package imports only the
// standard library.
package publicid
