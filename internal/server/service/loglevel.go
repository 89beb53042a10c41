package service

import (
	"log/slog"

	"google.golang.org/grpc/codes"
)

// logLevel is the level a refused call is logged at, by its status code:
// Debug for what the caller asked or did (a bad field, over a bound, gone,
// not served here), Error for what must never happen (data loss, an
// internal fault), Warn for the rest (the store or a peer unavailable).
// Both the unary RPCs and AllocateSharedBatch's requests use it.
func logLevel(c codes.Code) slog.Level {
	switch c {
	case codes.InvalidArgument, codes.ResourceExhausted, codes.Canceled, codes.Unimplemented:
		return slog.LevelDebug
	case codes.DataLoss, codes.Internal:
		return slog.LevelError
	}
	return slog.LevelWarn
}
