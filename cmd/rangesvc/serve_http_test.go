package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/snowflake"
)

// httpGet fetches url and returns the status, Content-Type and body.
func httpGet(t *testing.T, url string) (int, string, []byte) {
	t.Helper()
	resp, body := testenv.HTTPGet(t, url, 30*time.Second)
	return resp.StatusCode, resp.Header.Get("Content-Type"), body
}

var mintedRE = regexp.MustCompile(`(?m)^idrange_service_minted_ids_total (\S+)$`)

// minted reads idrange_service_minted_ids_total from the replica.
func minted(t *testing.T, p *testenv.Process) float64 {
	t.Helper()
	m := mintedRE.FindStringSubmatch(p.Scrape(t))
	if m == nil {
		t.Fatal("idrange_service_minted_ids_total not exported")
	}
	v, err := strconv.ParseFloat(m[1], 64)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// The acceptance, against a real `rangesvc serve` over net/http:
// 10 calls of count=1000 give 10,000 unique IDs of the replica's region as
// JSON strings; count=0, -1, 1e9, abc and no count each give a 400 with a
// JSON error (gRPC code and the documented message), and mint nothing.
func TestHTTPMintAcceptance(t *testing.T) {
	const region = 2
	p := testenv.StartServe(t, testenv.ServeConfig{Region: region})
	if p.HTTPAddr == "" {
		t.Fatalf("no http api listening line in:\n%s", p.Stderr())
	}
	base := "http://" + p.HTTPAddr + "/v1/ids?count="

	// The answers README.md documents, word for word, from a real replica:
	// the HTTP handler's own (checkHTTPCount) and the service's range check.
	want := "want /v1/ids?count=N, N in 1..100000"
	bad := []struct{ query, msg string }{
		{"count=0", "count: 0 not in 1..100000"},
		{"count=-1", "count: -1 not in 1..100000"},
		{"count=1e9", `count: "1e9" is not an integer; ` + want},
		{"count=abc", `count: "abc" is not an integer; ` + want},
		{"", "count: missing; " + want},
	}
	bad = append(bad, readmeHTTPAnswers(t)...)
	badCounts := func() {
		t.Helper()
		for _, b := range bad {
			code, ctype, body := httpGet(t, "http://"+p.HTTPAddr+"/v1/ids?"+b.query)
			var e struct {
				Code    codes.Code `json:"code"`
				Message string     `json:"message"`
			}
			if err := json.Unmarshal(body, &e); err != nil {
				t.Fatalf("?%s: body %q is not a JSON error: %v", b.query, body, err)
			}
			if code != http.StatusBadRequest || !strings.HasPrefix(ctype, "application/json") ||
				e.Code != codes.InvalidArgument || e.Message != b.msg {
				t.Errorf("?%s: %d %s %+v; want 400 application/json, code %d, message %q",
					b.query, code, ctype, e, codes.InvalidArgument, b.msg)
			}
		}
	}
	// Bad counts first, on a replica that has minted nothing: none of
	// them reaches its minter (which holds its code from the start: the
	// shared path carves from it).
	badCounts()
	if n := minted(t, p); n != 0 {
		t.Fatalf("minted_ids_total = %v after bad counts only", n)
	}

	seen := make(map[snowflake.ID]bool, 10_000)
	for call := range 10 {
		code, ctype, body := httpGet(t, base+"1000")
		if code != http.StatusOK || !strings.HasPrefix(ctype, "application/json") {
			t.Fatalf("call %d: %d %s: %s", call, code, ctype, body)
		}
		var resp struct {
			IDs []json.RawMessage `json:"ids"`
		}
		if err := json.Unmarshal(body, &resp); err != nil {
			t.Fatalf("call %d: %v", call, err)
		}
		if len(resp.IDs) != 1000 {
			t.Fatalf("call %d: %d IDs, want 1000", call, len(resp.IDs))
		}
		ids := make([]snowflake.ID, len(resp.IDs))
		for i, raw := range resp.IDs {
			var s string
			if err := json.Unmarshal(raw, &s); err != nil {
				t.Fatalf("call %d: ID %s is not a JSON string", call, raw)
			}
			id, err := snowflake.Parse(s)
			if err != nil {
				t.Fatalf("call %d: ID %q: %v", call, s, err)
			}
			ids[i] = id
		}
		checkIDs(t, region, seen, ids)
	}
	if len(seen) != 10_000 {
		t.Fatalf("%d unique IDs, want 10000", len(seen))
	}
	if !strings.Contains(p.Stderr(), "lease acquired") {
		t.Fatal(`the minter's "lease acquired" log line is missing: the check above proves nothing`)
	}
	badCounts()
	if n := minted(t, p); n != 10_000 {
		t.Fatalf("minted_ids_total = %v, want 10000: bad counts minted", n)
	}

	// The limit itself is the service's, over HTTP too.
	code, _, body := httpGet(t, base+strconv.Itoa(service.MaxMintBatch+1))
	if code != http.StatusBadRequest || !strings.Contains(string(body), strconv.Itoa(service.MaxMintBatch)) {
		t.Fatalf("count=%d: %d %s; want 400 naming the limit", service.MaxMintBatch+1, code, body)
	}
	// Only the HTTP bindings are served: no other method, no other protocol.
	if code, _, body := httpGet(t, "http://"+p.HTTPAddr+"/idrange.v1.RangeService/GetReplicaInfo"); code != http.StatusNotFound {
		t.Fatalf("Connect-style path: %d %s; want 404", code, body)
	}
}

// readmeHTTPRow is a row of README.md's table of HTTP error answers:
// | `GET /v1/ids?<query>` ... | `<message>` |
var readmeHTTPRow = regexp.MustCompile("(?m)^\\| `GET /v1/ids\\??([^`]*)`[^|]*\\| `([^`]+)` \\|$")

// readmeHTTPAnswers reads the HTTP error answers README.md documents, so
// that the test sends each one and a README edit cannot drift from it.
func readmeHTTPAnswers(t *testing.T) []struct{ query, msg string } {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var rows []struct{ query, msg string }
	for _, m := range readmeHTTPRow.FindAllStringSubmatch(string(b), -1) {
		rows = append(rows, struct{ query, msg string }{m[1], m[2]})
	}
	if len(rows) < 5 {
		t.Fatalf("README.md: %d rows of HTTP error answers found, want the table's 5 or more", len(rows))
	}
	return rows
}

// --http takes host:port (bad: exit 2 naming the flag); empty disables it.
func TestHTTPFlag(t *testing.T) {
	for _, bad := range []string{"nonsense", "127.0.0.1:70000"} {
		code, _, errs := runCmd("serve", "--region", "0", "--http", bad)
		if code != cli.ExitUsage || !strings.Contains(errs, "--http") {
			t.Errorf("--http %q: exit %d, stderr %q; want %d naming --http", bad, code, errs, cli.ExitUsage)
		}
	}
	c, err := parseServeFlags([]string{"--region", "0", "--http", ""}, io.Discard)
	if err != nil || c.HTTP != "" {
		t.Fatalf("--http '': %q, %v; want disabled", c.HTTP, err)
	}
	if a, err := startHTTPAPI(c.HTTP, connLimits{}, nil, nil, nil, nil); a != nil || err != nil {
		t.Fatalf("startHTTPAPI with --http '': %v, %v; want nothing started", a, err)
	}
	c, err = parseServeFlags([]string{"--region", "0"}, io.Discard)
	if err != nil || c.HTTP != defaultHTTP {
		t.Fatalf("default --http %q, %v; want %s", c.HTTP, err, defaultHTTP)
	}
}

// countStub is a RangeService whose MintBatch records the count it was
// asked for and mints nothing: what reached the service through the
// HTTP handler.
type countStub struct {
	idrangev1.UnimplementedRangeServiceServer
	calls atomic.Int64
	count atomic.Int64
}

func (s *countStub) MintBatch(_ context.Context, req *idrangev1.MintBatchRequest) (*idrangev1.MintBatchResponse, error) {
	s.calls.Add(1)
	s.count.Store(req.GetCount())
	return &idrangev1.MintBatchResponse{}, nil
}

// newCountHandler is the --http handler in front of a countStub.
func newCountHandler(t testing.TB) (http.Handler, *countStub) {
	t.Helper()
	gs := grpc.NewServer()
	stub := &countStub{}
	idrangev1.RegisterRangeServiceServer(gs, stub)
	h, err := newHTTPHandler(gs)
	if err != nil {
		t.Fatal(err)
	}
	return h, stub
}

// serveCount sends GET /v1/ids?<rawQuery> to h in process.
func serveCount(h http.Handler, rawQuery string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:7071/v1/ids", nil)
	req.URL.RawQuery = rawQuery
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// Each answer the README documents for a count the HTTP handler rejects
// itself, word for word, and the counts it lets through (in canonical form)
// to the service, whose range check answers the same over gRPC and HTTP
// (TestHTTPMintAcceptance checks those against a real replica).
func TestHTTPCountAnswers(t *testing.T) {
	h, stub := newCountHandler(t)
	want := "want /v1/ids?count=N, N in 1..100000"
	for _, tc := range []struct{ query, msg string }{
		{"", "count: missing; " + want},
		{"n=5", `"n": unknown parameter; ` + want},
		{"count=7&pretty", `"pretty": unknown parameter; ` + want},
		{"count=abc", `count: "abc" is not an integer; ` + want},
		{"count=", `count: "" is not an integer; ` + want},
		{"count=1e9", `count: "1e9" is not an integer; ` + want},
		{"count=1.5", `count: "1.5" is not an integer; ` + want},
		{"count=" + strings.Repeat("x", 50), `count: "` + strings.Repeat("x", 40) + `..." is not an integer; ` + want},
		{"count=1&count=2", "count: given 2 times; " + want},
		{"count=99999999999999999999", "count: 99999999999999999999 not in 1..100000"},
		{"count=" + strings.Repeat("9", 50), "count: " + strings.Repeat("9", 40) + "... not in 1..100000"},
		{strings.Repeat("k", 50) + "=1", `"` + strings.Repeat("k", 40) + `...": unknown parameter; ` + want},
		{"count=%zz", `query string: invalid URL escape "%zz"`},
	} {
		rec := serveCount(h, tc.query)
		body := strings.TrimSuffix(rec.Body.String(), "\n")
		wantBody := fmt.Sprintf(`{"code":3,"message":%s}`, strconv.Quote(tc.msg))
		if rec.Code != http.StatusBadRequest || body != wantBody || !strings.HasPrefix(rec.Header().Get("Content-Type"), "application/json") {
			t.Errorf("?%s: %d %s %s; want 400 application/json %s", tc.query, rec.Code, rec.Header().Get("Content-Type"), body, wantBody)
		}
	}
	if n := stub.calls.Load(); n != 0 {
		t.Fatalf("%d bad counts reached the service", n)
	}
	for _, tc := range []struct {
		query string
		count int64
	}{
		{"count=10", 10}, {"count=%2B5", 5}, {"count=007", 7}, {"count=-1", -1}, {"count=0", 0},
		{"count=100001", 100001}, {"count=-0", 0},
	} {
		before := stub.calls.Load()
		rec := serveCount(h, tc.query)
		if stub.calls.Load() != before+1 || stub.count.Load() != tc.count {
			t.Errorf("?%s: %d %s; the service got calls %d count %d, want one call with count %d",
				tc.query, rec.Code, rec.Body, stub.calls.Load()-before, stub.count.Load(), tc.count)
		}
	}
}

// FuzzHTTPCount: whatever the count parameter holds, the answer is either
// the service's call with exactly the integer strconv reads from it, or a
// 400 with a one-line JSON error naming count that never reaches the
// service.
func FuzzHTTPCount(f *testing.F) {
	for _, s := range []string{"10", "abc", "", "-1", "+5", "007", "1e9", "9223372036854775808", "0x10", " 1", "1 ", "\x00", "-0"} {
		f.Add(s)
	}
	h, stub := newCountHandler(f)
	f.Fuzz(func(t *testing.T, v string) {
		before := stub.calls.Load()
		rec := serveCount(h, url.Values{"count": {v}}.Encode())
		called := stub.calls.Load() != before
		n, err := strconv.ParseInt(v, 10, 64)
		if err == nil {
			if !called || stub.count.Load() != n || rec.Code != http.StatusOK {
				t.Fatalf("count=%q: %d %s; want the service called with %d", v, rec.Code, rec.Body, n)
			}
			return
		}
		var e struct {
			Code    codes.Code `json:"code"`
			Message string     `json:"message"`
		}
		if called || rec.Code != http.StatusBadRequest || json.Unmarshal(rec.Body.Bytes(), &e) != nil ||
			e.Code != codes.InvalidArgument || !strings.HasPrefix(e.Message, "count: ") || strings.Contains(e.Message, "\n") {
			t.Fatalf("count=%q: %d %s (service called: %v); want 400 {\"code\":3,\"message\":\"count: ...\"} on one line", v, rec.Code, rec.Body, called)
		}
	})
}
