package main

import (
	"crypto/tls"
	"flag"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/regionid"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/tlsfiles"
)

// regionFlags are serve's region identity flags (docs/operations/region-identity.md,
// "Region identity, registry, backup and restore").
type regionFlags struct {
	// InitRegion (--init-region) lets this replica write the region record
	// into an external etcd that has none: the first start of a region on
	// a new cluster. The embedded etcd is new by construction and is always
	// initialised.
	InitRegion bool
	// Restored (--restored) marks the region restore-pending at start: its
	// etcd was restored from a backup; nothing is granted until `rangesvc
	// admin restore-fence`.
	Restored bool
	// RegistryEtcd (--registry-etcd host:port,...) is the etcd where every
	// region claims its code; RegistryPrefix (--registry-prefix) its key
	// prefix, RegistryCheckInterval (--registry-check-interval) how often
	// the claim is confirmed.
	RegistryEtcd          []string
	RegistryPrefix        string
	RegistryCheckInterval time.Duration
	// RegistryCACert, RegistryCert, RegistryKey (--registry-cacert,
	// --registry-cert, --registry-key) are TLS to the registry, as the
	// --etcd-* options are to the region's etcd; any of them (or an
	// https:// endpoint) turns TLS on.
	RegistryCACert, RegistryCert, RegistryKey string

	// registryTLS is what validate loaded (allocated by register, so
	// copies of the flags share it).
	registryTLS **tls.Config
}

func (f *regionFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.InitRegion, "init-region", false, "write the region record into an external etcd that has none (a region's first start on a new cluster)")
	fs.BoolVar(&f.Restored, "restored", false, "this etcd was restored from a backup: mark the region restore-pending (no grants until `rangesvc admin restore-fence`)")
	fs.Func("registry-etcd", "registry etcd endpoints host:port[,host:port...] where the region claims its code (optional)", func(s string) error {
		f.RegistryEtcd = nil
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				f.RegistryEtcd = append(f.RegistryEtcd, e)
			}
		}
		if len(f.RegistryEtcd) == 0 {
			return errors.Newf("no endpoints in %q", s)
		}
		return nil
	})
	fs.StringVar(&f.RegistryPrefix, "registry-prefix", regionid.DefaultRegistryPrefix, "key prefix of region claims in the registry etcd")
	fs.DurationVar(&f.RegistryCheckInterval, "registry-check-interval", region.DefaultRegistryCheckInterval, "how often the registry claim is confirmed")
	fs.StringVar(&f.RegistryCACert, "registry-cacert", "", "PEM CA bundle that verifies the registry etcd's certificate")
	fs.StringVar(&f.RegistryCert, "registry-cert", "", "PEM client certificate for the registry etcd")
	fs.StringVar(&f.RegistryKey, "registry-key", "", "PEM key of --registry-cert")
	f.registryTLS = new(*tls.Config)
}

func (f regionFlags) validate() error {
	for i, e := range f.RegistryEtcd {
		if err := checkEndpoint(e); err != nil {
			return errors.Newf("--registry-etcd endpoint %d: %w", i+1, err)
		}
	}
	if err := etcdstore.ValidatePrefix(f.RegistryPrefix); err != nil {
		return errors.Newf("--registry-prefix: %w", err)
	}
	if f.RegistryCheckInterval < time.Second {
		return errors.Newf("--registry-check-interval %v must be at least 1s", f.RegistryCheckInterval)
	}
	https := false
	for _, e := range f.RegistryEtcd {
		https = https || strings.HasPrefix(e, "https://")
	}
	tlsSet := f.RegistryCACert != "" || f.RegistryCert != "" || f.RegistryKey != ""
	switch {
	case tlsSet && len(f.RegistryEtcd) == 0:
		return errors.Newf("--registry-cacert, --registry-cert and --registry-key need --registry-etcd")
	case !tlsSet && !https:
		return nil
	}
	var set []string
	for _, fl := range []struct{ name, value string }{
		{"--registry-cacert", f.RegistryCACert}, {"--registry-cert", f.RegistryCert}, {"--registry-key", f.RegistryKey},
	} {
		if fl.value != "" {
			set = append(set, fl.name)
		}
	}
	if err := plaintextEndpoint("--registry-etcd", f.RegistryEtcd, set); err != nil {
		return err
	}
	tc, err := tlsfiles.Files{Cert: f.RegistryCert, Key: f.RegistryKey, CA: f.RegistryCACert}.ClientConfig()
	if err != nil {
		var fe *tlsfiles.FileError
		if errors.As(err, &fe) {
			flag := map[string]string{"cert": "--registry-cert", "key": "--registry-key", "ca": "--registry-cacert"}[fe.Role]
			return errors.Newf("%s: %v", flag, err)
		}
		return errors.Newf("registry TLS: %v", err)
	}
	if f.registryTLS != nil {
		*f.registryTLS = tc
	}
	return nil
}

// openRegistry is the registry's etcd client, or nil without
// --registry-etcd. It does not wait for the registry: an unreachable
// registry is the replica's decision (region.ReplicaConfig.RegistryEtcd).
func (f regionFlags) openRegistry(timeout time.Duration) (*clientv3.Client, error) {
	if len(f.RegistryEtcd) == 0 {
		return nil, nil
	}
	cfg := clientv3.Config{Endpoints: f.RegistryEtcd, DialTimeout: timeout}
	if f.registryTLS != nil {
		cfg.TLS = *f.registryTLS
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, errors.Newf("--registry-etcd %s: %w", strings.Join(f.RegistryEtcd, ","), err)
	}
	return cli, nil
}

// applyReplica sets the replica's region identity options.
func (f regionFlags) applyReplica(rc *region.ReplicaConfig, embedded bool, registry *clientv3.Client) {
	rc.InitRegion = f.InitRegion || embedded
	rc.Restored = f.Restored
	rc.RegistryEtcd, rc.RegistryPrefix, rc.RegistryCheckInterval = registry, f.RegistryPrefix, f.RegistryCheckInterval
}
