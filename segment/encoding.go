package segment

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/snowflake"
)

// Values stored in etcd are versioned and decoded strictly: anything that is
// not exactly what this version writes is ErrCorrupt, never a default. A
// corrupt high-water mark read as 0 would re-issue used space.

// hwmPrefix starts every version-1 high-water mark value.
const hwmPrefix = "v1:"

// MaxOwnerLen bounds the free-text owner of a lease (bytes of UTF-8).
const MaxOwnerLen = 256

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
		return 0, errors.Wrapf(ErrCorrupt, "high-water mark %q: not a %q value", clip(b), hwmPrefix)
	}
	if s == "" || len(s) > 19 || (len(s) > 1 && s[0] == '0') {
		return 0, errors.Wrapf(ErrCorrupt, "high-water mark %q: not a canonical decimal", clip(b))
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, errors.Wrapf(ErrCorrupt, "high-water mark %q: not a canonical decimal", clip(b))
		}
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil || v > EndL {
		return 0, errors.Wrapf(ErrCorrupt, "high-water mark %q: not in 0..%d", clip(b), EndL)
	}
	return v, nil
}

// OwnerRecord is the value of a lease key: who holds the code and under
// which etcd lease. Region and Worker repeat the key so a value copied to the
// wrong key is detected.
type OwnerRecord struct {
	Version        int    `json:"v"`
	Region         int    `json:"region"`
	Worker         int    `json:"worker"`
	LeaseID        int64  `json:"lease_id"`
	Owner          string `json:"owner"`
	AcquiredUnixMs int64  `json:"acquired_unix_ms"`
}

// ownerRecordVersion is the only OwnerRecord.Version this code writes/reads.
const ownerRecordVersion = 1

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
// duplicated or re-cased fields, no extra spaces), version 1, with fields in
// range.
func DecodeOwnerRecord(b []byte) (OwnerRecord, error) {
	var r OwnerRecord
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return OwnerRecord{}, errors.Wrapf(ErrCorrupt, "owner record %q: %v", clip(b), err)
	}
	if r.Encode() != string(b) {
		return OwnerRecord{}, errors.Wrapf(ErrCorrupt, "owner record %q: not in canonical form", clip(b))
	}
	switch {
	case r.Version != ownerRecordVersion:
		return OwnerRecord{}, errors.Wrapf(ErrCorrupt, "owner record %q: version %d, want %d", clip(b), r.Version, ownerRecordVersion)
	case r.Region < 0 || r.Region > snowflake.MaxRegion:
		return OwnerRecord{}, errors.Wrapf(ErrCorrupt, "owner record %q: region %d out of range", clip(b), r.Region)
	case r.Worker < 0 || r.Worker > snowflake.MaxWorker:
		return OwnerRecord{}, errors.Wrapf(ErrCorrupt, "owner record %q: worker %d out of range", clip(b), r.Worker)
	case r.LeaseID == 0:
		return OwnerRecord{}, errors.Wrapf(ErrCorrupt, "owner record %q: no lease id", clip(b))
	case r.AcquiredUnixMs <= 0:
		return OwnerRecord{}, errors.Wrapf(ErrCorrupt, "owner record %q: acquired time %d", clip(b), r.AcquiredUnixMs)
	}
	if err := validOwner(r.Owner); err != nil {
		return OwnerRecord{}, errors.Wrapf(ErrCorrupt, "owner record %q: %v", clip(b), err)
	}
	return r, nil
}

// validOwner accepts printable UTF-8 of at most MaxOwnerLen bytes.
func validOwner(s string) error {
	if len(s) > MaxOwnerLen {
		return errors.Newf("owner is %d bytes, more than %d", len(s), MaxOwnerLen)
	}
	if !utf8.ValidString(s) {
		return errors.New("owner is not valid UTF-8")
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return errors.Newf("owner contains the non-printable character %U", r)
		}
	}
	return nil
}

// clip shortens a stored value for an error message.
func clip(b []byte) string {
	const n = 64
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// Key layout under a prefix P (default DefaultPrefix):
//
//	P + "r<region>/lease/<worker, 3 digits>"   owner record, attached to the etcd lease
//	P + "r<region>/hwm/<worker, 3 digits>"     high-water mark, no lease (forever)
//	P + "r<region>/contend/<worker, 3 digits>" contention signal (value unused)
type keys struct{ prefix string }

func (k keys) contend(region, worker int) string {
	return fmt.Sprintf("%sr%d/contend/%03d", k.prefix, region, worker)
}

func (k keys) leasePrefix(region int) string { return fmt.Sprintf("%sr%d/lease/", k.prefix, region) }
func (k keys) hwmPrefix(region int) string   { return fmt.Sprintf("%sr%d/hwm/", k.prefix, region) }
func (k keys) lease(region, worker int) string {
	return fmt.Sprintf("%s%03d", k.leasePrefix(region), worker)
}
func (k keys) hwm(region, worker int) string {
	return fmt.Sprintf("%s%03d", k.hwmPrefix(region), worker)
}

// workerOf parses the worker code at the end of a key listed under prefix;
// ok is false for any key this layout does not produce.
func workerOf(key []byte, prefix string) (int, bool) {
	s, found := strings.CutPrefix(string(key), prefix)
	if !found || len(s) != 3 {
		return 0, false
	}
	w := 0
	for i := 0; i < 3; i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, false
		}
		w = w*10 + int(s[i]-'0')
	}
	if w > snowflake.MaxWorker {
		return 0, false
	}
	return w, true
}
