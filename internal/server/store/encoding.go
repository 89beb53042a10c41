package store

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Values in storage are versioned and decoded strictly: anything that is
// not exactly what this version writes is ErrCorrupt, never a default. A
// corrupt high-water mark read as 0 would re-issue used space.

// hwmPrefix starts every version-1 high-water mark value.
const hwmPrefix = "v1:"

// EncodeHighWater is the stored form of a high-water mark: "v1:<decimal>".
func EncodeHighWater(hwm int64) string {
	return hwmPrefix + strconv.FormatInt(hwm, 10)
}

// DecodeHighWater parses a stored high-water mark. It accepts exactly what
// EncodeHighWater writes for a value in 0..EndL: the "v1:" prefix, then a
// canonical decimal (no sign, no leading zeros, no spaces).
func DecodeHighWater(b []byte) (int64, error) {
	s, ok := strings.CutPrefix(string(b), hwmPrefix)
	if !ok {
		return 0, fmt.Errorf("high-water mark %q: not a %q value: %w", clip(b), hwmPrefix, segment.ErrCorrupt)
	}
	if s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, fmt.Errorf("high-water mark %q: not a canonical decimal: %w", clip(b), segment.ErrCorrupt)
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("high-water mark %q: not a canonical decimal: %w", clip(b), segment.ErrCorrupt)
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v > segment.EndL {
		return 0, fmt.Errorf("high-water mark %q: not in 0..%d: %w", clip(b), segment.EndL, segment.ErrCorrupt)
	}
	return v, nil
}

// OwnerRecord is the value of a lease key: who holds the code and under
// which etcd lease. Region and Worker repeat the key so a value copied to the
// wrong key is detected.
//
// Two versions exist. Version 1 has no Identity: a lease taken without a
// verified caller identity (no mutual TLS), byte for byte what releases
// before identities wrote. Version 2 is a lease bound to Identity (non-empty),
// the verified identity of the caller that acquired it; only that identity
// may renew, release or allocate on it. A release that only knows version 1
// reads a version 2 record as corrupt, so enable mutual TLS only once every
// replica of the region runs a release that knows version 2.
type OwnerRecord struct {
	Version        int    `json:"v"`
	Region         int    `json:"region"`
	Worker         int    `json:"worker"`
	LeaseID        int64  `json:"lease_id"`
	Owner          string `json:"owner"`
	Identity       string `json:"identity,omitempty"`
	AcquiredUnixMs int64  `json:"acquired_unix_ms"`
}

// Owner record versions: without and with a caller identity.
const (
	ownerRecordVersion         = 1
	ownerRecordIdentityVersion = 2
)

// recordVersion is the version a record with identity id is written as.
func recordVersion(id string) int {
	if id == "" {
		return ownerRecordVersion
	}
	return ownerRecordIdentityVersion
}

// Encode is the stored form of r (compact JSON, fixed field order).
func (r OwnerRecord) Encode() string {
	b, err := json.Marshal(r)
	if err != nil { // cannot happen: only ints and a string
		panic(fmt.Sprintf("segment: encode owner record: %v", err))
	}
	return string(b)
}

// DecodeOwnerRecord parses a lease key's value strictly: it must be exactly
// the canonical encoding (re-encoding gives the same bytes, so no unknown,
// duplicated or re-cased fields, no extra spaces), version 1 without an
// identity or version 2 with one, with fields in range.
func DecodeOwnerRecord(b []byte) (OwnerRecord, error) {
	var r OwnerRecord
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return OwnerRecord{}, fmt.Errorf("owner record %q: %v: %w", clip(b), err, segment.ErrCorrupt)
	}
	if r.Encode() != string(b) {
		return OwnerRecord{}, fmt.Errorf("owner record %q: not in canonical form: %w", clip(b), segment.ErrCorrupt)
	}
	switch {
	case r.Version != ownerRecordVersion && r.Version != ownerRecordIdentityVersion:
		return OwnerRecord{}, fmt.Errorf("owner record %q: version %d, want %d or %d: %w",
			clip(b), r.Version, ownerRecordVersion, ownerRecordIdentityVersion, segment.ErrCorrupt)
	case r.Version != recordVersion(r.Identity):
		return OwnerRecord{}, fmt.Errorf("owner record %q: version %d with identity %q: %w", clip(b), r.Version, r.Identity, segment.ErrCorrupt)
	case r.Region < 0 || r.Region > snowflake.MaxRegion:
		return OwnerRecord{}, fmt.Errorf("owner record %q: region %d out of range: %w", clip(b), r.Region, segment.ErrCorrupt)
	case r.Worker < 0 || r.Worker > snowflake.MaxWorker:
		return OwnerRecord{}, fmt.Errorf("owner record %q: worker %d out of range: %w", clip(b), r.Worker, segment.ErrCorrupt)
	case r.LeaseID == 0:
		return OwnerRecord{}, fmt.Errorf("owner record %q: no lease id: %w", clip(b), segment.ErrCorrupt)
	case r.AcquiredUnixMs <= 0:
		return OwnerRecord{}, fmt.Errorf("owner record %q: acquired time %d: %w", clip(b), r.AcquiredUnixMs, segment.ErrCorrupt)
	}
	if err := segment.ValidateOwner(r.Owner); err != nil {
		return OwnerRecord{}, fmt.Errorf("owner record %q: %v: %w", clip(b), err, segment.ErrCorrupt)
	}
	if err := authz.ValidateIdentity(r.Identity); err != nil {
		return OwnerRecord{}, fmt.Errorf("owner record %q: %v: %w", clip(b), err, segment.ErrCorrupt)
	}
	return r, nil
}

// clip shortens a stored value for an error message.
func clip(b []byte) string {
	const n = 64
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
