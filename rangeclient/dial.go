package rangeclient

import (
	"strings"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/resolver"
	"google.golang.org/grpc/resolver/manual"
)

// dial opens one gRPC connection over all of cfg.Targets: a static resolver
// lists them, round_robin spreads calls over the ready ones and skips the
// ones that are down, and gRPC reconnects each with exponential backoff.
func dial(cfg Config) (*grpc.ClientConn, error) {
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  cfg.BackoffBase,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   cfg.BackoffMax,
			},
		}),
		grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`),
	}
	target := cfg.Targets[0]
	if !strings.Contains(target, "://") {
		r := manual.NewBuilderWithScheme("idrange-static")
		addrs := make([]resolver.Address, len(cfg.Targets))
		for i, t := range cfg.Targets {
			addrs[i] = resolver.Address{Addr: t}
		}
		r.InitialState(resolver.State{Addresses: addrs})
		opts = append(opts, grpc.WithResolvers(r))
		target = r.Scheme() + ":///rangesvc"
	}
	opts = append(opts, cfg.DialOptions...)
	return grpc.NewClient(target, opts...)
}
