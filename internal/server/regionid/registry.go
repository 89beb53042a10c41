package regionid

import (
	"context"
	"fmt"

	"github.com/cockroachdb/errors"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DefaultRegistryPrefix is the key prefix of claims in a registry etcd.
const DefaultRegistryPrefix = "/idrange-registry/v1/"

// ClaimKey is the registry key of region code region.
func ClaimKey(prefix string, region int) string {
	return fmt.Sprintf("%sregion/%d", prefix, region)
}

// Claim claims region code rec.Region for rec.RegionID in the registry:
// create-if-absent, then a check of whoever holds the key. It returns the
// registry's etcd cluster id when the claim is this region's (new or
// confirmed). A claim held by another region id wraps ErrClaimTaken and
// names both ids; a corrupt claim value wraps ErrCorrupt. Any other error
// means the registry did not answer.
func Claim(ctx context.Context, reg *clientv3.Client, prefix string, rec Record) (uint64, error) {
	if prefix == "" {
		prefix = DefaultRegistryPrefix
	}
	key := ClaimKey(prefix, rec.Region)
	resp, err := reg.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(key), "=", 0)).
		Then(clientv3.OpPut(key, EncodeClaim(rec.RegionID))).
		Else(clientv3.OpGet(key)).Commit()
	if err != nil {
		return 0, errors.Newf("registry %v: claim %s: %w", reg.Endpoints(), key, err)
	}
	if resp.Succeeded {
		return resp.Header.ClusterId, nil
	}
	kvs := resp.Responses[0].GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return 0, errors.Newf("registry %v: claim %s vanished during the claim; retry", reg.Endpoints(), key)
	}
	holder, err := DecodeClaim(kvs[0].Value)
	if err != nil {
		return 0, errors.Newf("registry key %s: %w", key, err)
	}
	if holder != rec.RegionID {
		return 0, errors.Newf("registry key %s: region code %d is claimed by region id %s, this region is %s: %w", key, rec.Region, holder, rec.RegionID, ErrClaimTaken)
	}
	return resp.Header.ClusterId, nil
}
