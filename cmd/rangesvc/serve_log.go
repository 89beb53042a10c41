package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync/atomic"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc/grpclog"

	"github.com/idrange/idrange/internal/server/cli"
)

// Log formats of --log-format.
const (
	logText = "text"
	logJSON = "json"
)

// newLogger is serve's logger: one line per event in the chosen format
// (slog's logfmt-like text or JSON) on w. Error values render as
// err.Error(): slog's text handler would print them with %+v, which for
// cockroachdb/errors is a multi-line stack trace (see oneLineErrors).
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level, ReplaceAttr: oneLineErrors}
	if format == logJSON {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// oneLineErrors renders error attributes as their message, and durations
// as "1.5s" in both formats (JSON would print nanoseconds).
func oneLineErrors(_ []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindAny:
		if err, ok := a.Value.Any().(error); ok && err != nil {
			a.Value = slog.StringValue(err.Error())
		}
	case slog.KindDuration:
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// etcdLogger is the embedded etcd's logger: its entries at error level and
// above go through serve's slog handler (so they come out in serve's format,
// with component=etcd), and quiet() drops everything from just before an
// orderly stop, which etcd logs as errors. etcd's Fatal entries end the
// process through fatalExit, which says why first.
func etcdLogger(log *slog.Logger) (lg *zap.Logger, quiet func()) {
	return etcdLoggerExiting(log, os.Exit)
}

// etcdLoggerExiting is etcdLogger with the exit function (tests pass one
// that does not exit).
func etcdLoggerExiting(log *slog.Logger, exit func(int)) (lg *zap.Logger, quiet func()) {
	var stopping atomic.Bool
	core := slogCore{h: log.With("component", "etcd").Handler(), level: zapcore.ErrorLevel}
	return zap.New(quietCore{Core: core, stopping: &stopping}, zap.WithFatalHook(fatalExit{log: log, exit: exit})),
		func() { stopping.Store(true) }
}

// fatalExit is the embedded etcd's fatal hook. etcd calls Fatal, which
// exits, where it cannot go on: a file it cannot open or write (for
// example "too many open files" in its WAL purge loop) or a raft state it
// cannot save. Without the hook the process exited 1 with only etcd's own
// error line; with it, serve logs "serve failed" with etcd's message, as
// every other exit of serve does, then exits 1.
type fatalExit struct {
	log  *slog.Logger
	exit func(int)
}

func (h fatalExit) OnWrite(ce *zapcore.CheckedEntry, fs []zapcore.Field) {
	cause := "embedded etcd: " + ce.Message
	for _, a := range zapAttrs(fs) {
		if a.Key == "error" {
			cause += ": " + a.Value.String()
		}
	}
	h.log.Error("serve failed", "err", cause)
	h.exit(cli.ExitFailure)
}

// quietCore drops every entry once stopping is set.
type quietCore struct {
	zapcore.Core
	stopping *atomic.Bool
}

func (c quietCore) With(f []zapcore.Field) zapcore.Core {
	return quietCore{Core: c.Core.With(f), stopping: c.stopping}
}

func (c quietCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.stopping.Load() {
		return ce
	}
	return c.Core.Check(e, ce)
}

// slogCore is a zapcore.Core that hands zap entries to a slog.Handler.
// Fields become attributes; zap's "<key>Verbose" rendering of errors (their
// %+v, a stack trace) and "stacktrace" fields are dropped, so every entry
// stays one line.
type slogCore struct {
	h     slog.Handler
	level zapcore.LevelEnabler
}

var _ zapcore.Core = slogCore{}

func (c slogCore) Enabled(l zapcore.Level) bool { return c.level.Enabled(l) }

func (c slogCore) With(fs []zapcore.Field) zapcore.Core {
	return slogCore{h: c.h.WithAttrs(zapAttrs(fs)), level: c.level}
}

func (c slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c slogCore) Write(e zapcore.Entry, fs []zapcore.Field) error {
	lvl := slogLevel(e.Level)
	ctx := context.Background()
	if !c.h.Enabled(ctx, lvl) {
		return nil
	}
	r := slog.NewRecord(e.Time, lvl, e.Message, 0)
	if e.LoggerName != "" {
		r.AddAttrs(slog.String("logger", e.LoggerName))
	}
	r.AddAttrs(zapAttrs(fs)...)
	return c.h.Handle(ctx, r)
}

func (c slogCore) Sync() error { return nil }

// slogLevel maps zap's levels onto slog's; DPanic, Panic and Fatal are
// errors (zap itself panics or exits after writing them).
func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	}
	return slog.LevelError
}

