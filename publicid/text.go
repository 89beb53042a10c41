package publicid

// The text form of a token: the key id as one character of the base64url
// alphabet (RFC 4648 section 5), then the 16-byte block in unpadded
// base64url. Hand-written rather than encoding/base64, which skips '\r'
// and '\n' inside its input: a token has exactly one spelling.

const (
	// TokenLen is the length of every token: 1 character of key id and 22
	// of base64url block.
	TokenLen = 1 + blockChars
	// blockChars is the unpadded base64url length of a 16-byte block: 5
	// groups of 3 bytes in 4 characters, then 1 byte in 2 characters.
	blockChars = 22
	// alphabet is base64url's: a value 0..63 is alphabet[value].
	alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	// invalid marks a byte outside the alphabet in decodeMap.
	invalid = 0xff
)

// decodeMap is alphabet's inverse.
var decodeMap = func() (m [256]byte) {
	for i := range m {
		m[i] = invalid
	}
	for i := range len(alphabet) {
		m[alphabet[i]] = byte(i)
	}
	return m
}()

// encodeBlock writes the unpadded base64url of b into dst (blockChars
// bytes).
func encodeBlock(dst []byte, b *[blockSize]byte) {
	_ = dst[blockChars-1]
	for i := range 5 {
		v := uint(b[3*i])<<16 | uint(b[3*i+1])<<8 | uint(b[3*i+2])
		dst[4*i] = alphabet[v>>18&0x3f]
		dst[4*i+1] = alphabet[v>>12&0x3f]
		dst[4*i+2] = alphabet[v>>6&0x3f]
		dst[4*i+3] = alphabet[v&0x3f]
	}
	dst[20] = alphabet[b[15]>>2]
	dst[21] = alphabet[b[15]&0x3<<4]
}

// decodeBlock reads the blockChars characters of s into b; false when a
// character is outside the alphabet or the last one has any of its unused
// low 4 bits set (a second spelling of the same block).
func decodeBlock(b *[blockSize]byte, s string) bool {
	_ = s[blockChars-1]
	var bad byte
	for i := range 5 {
		c0, c1, c2, c3 := decodeMap[s[4*i]], decodeMap[s[4*i+1]], decodeMap[s[4*i+2]], decodeMap[s[4*i+3]]
		bad |= c0 | c1 | c2 | c3
		v := uint(c0)<<18 | uint(c1)<<12 | uint(c2)<<6 | uint(c3)
		b[3*i], b[3*i+1], b[3*i+2] = byte(v>>16), byte(v>>8), byte(v)
	}
	c0, c1 := decodeMap[s[20]], decodeMap[s[21]]
	bad |= c0 | c1
	b[15] = c0<<2 | c1>>4
	// invalid (0xff) has the bits 0x40 set that no alphabet value has.
	return bad&0x40 == 0 && c1&0xf == 0
}

// keyIDChar is the first character of a token made with key id.
func keyIDChar(id int) byte { return alphabet[id] }

// keyIDOf is the key id the first character c names, or -1 when c is not
// a letter or digit (the characters of key ids 0..MaxKeyID).
func keyIDOf(c byte) int {
	v := decodeMap[c]
	if v > MaxKeyID {
		return -1
	}
	return int(v)
}
