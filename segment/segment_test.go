package segment_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

func TestLeaseValidate(t *testing.T) {
	good := segment.Lease{Region: 3, Worker: 255, Token: 1, LeaseID: 1}
	if err := good.Validate(); err != nil {
		t.Fatalf("Validate(%+v) = %v", good, err)
	}
	with := func(f func(*segment.Lease)) segment.Lease { l := good; f(&l); return l }
	for _, c := range []struct {
		field string
		l     segment.Lease
	}{
		{"region", with(func(l *segment.Lease) { l.Region = -1 })},
		{"region", with(func(l *segment.Lease) { l.Region = 4 })},
		{"worker", with(func(l *segment.Lease) { l.Worker = -1 })},
		{"worker", with(func(l *segment.Lease) { l.Worker = 256 })},
		{"token", with(func(l *segment.Lease) { l.Token = 0 })},
		{"token", with(func(l *segment.Lease) { l.Token = -1 })},
		{"lease_id", with(func(l *segment.Lease) { l.LeaseID = 0 })},
		{"lease_id", with(func(l *segment.Lease) { l.LeaseID = -7 })}, // etcd lease ids are positive
	} {
		if err := c.l.Validate(); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Validate(%+v) = %v; want ErrInvalid naming %s", c.l, err, c.field)
		}
	}
}

func TestBlockCheck(t *testing.T) {
	l := segment.Lease{Region: 1, Worker: 7, Token: 5, LeaseID: 9}
	now := snowflake.MsTime(1_000_000)
	lo := int64(1_000_000) << snowflake.SequenceBits
	good := segment.Block{Region: 1, Worker: 7, Lo: lo, Hi: lo + 100, ServiceTime: now, ValidUntil: segment.ValidUntil(lo + 100)}
	if err := good.Check(l, 100); err != nil {
		t.Fatalf("Check(%+v) = %v", good, err)
	}
	with := func(f func(*segment.Block)) segment.Block { b := good; f(&b); return b }
	for _, c := range []struct {
		why string
		b   segment.Block
	}{
		{"code", with(func(b *segment.Block) { b.Worker = 8 })},
		{"code", with(func(b *segment.Block) { b.Region = 2 })},
		{"lo", with(func(b *segment.Block) { b.Lo = 0; b.Hi = 10 })},
		{"lo", with(func(b *segment.Block) { b.Lo = -5; b.Hi = 10 })},
		{"hi", with(func(b *segment.Block) { b.Hi = b.Lo })},
		{"epoch", with(func(b *segment.Block) { b.Lo = segment.EndL - 10; b.Hi = segment.EndL + 1 })},
		{"asked", with(func(b *segment.Block) { b.Hi = b.Lo + 101 })},
		{"missing", with(func(b *segment.Block) { b.ServiceTime = time.Time{} })},
		{"missing", with(func(b *segment.Block) { b.ValidUntil = time.Time{} })},
		{"before the epoch", with(func(b *segment.Block) { b.ServiceTime = snowflake.Epoch.Add(-time.Second) })},
		{"not after", with(func(b *segment.Block) { b.ValidUntil = b.ServiceTime })},
	} {
		if err := c.b.Check(l, 100); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), c.why) {
			t.Errorf("Check(%+v) = %v; want ErrInvalid mentioning %q", c.b, err, c.why)
		}
	}
	// The last unit of the epoch is a valid block.
	last := with(func(b *segment.Block) {
		b.Lo = segment.EndL - 1
		b.Hi = segment.EndL
		b.ValidUntil = segment.ValidUntil(b.Hi)
	})
	if err := last.Check(l, 1); err != nil {
		t.Errorf("Check(last unit) = %v", err)
	}
}

func TestValidateOwner(t *testing.T) {
	for _, ok := range []string{"", "host-a/4242", strings.Repeat("é", segment.MaxOwnerLen/2)} {
		if err := segment.ValidateOwner(ok); err != nil {
			t.Errorf("ValidateOwner(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"bad\nowner", strings.Repeat("x", segment.MaxOwnerLen+1), "\xff"} {
		if err := segment.ValidateOwner(bad); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "owner") {
			t.Errorf("ValidateOwner(%q) = %v; want ErrInvalid naming owner", bad, err)
		}
	}
}
