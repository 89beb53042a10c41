// Package regionid is the home of a region's identity record: which region
// code an etcd cluster serves, under which random region id, with which ID
// layout, whether its code is confirmed in a registry shared by all regions,
// and whether a restore from a backup is pending. Replicas check it at start
// and periodically (docs/operations/region-identity.md, "Region identity, registry, backup
// and restore"); the record's format, its strict decoding and every write to
// it live here and nowhere else.
package regionid

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/snowflake"
)

// Sentinels a caller matches with errors.Is. Every error of this package
// that concerns a stored value wraps one of them.
var (
	// ErrCorrupt: a stored record or registry value is not exactly what this
	// version writes. It is never read as a default.
	ErrCorrupt = errors.New("corrupt")
	// ErrMismatch: the record names another region code or layout than the
	// replica's.
	ErrMismatch = errors.New("region mismatch")
	// ErrNoRecord: the etcd cluster has no region record.
	ErrNoRecord = errors.New("no region record")
	// ErrRestorePending: the region's etcd was restored (or may have been)
	// and no restore fence has run since; nothing may be granted.
	ErrRestorePending = errors.New("restore pending")
	// ErrClaimTaken: the registry holds the region code for another region
	// id.
	ErrClaimTaken = errors.New("region code claimed by another region")
)

// RecordVersion is the only record format this package reads and writes.
const RecordVersion = 1

// LayoutVersion is the ID layout the record pins: format version 1 of
// docs/id-layout.md. A replica of another layout refuses the record.
const LayoutVersion = 1

// KeySuffix is the record's key under the deployment's key prefix.
const KeySuffix = "region"

// Key is the record's etcd key under prefix.
func Key(prefix string) string { return prefix + KeySuffix }

// Record is the value of Key: one JSON object whose fields appear in this
// order, without unknown or missing fields (Decode is strict).
type Record struct {
	Version int `json:"v"`
	// Region is the region code 0..3 this etcd cluster serves.
	Region int `json:"region"`
	// RegionID is 32 lowercase hex digits, random, written once by the
	// region's first start: two regions that claim the same code are told
	// apart by it.
	RegionID      string `json:"region_id"`
	CreatedUnixMs int64  `json:"created_unix_ms"`
	// Layout is the ID layout version (LayoutVersion).
	Layout int `json:"layout"`
	// EtcdClusterID is the etcd cluster (hex) the record was created or last
	// fenced on. A replica that finds another cluster id treats the cluster
	// as restored from a backup.
	EtcdClusterID string `json:"etcd_cluster_id"`
	// RegistryClaimedUnixMs is when the registry last confirmed this
	// region's claim on its code (0: never); RegistryClusterID the registry's
	// etcd cluster (hex, "" when never confirmed).
	RegistryClaimedUnixMs int64  `json:"registry_claimed_unix_ms"`
	RegistryClusterID     string `json:"registry_cluster_id"`
	// RestorePending stops every grant of the region until a restore fence
	// clears it; RestoreReason says why it was set, RestoreSinceUnixMs when.
	RestorePending     bool   `json:"restore_pending"`
	RestoreReason      string `json:"restore_reason"`
	RestoreSinceUnixMs int64  `json:"restore_since_unix_ms"`
	// FencedUnixMs is when the last restore fence finished (0: never);
	// FencedToUnixMs the time every high-water mark was lifted to.
	FencedUnixMs   int64 `json:"fenced_unix_ms"`
	FencedToUnixMs int64 `json:"fenced_to_unix_ms"`
}

// maxReasonLen bounds RestoreReason (bytes).
const maxReasonLen = 512

// NewRegionID is 16 random bytes in lowercase hex.
func NewRegionID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", errors.Newf("region id: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// ClusterHex is an etcd cluster id as the record stores it (16 hex digits,
// as etcdctl prints it).
func ClusterHex(id uint64) string { return fmt.Sprintf("%016x", id) }

