package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/vanguard"
	"github.com/cockroachdb/errors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/service"
)

// defaultHTTP is --http's default: the HTTP/JSON API (GET /v1/ids).
const defaultHTTP = "127.0.0.1:7071"

// httpAPIPrefix is the path prefix of range.proto's google.api.http
// bindings; only these routes are served on --http.
const httpAPIPrefix = "/v1/"

// httpMintPath is MintBatch's route (range.proto: get "/v1/ids"), whose
// count parameter is checked here before transcoding: see checkHTTPCount.
const httpMintPath = httpAPIPrefix + "ids"

// maxHTTPMessage bounds one transcoded message: the largest MintBatch
// response (service.MaxMintBatch IDs, about 1 MB of protobuf) with room.
const maxHTTPMessage = 8 << 20

// httpAPI is serve's HTTP/JSON API server (--http): range.proto's
// google.api.http bindings, transcoded by connectrpc.com/vanguard into
// calls on the replica's own gRPC server, so the HTTP API runs the same
// handlers, validation, interceptors and error mapping as gRPC. Only the
// REST routes are served (not Connect or gRPC-Web for every method).
type httpAPI struct {
	srv *http.Server
	lis net.Listener
}

// startHTTPAPI listens on addr (empty: disabled, returns nil) and serves
// until stop, with lim's connection cap and timeouts. secure wraps the
// listener with the gRPC port's TLS (mutual TLS included), so HTTP callers
// pass the same identity checks as gRPC ones: the transcoded call carries
// the request's verified certificate. Failures after the start go to errc.
func startHTTPAPI(addr string, lim connLimits, secure func(net.Listener) net.Listener, gs *grpc.Server, errc chan<- error, log *slog.Logger) (*httpAPI, error) {
	if addr == "" {
		return nil, nil
	}
	h, err := newHTTPHandler(gs)
	if err != nil {
		return nil, err
	}
	capped, err := lim.listen("--http", addr, "http", 0)
	if err != nil {
		return nil, err
	}
	lis := secure(capped)
	a := &httpAPI{lis: lis, srv: lim.httpServer(h, noProbes, log.With("component", "http-api"))}
	go func() {
		if err := a.srv.Serve(lis); !errors.Is(err, http.ErrServerClosed) {
			errc <- errors.Wrap(err, "http api server")
		}
	}()
	log.Info("http api listening", "http", lis.Addr().String())
	return a, nil
}

// stop lets in-flight requests finish for up to grace, then closes them.
// Call it before the gRPC server stops: requests are served by it.
func (a *httpAPI) stop(grace time.Duration) {
	if a == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), grace)
	defer cancel()
	if err := a.srv.Shutdown(ctx); err != nil {
		a.srv.Close()
	}
}

// newHTTPHandler transcodes range.proto's HTTP bindings to gs.
func newHTTPHandler(gs *grpc.Server) (http.Handler, error) {
	svc := vanguard.NewService(idrangev1.RangeService_ServiceDesc.ServiceName, gs,
		vanguard.WithTargetProtocols(vanguard.ProtocolGRPC),
		vanguard.WithTargetCodecs(vanguard.CodecProto),
		vanguard.WithMaxMessageBufferBytes(maxHTTPMessage))
	tc, err := vanguard.NewTranscoder([]*vanguard.Service{svc})
	if err != nil {
		return nil, errors.Wrap(err, "http api transcoder")
	}
	mux := http.NewServeMux()
	mux.Handle(httpAPIPrefix, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Every response is freshly minted: never cache one (GET is
		// the binding's verb, for curl and the anchors' habits).
		w.Header().Set("Cache-Control", "no-store")
		if r.URL.Path == httpMintPath {
			if msg := checkHTTPCount(r.URL); msg != "" {
				writeJSONError(w, http.StatusBadRequest, codes.InvalidArgument, msg)
				return
			}
		}
		tc.ServeHTTP(w, r)
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSONError(w, http.StatusNotFound, codes.NotFound,
			fmt.Sprintf("no route for %s %s; the HTTP API is GET %sids?count=N", r.Method, r.URL.Path, httpAPIPrefix))
	})
	return mux, nil
}

// checkHTTPCount checks the query of a MintBatch request before it is
// transcoded: a parameter other than count, or a count that is missing,
// repeated or not a decimal integer, gets a one-line message in the
// service's form ("count: ...") instead of the transcoder's parser's words (`invalid parameter "count": invalid
// character 'a' ...`) or, for a missing count, a call with count 0. A count
// strconv.ParseInt reads ("+5", "007") is rewritten in the canonical form
// the transcoder's JSON parser takes. The range 1..MaxMintBatch stays the
// service's check, so gRPC and HTTP callers get the same message for it.
// It returns "" when the request may go on.
func checkHTTPCount(u *url.URL) string {
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return fmt.Sprintf("query string: %v", err)
	}
	want := fmt.Sprintf("want %s?count=N, N in 1..%d", httpMintPath, service.MaxMintBatch)
	for _, k := range slices.Sorted(maps.Keys(q)) {
		if k != "count" { // the transcoder would answer 500 Unknown
			return fmt.Sprintf("%q: unknown parameter; %s", clip(k), want)
		}
	}
	vs, ok := q["count"]
	switch {
	case !ok:
		return "count: missing; " + want
	case len(vs) > 1:
		return fmt.Sprintf("count: given %d times; %s", len(vs), want)
	}
	n, err := strconv.ParseInt(vs[0], 10, 64)
	switch {
	case errors.Is(err, strconv.ErrRange) && isDecimal(vs[0]):
		return fmt.Sprintf("count: %s not in 1..%d", clip(vs[0]), service.MaxMintBatch)
	case err != nil:
		return fmt.Sprintf("count: %q is not an integer; %s", clip(vs[0]), want)
	}
	q.Set("count", strconv.FormatInt(n, 10))
	u.RawQuery = q.Encode()
	return ""
}

// isDecimal reports whether s is an optional sign and decimal digits only:
// strconv reports ErrRange for a number too large for int64 before it
// looks at what follows it ("20000000000000000000\n"), and only a plain
// number may be quoted unquoted in a one-line message.
func isDecimal(s string) bool {
	if s != "" && (s[0] == '+' || s[0] == '-') {
		s = s[1:]
	}
	return s != "" && strings.Trim(s, "0123456789") == ""
}

// clip shortens what a caller sent to at most 40 bytes for an error
// message, so the message stays short whatever was sent.
func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "..."
	}
	return s
}

// writeJSONError writes the error body the transcoder writes for RPC
// errors ({"code": <gRPC code>, "message": "..."}), for the routes it does
// not own.
func writeJSONError(w http.ResponseWriter, status int, code codes.Code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    codes.Code `json:"code"`
		Message string     `json:"message"`
	}{code, msg})
}
