// Package snowflake is idrange's 64-bit ID: its layout, decoding, and a pure
// local generator for one statically assigned worker code.
//
//	gen, err := snowflake.NewGenerator(snowflake.Config{
//		Region: 1, Worker: 42,
//		HighWater: snowflake.NewFileHighWater("/var/lib/app/r1-w42.hwm"),
//	})
//	...
//	id, err := gen.Next(ctx)
//	p := id.Parts() // p.Time, p.Region, p.Worker, p.Sequence
//
// An ID is a positive int64 (format version 1):
//
//	0 | timestamp (41 bits, ms since Epoch) | region (2) | worker (8) | sequence (12)
//
// so 4,096 IDs per millisecond per worker code, 4 regions of 256 workers, and
// 69.7 years from Epoch (2026-01-01T00:00:00Z) to EndOfLife. docs/id-layout.md
// derives the widths; any other layout is a new format version.
//
// The package imports only the standard library. Errors a caller acts on are
// sentinels matched with errors.Is.
package snowflake