// Validate checks every field's rule; the error wraps ErrCorrupt and names
// the field.
func (r Record) Validate() error {
	bad := func(field, format string, args ...any) error {
		return errors.Newf("region record: %s %s: %w", field, fmt.Sprintf(format, args...), ErrCorrupt)
	}
	switch {
	case r.Version != RecordVersion:
		return bad("v", "is %d, this release reads %d", r.Version, RecordVersion)
	case r.Region < 0 || r.Region > snowflake.MaxRegion:
		return bad("region", "%d not in 0..%d", r.Region, snowflake.MaxRegion)
	case !isHex(r.RegionID, 32):
		return bad("region_id", "%q is not 32 lowercase hex digits", clip(r.RegionID))
	case r.CreatedUnixMs <= 0:
		return bad("created_unix_ms", "%d is not positive", r.CreatedUnixMs)
	case r.Layout < 1:
		return bad("layout", "%d is not positive", r.Layout)
	case !isHex(r.EtcdClusterID, 16):
		return bad("etcd_cluster_id", "%q is not 16 lowercase hex digits", clip(r.EtcdClusterID))
	case r.RegistryClaimedUnixMs < 0 || (r.RegistryClaimedUnixMs == 0) != (r.RegistryClusterID == ""):
		return bad("registry_claimed_unix_ms", "%d does not agree with registry_cluster_id %q", r.RegistryClaimedUnixMs, clip(r.RegistryClusterID))
	case r.RegistryClusterID != "" && !isHex(r.RegistryClusterID, 16):
		return bad("registry_cluster_id", "%q is not 16 lowercase hex digits", clip(r.RegistryClusterID))
	case r.RestorePending && (r.RestoreReason == "" || r.RestoreSinceUnixMs <= 0):
		return bad("restore_pending", "is set without a reason and a time")
	case !r.RestorePending && (r.RestoreReason != "" || r.RestoreSinceUnixMs != 0):
		return bad("restore_reason", "is set while no restore is pending")
	case len(r.RestoreReason) > maxReasonLen || strings.ContainsAny(r.RestoreReason, "\n\r"):
		return bad("restore_reason", "is longer than %d bytes or has a line break", maxReasonLen)
	case r.FencedUnixMs < 0 || r.FencedToUnixMs < 0 || (r.FencedUnixMs == 0) != (r.FencedToUnixMs == 0):
		return bad("fenced_unix_ms", "%d does not agree with fenced_to_unix_ms %d", r.FencedUnixMs, r.FencedToUnixMs)
	}
	return nil
}

// Encode is the stored form of r (after Validate).
func (r Record) Encode() ([]byte, error) {
	if err := r.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(r)
}

// Decode parses a stored record. It accepts exactly what Encode writes: a
// value that differs in field order, spacing, unknown or missing fields, or
// breaks a rule of Validate wraps ErrCorrupt.
func Decode(b []byte) (Record, error) {
	var r Record
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		return Record{}, errors.Newf("region record %q: %v: %w", clip(string(b)), oneLine(err), ErrCorrupt)
	}
	if dec.More() {
		return Record{}, errors.Newf("region record %q: trailing data: %w", clip(string(b)), ErrCorrupt)
	}
	if err := r.Validate(); err != nil {
		return Record{}, err
	}
	if again, _ := json.Marshal(r); !bytes.Equal(again, b) {
		return Record{}, errors.Newf("region record %q: not in canonical form (field order, spacing or a missing field): %w", clip(string(b)), ErrCorrupt)
	}
	return r, nil
}

// Match checks that the record serves region with this release's layout;
// the error wraps ErrMismatch and names both codes.
func (r Record) Match(region int) error {
	if r.Region != region {
		return errors.Newf("this etcd holds region %d (region id %s), but the replica was started with --region %d: %w", r.Region, r.RegionID, region, ErrMismatch)
	}
	if r.Layout != LayoutVersion {
		return errors.Newf("region %d uses ID layout version %d, this release mints layout %d: %w", r.Region, r.Layout, LayoutVersion, ErrMismatch)
	}
	return nil
}

// Pending is ErrRestorePending with the record's reason, or nil.
func (r Record) Pending() error {
	if !r.RestorePending {
		return nil
	}
	return errors.Newf("region %d: %w since %d (unix ms): %s; run `rangesvc admin restore-fence`", r.Region, ErrRestorePending, r.RestoreSinceUnixMs, r.RestoreReason)
}

// registryValuePrefix starts a registry claim value: "v1:<region id>".
const registryValuePrefix = "v1:"

// EncodeClaim is the registry's value for a claim of regionID.
func EncodeClaim(regionID string) string { return registryValuePrefix + regionID }

// DecodeClaim parses a registry claim value strictly (ErrCorrupt).
func DecodeClaim(b []byte) (string, error) {
	s, ok := strings.CutPrefix(string(b), registryValuePrefix)
	if !ok || !isHex(s, 32) {
		return "", errors.Newf("registry claim %q: want %q and 32 lowercase hex digits: %w", clip(string(b)), registryValuePrefix, ErrCorrupt)
	}
	return s, nil
}

func isHex(s string, n int) bool {
	if len(s) != n {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// clip shortens a value for an error message.
func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "..."
	}
	return s
}

func oneLine(err error) string {
	return strings.ReplaceAll(strings.ReplaceAll(err.Error(), "\n", " "), "\r", " ")
}

// parseRegionKey returns the region of a key P+"r<region>/...", ok false
// when the key is not of that form.
func parseRegionKey(key, prefix string) (int, bool) {
	s, ok := strings.CutPrefix(key, prefix+"r")
	if !ok {
		return 0, false
	}
	num, _, ok := strings.Cut(s, "/")
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(num)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

var errorsIs = errors.Is
