package comparerun

import (
	"context"
	"time"

	bwsnow "github.com/bwmarrin/snowflake"
	"github.com/cockroachdb/errors"
	"github.com/sony/sonyflake/v2"

	"github.com/idrange/idrange/snowflake"
)

// The peers are the libraries a user would pick instead of idrange, run as
// they ship (their own layouts, epochs and waits) with a static node or
// machine ID per instance, as their users assign them.

// BwmarrinNode is the node ID of the bwmarrin strategy (any of 0..1023).
const BwmarrinNode = 1

// Bwmarrin is github.com/bwmarrin/snowflake with its defaults: 41-bit
// milliseconds since 2010-11-04 (Twitter's epoch), a 10-bit node, a 12-bit
// step, so 4,096 IDs/ms per node. Node.Generate takes a mutex and
// busy-waits when a millisecond's steps are used up. It reads the monotonic
// clock from NewNode on and keeps no ceiling: a restart with the clock set
// back can repeat IDs.
func Bwmarrin() Strategy {
	return peerStrategy{NewStrategy(Info{
		Name: BwmarrinName, Description: "github.com/bwmarrin/snowflake Node.Generate, static node, no network",
		Bits: 64, BytesPerID: 8, Deterministic: true, TimeOrdered: true,
	}, func(context.Context, Env) (Instance, error) {
		n, err := bwsnow.NewNode(BwmarrinNode)
		if err != nil {
			return nil, errors.Wrap(err, "bwmarrin/snowflake NewNode")
		}
		return bwmarrinInstance{n}, nil
	}), func(id int64) time.Time { return time.UnixMilli(bwsnow.ParseInt64(id).Time()) }}
}

// peerStrategy is a strategy minting in a peer library's layout, with the
// library's decoder of an ID's time.
type peerStrategy struct {
	Strategy
	decode func(id int64) time.Time
}

var _ TimeDecoder = peerStrategy{}

func (p peerStrategy) IDTime(id int64) time.Time { return p.decode(id) }

type bwmarrinInstance struct{ n *bwsnow.Node }

func (b bwmarrinInstance) Worker() Worker { return b }
func (bwmarrinInstance) Calls() Calls     { return Calls{} }
func (bwmarrinInstance) Close() error     { return nil }

func (b bwmarrinInstance) Mint(_ context.Context, n int, out *Batch) error {
	for range n {
		out.IDs = append(out.IDs, snowflake.ID(b.n.Generate()))
	}
	return nil
}

// SonyflakeMachine is the machine ID of the sonyflake strategy (any of
// 0..65535).
const SonyflakeMachine = 1

// SonyflakeSettings are sonyflake v2's defaults (39 bits of 10 ms units
// since 2025-01-01 UTC, an 8-bit sequence, a 16-bit machine ID) with a
// static machine ID instead of the low 16 bits of a private IP address.
func SonyflakeSettings() sonyflake.Settings {
	return sonyflake.Settings{MachineID: func() (int, error) { return SonyflakeMachine, nil }}
}

// Sonyflake is github.com/sony/sonyflake/v2 with its defaults: 39 bits of
// 10 ms units, an 8-bit sequence and a 16-bit machine ID, so 256 IDs per
// 10 ms, 25,600 IDs/s per instance (machine ID). NextID takes a mutex and,
// when a unit's sequences are used up, sleeps to the next unit holding it.
// It reads the wall clock and keeps no ceiling.
func Sonyflake() Strategy {
	dec, decErr := sonyflake.New(SonyflakeSettings())
	decode := func(int64) time.Time { return time.Time{} } // Start fails with decErr
	if decErr == nil {
		decode = dec.ToTime
	}
	return peerStrategy{NewStrategy(Info{
		Name: SonyflakeName, Description: "github.com/sony/sonyflake/v2 NextID, static machine ID, no network",
		Bits: 64, BytesPerID: 8, Deterministic: true, TimeOrdered: true,
	}, func(context.Context, Env) (Instance, error) {
		if decErr != nil {
			return nil, errors.Wrap(decErr, "sonyflake.New")
		}
		sf, err := sonyflake.New(SonyflakeSettings())
		if err != nil {
			return nil, errors.Wrap(err, "sonyflake.New")
		}
		return sonyflakeInstance{sf}, nil
	}), decode}
}

type sonyflakeInstance struct{ sf *sonyflake.Sonyflake }

func (s sonyflakeInstance) Worker() Worker { return s }
func (sonyflakeInstance) Calls() Calls     { return Calls{} }
func (sonyflakeInstance) Close() error     { return nil }

func (s sonyflakeInstance) Mint(_ context.Context, n int, out *Batch) error {
	for range n {
		id, err := s.sf.NextID()
		if err != nil {
			return errors.Wrap(err, "sonyflake NextID")
		}
		out.IDs = append(out.IDs, snowflake.ID(id))
	}
	return nil
}