// zapAttrs turns zap fields into slog attributes, in key order.
func zapAttrs(fs []zapcore.Field) []slog.Attr {
	if len(fs) == 0 {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range fs {
		f.AddTo(enc)
	}
	keys := make([]string, 0, len(enc.Fields))
	for k := range enc.Fields {
		if k == "stacktrace" {
			continue
		}
		if base, ok := strings.CutSuffix(k, "Verbose"); ok {
			if _, plain := enc.Fields[base]; plain {
				continue
			}
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	attrs := make([]slog.Attr, len(keys))
	for i, k := range keys {
		attrs[i] = slog.Any(k, enc.Fields[k])
	}
	return attrs
}

// grpcLog receives the gRPC library's own logs (grpclog) once serve has
// its logger; until then they go where gRPC's default logger sends them:
// errors to stderr, as text.
var grpcLog atomic.Pointer[slog.Logger]

// installGRPCLogger routes grpclog into grpcLog. grpclog.SetLoggerV2 must
// run before any gRPC call and is not safe for concurrent use, so main
// calls this once, first thing; serve then stores its logger in grpcLog.
func installGRPCLogger() {
	grpcLog.Store(newLogger(os.Stderr, logText, slog.LevelError).With("component", "grpc"))
	grpclog.SetLoggerV2(grpcLogger{})
}

// grpcLogger is a grpclog.LoggerV2 over grpcLog. gRPC's default shows only
// its errors; so does this at info level (its warnings are debug: a client
// that goes away is a warning to gRPC, routine to a server). Info goes
// nowhere, as by default.
type grpcLogger struct{}

var _ grpclog.LoggerV2 = grpcLogger{}

func (grpcLogger) log(l slog.Level, msg string) {
	if lg := grpcLog.Load(); lg != nil {
		lg.Log(context.Background(), l, strings.TrimSpace(msg))
	}
}

func (grpcLogger) Info(...any)                      {}
func (grpcLogger) Infoln(...any)                    {}
func (grpcLogger) Infof(string, ...any)             {}
func (g grpcLogger) Warning(args ...any)            { g.log(slog.LevelDebug, fmt.Sprint(args...)) }
func (g grpcLogger) Warningln(args ...any)          { g.log(slog.LevelDebug, fmt.Sprintln(args...)) }
func (g grpcLogger) Warningf(f string, args ...any) { g.log(slog.LevelDebug, fmt.Sprintf(f, args...)) }
func (g grpcLogger) Error(args ...any)              { g.log(slog.LevelError, fmt.Sprint(args...)) }
func (g grpcLogger) Errorln(args ...any)            { g.log(slog.LevelError, fmt.Sprintln(args...)) }
func (g grpcLogger) Errorf(f string, args ...any)   { g.log(slog.LevelError, fmt.Sprintf(f, args...)) }
func (g grpcLogger) Fatal(args ...any)              { g.Error(args...); os.Exit(1) }
func (g grpcLogger) Fatalln(args ...any)            { g.Errorln(args...); os.Exit(1) }
func (g grpcLogger) Fatalf(f string, args ...any)   { g.Errorf(f, args...); os.Exit(1) }
func (grpcLogger) V(l int) bool                     { return false }
